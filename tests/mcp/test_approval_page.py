"""A held MCP call approved by a person on the approvals web page, in a real headless Chromium."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from testkit.procs import Gateway

# The browser fixture and the skip without Chromium are the chat approvals page test's.
from tests.e2e.test_approvals_page import browser, pytestmark
from tests.mcp.client import mcp_session, text_of, wait_for_mcp_servers

__all__ = ["browser", "pytestmark"]


def pending_id(gateway: Gateway, approver: str, tool: str) -> str:
    for _ in range(600):  # 30 s at most
        listed = httpx.get(
            f"{gateway.url}/admin/approvals",
            params={"status": "pending"},
            headers=gateway.headers(approver),
            timeout=10,
        ).json()["data"]
        found = [a["id"] for a in listed if a["tool"] == tool]
        if found:
            return str(found[0])
        time.sleep(0.05)
    raise AssertionError(f"no pending approval for {tool}")


def approve_on_the_page(driver: Any, gateway: Gateway, approver: str) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as until
    from selenium.webdriver.support.ui import WebDriverWait

    approval_id = pending_id(gateway, approver, "files__delete_file")
    driver.get(f"{gateway.url}/admin/ui/approvals")
    driver.find_element(By.ID, "key").send_keys(approver)
    driver.find_element(By.ID, "load").click()
    row = f'tr[data-id="{approval_id}"]'
    WebDriverWait(driver, 15).until(until.presence_of_element_located((By.CSS_SELECTOR, row)))
    assert "files__delete_file" in driver.find_element(By.CSS_SELECTOR, row).text
    driver.find_element(By.CSS_SELECTOR, f"{row} button.approve").click()
    WebDriverWait(driver, 15).until(until.text_to_be_present_in_element((By.ID, "status"), "approved"))
    return approval_id


async def test_a_held_mcp_call_approved_on_the_page_returns_its_result(browser: object, gateway: Gateway) -> None:
    wait_for_mcp_servers(gateway)
    _, approver = gateway.create_key(scopes=["approver"])
    async with mcp_session(gateway) as session:
        call = asyncio.ensure_future(session.call_tool("files__delete_file", {"path": "/tmp/page.log"}))
        approval_id = await asyncio.to_thread(approve_on_the_page, browser, gateway, approver)
        result = await asyncio.wait_for(call, 30)
    assert not result.is_error
    assert text_of(result) == f"deleted /tmp/page.log [approval {approval_id} verified]"
