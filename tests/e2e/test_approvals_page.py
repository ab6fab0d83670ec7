"""The approvals web page, driven in a real headless Chromium: a person approves a held call."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway
from tests.e2e.test_tool_policy import POLICY, SECRET, ask

if TYPE_CHECKING:  # the type only: the tests import selenium where they use it
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver (.ci/run installs them)"
)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    driver.set_window_size(1400, 900)  # the screenshot shows the whole table
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def gateway(sim_pair: list[Announced], tmp_path: Path) -> Iterator[Gateway]:
    config = gateway_config(
        deployment("a", sim_pair[0]), tools={"policy_file": policy_file(tmp_path, POLICY), "approval_secret": SECRET}
    )
    with running_gateway(tmp_path, config) as running:
        yield running


def test_approve_button_releases_the_held_call(browser: WebDriver, gateway: Gateway) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as until
    from selenium.webdriver.support.ui import WebDriverWait

    _, approver = gateway.create_key(scopes=["approver"])
    approval_id = ask(gateway, gateway.key, "send_email", choose="send_email").headers["X-Approval-Id"]

    driver = browser
    driver.get(f"{gateway.url}/admin/ui/approvals")
    driver.find_element(By.ID, "key").send_keys(approver)
    driver.find_element(By.ID, "load").click()
    row = f'tr[data-id="{approval_id}"]'
    WebDriverWait(driver, 15).until(until.presence_of_element_located((By.CSS_SELECTOR, row)))
    driver.find_element(By.CSS_SELECTOR, f"{row} button.approve").click()
    WebDriverWait(driver, 15).until(until.text_to_be_present_in_element((By.ID, "status"), "approved"))

    record = httpx.get(
        f"{gateway.url}/admin/approvals/{approval_id}", headers=gateway.headers(approver), timeout=10
    ).json()
    assert record["status"] == "approved"
    assert record["decided_by"] != record["key_id"]
    delivered = ask(gateway, gateway.key, "send_email", headers={"X-Approval-Id": approval_id}).json()
    assert delivered["choices"][0]["message"]["tool_calls"][0]["approval_id"] == approval_id


def test_the_page_refreshes_itself_shows_the_context_and_approves_with_a_reason(
    browser: WebDriver, gateway: Gateway
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as until
    from selenium.webdriver.support.ui import WebDriverWait

    _, approver = gateway.create_key(scopes=["approver"])
    driver = browser
    driver.get(f"{gateway.url}/admin/ui/approvals")
    driver.find_element(By.ID, "key").send_keys(approver)
    driver.find_element(By.ID, "load").click()
    WebDriverWait(driver, 15).until(until.text_to_be_present_in_element((By.ID, "status"), "pending"))

    approval_id = ask(gateway, gateway.key, "send_email", choose="send_email").headers["X-Approval-Id"]
    row = f'tr[data-id="{approval_id}"]'  # appears without another click: the page refreshes itself
    WebDriverWait(driver, 15).until(until.presence_of_element_located((By.CSS_SELECTOR, row)))
    text = driver.find_element(By.CSS_SELECTOR, row).text
    for context in ("please act", "agent", "high", "defer", "send_email"):  # excerpt, policy, risk, mode, tool
        assert context in text, f"{context!r} not shown in {text!r}"
    # When it was asked, and the deadline that matters to the approver, not the record's lifetime.
    assert "requested " in text, text
    assert "deferred: decide before " in text, text
    id_cell = driver.find_element(By.CSS_SELECTOR, f"{row} .approval-id")
    assert id_cell.value_of_css_property("white-space") == "nowrap", "ids are not wrapped mid-word"
    driver.find_element(By.CSS_SELECTOR, f"{row} input.reason").send_keys("checked the recipient")
    artifacts = Path(__file__).resolve().parents[2] / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    driver.save_screenshot(str(artifacts / "approvals-page.png"))
    driver.find_element(By.CSS_SELECTOR, f"{row} button.approve").click()
    WebDriverWait(driver, 15).until(until.text_to_be_present_in_element((By.ID, "status"), "approved"))

    record = httpx.get(
        f"{gateway.url}/admin/approvals/{approval_id}", headers=gateway.headers(approver), timeout=10
    ).json()
    assert record["status"] == "approved"
    assert record["decision_reason"] == "checked the recipient"


def test_a_waiting_calls_row_shows_when_the_agent_stops_waiting_not_the_records_lifetime(
    browser: WebDriver, gateway: Gateway
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _, approver = gateway.create_key(scopes=["approver"])
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(ask, gateway, gateway.key, "refund_payment", choose="refund_payment")  # wait mode, 20 s
        driver = browser
        driver.get(f"{gateway.url}/admin/ui/approvals")
        driver.find_element(By.ID, "key").send_keys(approver)
        driver.find_element(By.ID, "load").click()
        rows = WebDriverWait(driver, 15).until(
            lambda d: [r for r in d.find_elements(By.CSS_SELECTOR, "tr[data-id]") if "refund_payment" in r.text]
        )
        approval_id = rows[0].get_attribute("data-id")
        record = httpx.get(
            f"{gateway.url}/admin/approvals/{approval_id}", headers=gateway.headers(approver), timeout=10
        ).json()
        assert record["wait_deadline"] < record["expires_at"] - 60  # 20 s wait, 600 s record
        shown = driver.execute_script(
            "return new Date(arguments[0] * 1000).toLocaleTimeString()", record["wait_deadline"]
        )
        assert f"agent waits until {shown}" in rows[0].text, rows[0].text
        assert "wait mode" in rows[0].text
        rows[0].find_element(By.CSS_SELECTOR, "button.approve").click()
        assert waiting.result(timeout=30).status_code == 200
