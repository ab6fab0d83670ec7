"""`/admin/approvals` and `/admin/policies`: deciding held tool calls, reloading the policy file;
`/v1/approvals/{id}`: the status of a held call, for the agent that made it."""

# No `from __future__ import annotations`: FastAPI reads the endpoint annotations at runtime.
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.approvals.service import ApprovalService
from gateway.approvals.tool_policy import PolicyHolder
from gateway.auth.stage import Authenticator
from gateway.core.principal import Principal, Scope
from gateway.errors import InvalidRequest, PermissionDenied
from gateway.store.approval_record import STATUSES


class DecisionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=2000)


def build_approvals_router(
    authenticator: Authenticator, approvals: ApprovalService, policies: PolicyHolder
) -> APIRouter:
    router = APIRouter(prefix="/admin")

    async def caller(request: Request) -> Principal:
        return await authenticator.authenticate(request.headers)

    Caller = Annotated[Principal, Depends(caller)]

    @router.get("/approvals")
    async def list_approvals(
        actor: Caller, status: str | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> dict[str, Any]:
        if status is not None and status not in STATUSES:
            raise InvalidRequest(f"status must be one of {', '.join(STATUSES)}", param="status")
        return {"data": await approvals.list(actor, status, limit)}

    @router.get("/approvals/{approval_id}")
    async def show_approval(approval_id: str, actor: Caller) -> dict[str, Any]:
        return await approvals.get(actor, approval_id)

    @router.post("/approvals/{approval_id}/approve")
    async def approve(approval_id: str, actor: Caller, body: DecisionBody | None = None) -> dict[str, Any]:
        return await approvals.decide(actor, approval_id, approve=True, reason=body.reason if body else "")

    @router.post("/approvals/{approval_id}/reject")
    async def reject(approval_id: str, actor: Caller, body: DecisionBody | None = None) -> dict[str, Any]:
        return await approvals.decide(actor, approval_id, approve=False, reason=body.reason if body else "")

    @router.get("/policies")
    async def show_policies(actor: Caller) -> dict[str, Any]:
        actor.require(Scope.ADMIN)
        return {"policies": sorted(policies.engine.file.policies), "last_reload_error": policies.last_error}

    @router.post("/policies/reload")
    async def reload_policies(actor: Caller) -> dict[str, Any]:
        actor.require(Scope.ADMIN)
        if not actor.all_tenants:
            raise PermissionDenied("the policy file applies to every tenant; reloading it needs such a key")
        problems = await policies.reload_recorded(actor.key_id)
        if problems:
            raise InvalidRequest("policy file rejected, the previous policy stays: " + "; ".join(problems))
        return {"reloaded": True, "policies": sorted(policies.engine.file.policies)}

    return router


def build_approval_status_router(authenticator: Authenticator, approvals: ApprovalService) -> APIRouter:
    """`GET /v1/approvals/{id}`: the agent whose call is held polls where it stands (with its own
    chat key; another key's approval does not exist)."""
    router = APIRouter(prefix="/v1")

    async def caller(request: Request) -> Principal:
        principal = await authenticator.authenticate(request.headers)
        principal.require(Scope.CHAT)
        return principal

    @router.get("/approvals/{approval_id}")
    async def approval_status(approval_id: str, actor: Annotated[Principal, Depends(caller)]) -> dict[str, Any]:
        return await approvals.status(actor, approval_id)

    return router
