"""Typed configuration: the one place a config file is read and validated.

Every model is frozen and forbids unknown keys, so a typo is an error that names its key path
(`models[0].deployments[1].api_base: not a URL`) instead of a silently ignored setting.
`${VAR}` and `${VAR:-default}` in string values are replaced from the environment before
validation, so secrets stay out of the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from common.problems import key_path, pydantic_message


class ConfigError(Exception):
    """A config file that cannot be used; `problems` lists every `path: message`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not a URL")
    return value.rstrip("/")


def _redis_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("redis", "rediss", "unix") or not (parts.hostname or parts.path):
        raise ValueError("not a redis:// URL")
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url)]
RedisUrl = Annotated[str, AfterValidator(_redis_url)]
Seconds = Annotated[float, Field(gt=0)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BackendKind(StrEnum):
    OPENAI = "openai"  # any OpenAI-compatible server: vLLM, SGLang, llama.cpp, OpenAI, the sim
    LITELLM = "litellm"  # providers that do not speak the OpenAI protocol


class Operation(StrEnum):
    """What a deployment is asked to do: answer a conversation, or embed text."""

    CHAT = "chat"  # POST {api_base}/chat/completions
    EMBEDDINGS = "embeddings"  # POST {api_base}/embeddings


class Continuation(StrEnum):
    """How a deployment can continue a partial assistant message after a mid-stream failure."""

    NONE = "none"
    VLLM = "vllm"  # continue_final_message=true, add_generation_prompt=false (vLLM, SGLang, sim)
    PREFILL = "prefill"  # trailing assistant message (llama.cpp, Anthropic through litellm)


class Strategy(StrEnum):
    PRIORITY = "priority"
    WEIGHTED = "weighted"
    LEAST_INFLIGHT = "least_inflight"
    LOWEST_LATENCY = "lowest_latency"


class Timeouts(Frozen):
    connect_s: Seconds = 2.0
    first_token_s: Seconds = 30.0
    stall_s: Seconds = 15.0


class LoadHookKind(StrEnum):
    LORA = "lora"  # vLLM: POST {api_base}/load_lora_adapter with the release's checkpoint path
    COMMAND = "command"  # run a command (start a server, scale a pod) and wait for health


class LoadHook(Frozen):
    """How to bring a deployment back when a rollback needs it and it is down."""

    kind: LoadHookKind
    command: list[str] = Field(default_factory=list, description="for kind command")
    lora_name: str = Field(default="", description="for kind lora; default: the deployment's model")
    timeout_s: Seconds = 120.0

    @model_validator(mode="after")
    def _command_given(self) -> LoadHook:
        if self.kind is LoadHookKind.COMMAND and not self.command:
            raise ValueError("a command load hook needs `command`")
        return self


class DeploymentSettings(Frozen):
    name: str = Field(min_length=1)
    kind: BackendKind = BackendKind.OPENAI
    api_base: HttpUrl
    api_key: str = ""
    model: str = Field(min_length=1, description="the model name this deployment expects")
    priority: int = 0
    weight: float = Field(default=1.0, gt=0)
    max_inflight: int = Field(default=256, ge=1)
    timeouts: Timeouts = Timeouts()
    continuation: Continuation = Continuation.NONE
    health_path: str = Field(default="/models", description="relative to api_base, or a full URL")
    load_hook: LoadHook | None = None
    serves: list[Operation] = Field(
        default_factory=lambda: [Operation.CHAT], min_length=1, description="what it is asked to do: chat, embeddings"
    )

    @model_validator(mode="after")
    def _embeddings_over_openai_only(self) -> DeploymentSettings:
        if Operation.EMBEDDINGS in self.serves and self.kind is not BackendKind.OPENAI:
            raise ValueError("serves: embeddings needs kind: openai (an OpenAI-compatible /embeddings)")
        return self

    @field_validator("health_path")
    @classmethod
    def _path_or_http_url(cls, path: str) -> str:
        parts = urlsplit(path)
        if parts.scheme and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise ValueError("must be a path relative to api_base, or an http(s) URL")
        return path

    @field_validator("api_key")
    @classmethod
    def _sendable_key(cls, key: str) -> str:
        # Sent in a header: refused at start, naming the key (never quoting it), not on every request.
        if not all("!" <= character <= "~" for character in key):
            raise ValueError("must be printable ASCII without spaces (it is sent as an HTTP header)")
        return key


class ModelSettings(Frozen):
    name: str = Field(min_length=1)
    # Who may use the model; empty: every tenant (a shared model, managed only by platform admins).
    # A model whose only tenant is T is owned by T: T's admins manage its releases.
    tenants: list[str] = Field(default_factory=list)
    strategy: Strategy | None = None
    deployments: list[DeploymentSettings] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_deployment_names(self) -> ModelSettings:
        names = [d.name for d in self.deployments]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate deployment names: {', '.join(duplicates)}")
        return self


class BreakerSettings(Frozen):
    failure_threshold: int = Field(default=5, ge=1, description="consecutive failures that open it")
    cooldown_s: Seconds = 10.0
    # A deployment's own stall or first-token timeout opens it at once; its other attempts that
    # have had no data for this long are cut then and fail over, instead of each waiting its own.
    cut_idle_after_s: Seconds = Field(default=0.5, description="when a stall opens it: cut attempts idle this long")


class HealthSettings(Frozen):
    interval_s: Seconds = 5.0
    timeout_s: Seconds = 1.0
    unhealthy_after: int = Field(default=2, ge=1, description="consecutive failed probes")


class SlowDetectionSettings(Frozen):
    """Passive detection of deployments that are alive but slow."""

    factor: float = Field(default=1.4, gt=1.0, description="EWMA above factor x peers' median (or own baseline)")
    alpha: float = Field(default=0.2, gt=0, le=1)
    baseline_alpha: float = Field(default=0.02, gt=0, le=1, description="the slow EWMA a deployment is compared with")
    min_samples: int = Field(default=5, ge=1)
    cooldown_s: Seconds = 30.0
    # Ratios of tiny numbers are noise: a deployment is slow only if it is also this much slower.
    min_ttft_gap_s: float = Field(default=0.05, ge=0)
    min_tpot_gap_s: float = Field(default=0.005, ge=0)


class RetrySettings(Frozen):
    max_attempts: int = Field(default=3, ge=1)
    backoff_base_s: Seconds = 0.05
    backoff_max_s: Seconds = 2.0
    retry_after_max_s: Seconds = 10.0


class RoutingSettings(Frozen):
    strategy: Strategy = Strategy.PRIORITY
    # Bounds the wait for an answer's first output over every attempt and backoff (and again for
    # each mid-stream hand-over's first output); 504 deadline_exceeded when it passes.
    deadline_s: Seconds = Field(default=30.0, description="time to the first output, across all attempts")
    max_failovers: int = Field(default=2, ge=0, description="mid-stream hand-overs in one response")
    retry: RetrySettings = RetrySettings()
    breaker: BreakerSettings = BreakerSettings()
    health: HealthSettings = HealthSettings()
    slow: SlowDetectionSettings = SlowDetectionSettings()


class OpenApiExposure(StrEnum):
    ADMIN = "admin"  # GET /openapi.json with a key holding the admin scope
    PUBLIC = "public"  # anyone who can reach the port
    OFF = "off"  # not served


class ServerSettings(Frozen):
    """The HTTP edge: what one request may cost before it is refused."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    openapi: OpenApiExposure = OpenApiExposure.ADMIN
    # Deeper JSON is a 400 before anything is reserved. The ceiling keeps every body the gateway
    # re-encodes (upstream request, audit digest, session transcript) under orjson's 254 levels.
    max_json_depth: int = Field(default=64, ge=4, le=200)
    # Bodies larger than this are decoded and validated in a worker thread, off the event loop.
    parse_in_thread_bytes: int = Field(default=256 * 1024, ge=0)
    header_timeout_s: Seconds = Field(default=10.0, description="a request head must arrive within this")
    body_timeout_s: Seconds = Field(default=30.0, description="a request body must arrive within this")
    # Connections that have not yet sent a whole request head (so cannot have been authenticated):
    # past this many, new connections are closed at once. Authenticated traffic is capped by quotas.
    max_unauthenticated_connections: int = Field(default=1024, ge=1)
    # The request line and headers together; past it: 431 and the connection closed, unparsed.
    max_header_bytes: int = Field(default=32 * 1024, ge=1024, le=1024 * 1024)


class EmbeddedStoreSettings(Frozen):
    kind: Literal["embedded"] = "embedded"
    path: Path = Path("./data")


class StoreReadinessSettings(Frozen):
    """When the failures live traffic sees make a replica not ready, whatever its probe says."""

    window_s: int = Field(default=5, ge=1, le=300, description="seconds of store calls counted")
    min_failures: int = Field(default=5, ge=1, description="fewer failed calls than this never count")
    failure_ratio: float = Field(default=0.05, gt=0, le=1, description="share of failed calls that does")
    recovered_after_s: float = Field(
        default=1.0, ge=0, le=300, description="seconds without a failed call: the store is back"
    )


class RedisStoreSettings(Frozen):
    kind: Literal["redis"] = "redis"
    url: RedisUrl = "redis://127.0.0.1:6379/0"
    key_prefix: str = "agw"
    socket_timeout_s: Seconds = 0.25
    connect_timeout_s: Seconds = 0.25
    # Only a burst waits here (a down or frozen Redis fails through the timeouts above): long
    # enough that a burst on a loaded machine queues instead of turning into 503s.
    pool_wait_s: Seconds = Field(default=5.0, description="how long a call waits for a pooled connection")
    cluster: bool = Field(default=False, description="url names one node of a Redis Cluster (the rest are discovered)")
    readiness: StoreReadinessSettings = Field(default_factory=StoreReadinessSettings)


class FailMode(StrEnum):
    OPEN = "fail_open"  # let requests through unmetered (counted and audited)
    CLOSED = "fail_closed"  # refuse with 503


# Quota counters are Lua numbers (doubles) in Redis: a limit above 2**53 could not be counted exactly.
MAX_LIMIT = 2**53 - 1


class LimitSettings(Frozen):
    rpm: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    tpm: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    daily_tokens: int | None = Field(default=None, ge=1, le=MAX_LIMIT)


class AuthSettings(Frozen):
    # The bootstrap admin key; GATEWAY_ADMIN_KEY in the environment is used when this is empty.
    admin_key: str = ""
    cache_ttl_s: Seconds = Field(default=1.0, description="revocation reaches every replica within this")
    stale_ttl_s: Seconds = Field(default=300.0, description="cached keys still accepted while the store is down")


class QuotaSettings(Frozen):
    on_store_error: FailMode = FailMode.OPEN
    # A key retrying before the Retry-After of its last 429 is refused at once (gateway/quota/admission.py).
    refuse_early_retries: bool = True
    default_max_tokens: int = Field(default=1024, ge=1, description="reserved when a request sets no max_tokens")
    lease_ttl_s: Seconds = Field(default=60.0, description="a concurrency slot of a dead replica frees after this")
    tenants: dict[str, LimitSettings] = Field(default_factory=dict)


class AuditSettings(Frozen):
    capture: bool = Field(default=False, description="store prompts and completions (secrets redacted)")
    # Keys the chain: each record's hash becomes an HMAC, so nobody with write access to the store
    # but not this key can re-hash an edited chain. Keep it out of the store and the file:
    # `hmac_key: ${GATEWAY_AUDIT_KEY}`. Empty: plain SHA-256 (tamper-evident, not tamper-proof).
    hmac_key: str = Field(default="", pattern=r"^(|.{32,})$", description="empty or at least 32 characters")
    queue_size: int = Field(default=10_000, ge=1)
    batch_size: int = Field(default=200, ge=1)
    flush_interval_s: Seconds = 0.05
    # Requests refused for want of a valid key are not recorded one by one (anyone can send them):
    # one record per interval counts them per source address and reason.
    refusal_interval_s: Seconds = 60.0
    refusal_max_sources: int = Field(default=1000, ge=1, description="more sources in an interval count as 'other'")
    reserve_wait_s: Seconds = Field(default=5.0, description="a request waits this long for a full queue, then 503")
    stuck_after_s: Seconds = Field(default=10.0, description="not ready when records cannot be written this long")
    shutdown_wait_s: Seconds = Field(default=10.0, description="at shutdown, wait this long for the store")


class DisconnectPolicy(StrEnum):
    CONTINUE = "continue"  # generation goes on and stays resumable
    CANCEL = "cancel"  # generation stops with the last reader


class SessionStoreFailMode(StrEnum):
    SERVE_UNRESUMABLE = "serve_unresumable"  # answer without a checkpoint, X-Session-Resumable: false
    CLOSED = "fail_closed"  # refuse with 503


class SessionSettings(Frozen):
    """Checkpoints of streamed responses, for resume and replica failover."""

    enabled: bool = True
    checkpoint_every_events: int = Field(default=16, ge=1)
    checkpoint_interval_s: Seconds = 0.1
    resume_ttl_s: Seconds = Field(default=600.0, description="how long a session stays resumable")
    kept_answer_ttl_s: Seconds = Field(
        default=30 * 86400.0,
        description="how long a kept answer (a Responses response with store: true) can be retrieved and continued",
    )
    lease_ttl_s: Seconds = Field(default=5.0, description="a dead replica's streams are taken over after this")
    on_client_disconnect: DisconnectPolicy = DisconnectPolicy.CONTINUE
    # A request naming a session while the store is down: agents always name one, so the default
    # answers it (without a checkpoint: it cannot be resumed, and the response says so) rather than
    # failing all agent traffic for the outage; X-Session-Append needs the stored history: 503.
    on_store_error: SessionStoreFailMode = SessionStoreFailMode.SERVE_UNRESUMABLE
    # Transcripts (prompts and answers) are kept only for requests that name a session
    # (X-Session-Id or X-Session-Append), or for the tenants and key ids listed here; any other
    # request keeps nothing once its stream is over but the streamed events (for resume).
    transcript_tenants: list[str] = Field(default_factory=list, description="tenants whose transcripts are kept")
    transcript_keys: list[str] = Field(default_factory=list, description="key ids whose transcripts are kept")


class ToolPolicySettings(Frozen):
    """Tool calls are denied unless the policy file bound to the key or its tenant allows them."""

    policy_file: Path | None = Field(default=None, description="none: no key may use any tool")
    reload_interval_s: Seconds = Field(default=2.0, description="how often the file is checked for changes")
    # Signs approval tokens; tool servers verify them with the same secret. Empty: a random
    # secret per process (tokens then verify only against this process).
    approval_secret: str = Field(default="", pattern=r"^(|.{16,})$", description="empty or at least 16 characters")
    wait_poll_s: Seconds = 0.2
    # Calls held for a person (pending: undecided, not lapsed; wait and defer alike) per key and per
    # tenant. One more is refused at once (429 too_many_pending_approvals; an MCP call gets an error
    # result) and audited, so one key cannot park enough held calls to crowd out the others.
    # At most 1000: no person reviews more, and the store counts them in one step.
    max_pending_approvals_per_key: int = Field(default=10, ge=1, le=1000)
    max_pending_approvals_per_tenant: int = Field(default=100, ge=1, le=1000)
    wait_keepalive_s: Seconds = Field(
        default=15.0, description="a non-streamed answer held for approval sends a space this often (proxy timeouts)"
    )


class TelemetrySettings(Frozen):
    """Traces and metrics. `GET /metrics` serves Prometheus text whatever is set here; OTLP export
    (traces and metrics) is on only when `otlp_endpoint` is set."""

    service_name: str = Field(default="agent-gateway", min_length=1)
    # The OTLP/HTTP base URL of a collector (http://collector:4318); /v1/traces and /v1/metrics
    # are appended, as for OTEL_EXPORTER_OTLP_ENDPOINT.
    otlp_endpoint: HttpUrl | None = None
    otlp_timeout_s: Seconds = 5.0


class ReleaseSettings(Frozen):
    checkpoint_registry: Path | None = Field(default=None, description="root of `gateway checkpoints` registry")
    # Directories whose files (eval sets, smoke samples) a release made through the admin API may
    # name; empty: the API names no files (the CLI, run by the operator, is not restricted).
    file_roots: list[Path] = Field(default_factory=list)
    watch_interval_s: Seconds = Field(default=0.25, description="how fast a switch reaches every replica")
    verify_interval_s: Seconds = Field(
        default=300.0, description="how often the active releases' checkpoints are verified again (/readyz)"
    )


class McpServerSettings(Frozen):
    """One upstream MCP server: a Streamable HTTP `url`, or a stdio `command` the gateway starts."""

    # Tools are shown to agents as `<name>__<tool>`, so the name may not contain the separator.
    name: str = Field(pattern=r"^[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*$", max_length=32)
    url: HttpUrl | None = None
    command: list[str] | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict, description="added to a stdio command's environment")
    headers: dict[str, str] = Field(default_factory=dict, description="sent to a url server (e.g. its own key)")
    call_timeout_s: Seconds = Field(default=30.0, description="a tools/call that takes longer fails")
    connect_timeout_s: Seconds = 10.0
    restart_backoff_s: Seconds = Field(default=0.5, description="first wait before a crashed server is restarted")

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSettings:
        if (self.url is None) == (self.command is None):
            raise ValueError("give exactly one of url and command")
        return self


class McpSettings(Frozen):
    """The gateway's MCP endpoint: tools of the upstream servers, under the tool policy."""

    path: str = Field(default="/mcp", pattern=r"^/[A-Za-z0-9/_-]*$")
    servers: list[McpServerSettings] = Field(default_factory=list)
    max_result_bytes: int = Field(default=1_000_000, ge=1024, description="a larger tool result is refused")
    progress_interval_s: Seconds = Field(default=5.0, description="progress notifications while a call is held")

    @model_validator(mode="after")
    def _unique_server_names(self) -> McpSettings:
        names = [s.name for s in self.servers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate MCP server names: {', '.join(duplicates)}")
        return self


class Settings(Frozen):
    server: ServerSettings = ServerSettings()
    mcp: McpSettings = McpSettings()
    releases: ReleaseSettings = ReleaseSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    tools: ToolPolicySettings = ToolPolicySettings()
    sessions: SessionSettings = SessionSettings()
    auth: AuthSettings = AuthSettings()
    quota: QuotaSettings = QuotaSettings()
    audit: AuditSettings = AuditSettings()
    store: EmbeddedStoreSettings | RedisStoreSettings = Field(
        default_factory=EmbeddedStoreSettings, discriminator="kind"
    )
    routing: RoutingSettings = RoutingSettings()
    models: list[ModelSettings] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_model_names(self) -> Settings:
        names = [m.name for m in self.models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate model names: {', '.join(duplicates)}")
        return self


_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(node: Any, path: str, env: Mapping[str, str], problems: list[str]) -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, _join(path, str(k)), env, problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, f"{path}[{i}]", env, problems) for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        problems.append(f"{path or '<root>'}: environment variable {name} is not set")
        return ""

    return _ENV_REFERENCE.sub(substitute, node)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# pydantic's names for the store's union branches and the URL validator, in an error's location.
_PYDANTIC_NAMES = frozenset({"embedded", "redis", "function-after[_http_url(), str]"})


def parse_settings(raw: Any, env: Mapping[str, str] | None = None) -> Settings:
    """Validate a decoded YAML document; raise ConfigError listing every problem."""
    if not isinstance(raw, dict):
        raise ConfigError(["<root>: the config must be a mapping"])
    problems: list[str] = []
    interpolated = _interpolate(raw, "", os.environ if env is None else env, problems)
    try:
        settings = Settings.model_validate(interpolated)
    except ValidationError as exc:
        # A key whose environment variable is missing is reported once, not again as a bad value.
        unset = {p.split(": ", 1)[0] for p in problems}
        for error in exc.errors():
            path = key_path(error["loc"], skip=_PYDANTIC_NAMES.__contains__) or "<root>"
            if path not in unset:
                problems.append(f"{path}: {pydantic_message(error)}")
        raise ConfigError(problems) from None
    if problems:
        raise ConfigError(problems)
    return settings


def load_settings(path: Path, env: Mapping[str, str] | None = None) -> Settings:
    """Problems with the file as a whole have no key path (callers name the file once)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([str(exc.strerror or exc)]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(exc)]) from None
    return parse_settings(raw, env)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None)
    return f"not valid YAML{where}: {problem or exc}"
