"""`/admin/models/{model}/...`: release records, promotion, one-call rollback."""

# No `from __future__ import annotations`: FastAPI reads the endpoint annotations at runtime.
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.auth.stage import Authenticator
from gateway.auth.tenancy import ModelTenancy
from gateway.core.principal import Principal, Scope
from gateway.errors import InvalidRequest
from gateway.releases.service import ReleaseService, ReleaseSpec
from gateway.store.release_record import CanarySettings


class CreateReleaseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")
    deployments: list[str] = Field(default_factory=list)
    checkpoint: str | None = None
    system_prompt: str = Field(default="", max_length=100_000)
    prompt_version: str = ""
    eval_set: str | None = None
    min_pass_rate: float | None = Field(default=None, ge=0, le=1, description="default: the eval set's threshold")
    smoke_samples: str | None = None
    smoke_count: int = Field(default=10, ge=1, le=1000)
    smoke_slo_ttft_ms: float | None = Field(default=None, gt=0)
    smoke_slo_tpot_ms: float | None = Field(default=None, gt=0)
    smoke_min_goodput: float = Field(default=1.0, ge=0, le=1)
    notes: str = Field(default="", max_length=10_000)


class SwitchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str | None = None
    reason: str = Field(default="", max_length=2000)
    expected_active: str | None = Field(
        default=None, description="rollback: only if this release is still the active one (no double rollback)"
    )


class CanaryBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str = Field(min_length=1)
    share: float = Field(default=0.1, gt=0, lt=1, description="of new requests sent to the candidate")
    window_s: float = Field(default=300, gt=0)
    max_error_rate: float = Field(default=0.05, ge=0, le=1)
    max_latency_ratio: float = Field(default=1.5, gt=1, description="candidate TTFT/TPOT median vs active")
    min_requests: int = Field(default=20, ge=1, description="per side, before judging")
    steps: list[float] | None = Field(
        default=None,
        min_length=2,
        max_length=20,
        description="shares to go through, e.g. [0.05, 0.25, 1]: up a step after each clean window; 1 promotes",
    )

    @model_validator(mode="after")
    def _steps_rise(self) -> "CanaryBody":
        if self.steps is not None:
            if any(not 0 < share <= 1 for share in self.steps) or sorted(set(self.steps)) != self.steps:
                raise ValueError("steps must be rising shares in (0, 1]")
            self.share = self.steps[0]
        return self

    def settings(self) -> CanarySettings:
        return CanarySettings(
            share=self.share,
            window_s=self.window_s,
            max_error_rate=self.max_error_rate,
            max_latency_ratio=self.max_latency_ratio,
            min_requests=self.min_requests,
            steps=None if self.steps is None else tuple(self.steps),
        )


def _confine(path: str | None, roots: Sequence[Path], param: str) -> None:
    """A path named over HTTP must resolve (symlinks, `..`) under a configured root. The refusal
    reads the same whether the file exists or not, so the API is no existence oracle."""
    if path is None:
        return
    if not roots:
        raise InvalidRequest(
            f"{param}: the admin API names files only under releases.file_roots (none set)", param=param
        )
    resolved = Path(path).resolve()
    if not any(resolved.is_relative_to(root.resolve()) for root in roots):
        raise InvalidRequest(f"{param} must name a file under releases.file_roots", param=param)


def build_releases_router(
    authenticator: Authenticator, releases: ReleaseService, tenancy: ModelTenancy, file_roots: Sequence[Path]
) -> APIRouter:
    router = APIRouter(prefix="/admin")

    async def admin(request: Request) -> Principal:
        principal = await authenticator.authenticate(request.headers)
        principal.require(Scope.ADMIN)
        return principal

    async def reader(model: str, principal: Annotated[Principal, Depends(admin)]) -> Principal:
        tenancy.require_use(principal, model)
        return principal

    async def manager(model: str, principal: Annotated[Principal, Depends(admin)]) -> Principal:
        """A switch changes what every tenant of the model receives (see gateway/auth/tenancy.py)."""
        tenancy.require_manage(principal, model)
        return principal

    Reader = Annotated[Principal, Depends(reader)]
    Caller = Annotated[Principal, Depends(manager)]

    @router.post("/models/{model}/releases", status_code=201)
    async def create(model: str, body: CreateReleaseBody, actor: Caller) -> dict[str, Any]:
        for param in ("eval_set", "smoke_samples"):
            _confine(getattr(body, param), file_roots, param)
        created = await releases.create(actor, model, ReleaseSpec(**body.model_dump()))
        return created.to_dict()

    @router.get("/models/{model}/releases")
    async def overview(model: str, actor: Reader) -> dict[str, Any]:
        return await releases.overview(model)

    @router.post("/models/{model}/promote")
    async def promote(model: str, body: SwitchBody, actor: Caller) -> dict[str, Any]:
        if not body.version:
            raise InvalidRequest("name the release to promote", param="version")
        return await releases.promote(actor, model, body.version, body.reason)

    @router.post("/models/{model}/rollback")
    async def rollback(model: str, actor: Caller, body: SwitchBody | None = None) -> dict[str, Any]:
        """One call: back one step through the activation history, or to `version`."""
        body = body or SwitchBody()
        return await releases.rollback(actor, model, body.version, body.reason, body.expected_active)

    @router.post("/models/{model}/canary")
    async def start_canary(model: str, body: CanaryBody, actor: Caller) -> dict[str, Any]:
        """Preflight, then a share of traffic to the candidate; rolled back automatically on a breach."""
        return await releases.canaries.start(actor, model, body.version, body.settings())

    @router.get("/models/{model}/canary")
    async def canary_status(model: str, actor: Reader) -> dict[str, Any]:
        """The running canary and this replica's live figures over its window."""
        return await releases.canaries.status(model)

    @router.delete("/models/{model}/canary")
    async def end_canary(model: str, actor: Caller) -> dict[str, Any]:
        return await releases.canaries.end(actor.key_id, model, "ended by an operator")

    return router
