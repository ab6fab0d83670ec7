"""Routing: pick a deployment, call it, and fail over while the client has seen nothing.

An attempt is "committed" at its first chunk that carries output (content, reasoning, a tool call
or a finish). Until then its chunks are held back, so a failure can be retried on another
deployment without the client noticing; after it, the failure belongs to the stream and is
raised to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from gateway.backends.base import BackendRequest
from gateway.core.chunks import Chunk, Usage
from gateway.core.route_log import Attempt, RouteLog
from gateway.deadlines import deadline_at
from gateway.errors import (
    DeadlineExceeded,
    InvalidRequest,
    NoDeploymentAvailable,
    RateLimited,
    StreamInterrupted,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.routing.deployment import LAST_RESORT, Availability, Deployment
from gateway.routing.failover import Interrupted, StreamProgress
from gateway.routing.stats import find_slow
from gateway.routing.strategies import Order
from gateway.routing.trace import RouteTrace, UntracedRoute
from gateway.settings import Operation, RoutingSettings


class ModelGroup:
    """The deployments serving one logical model, and how to order them."""

    def __init__(self, name: str, deployments: Sequence[Deployment], order: Order, settings: RoutingSettings):
        self.name = name
        self.deployments = list(deployments)
        self._order = order
        self._settings = settings

    def plan(self, rng: random.Random) -> list[Deployment]:
        """Deployments to try, best first; empty if every one is open or full."""
        by_kind: dict[Availability, list[Deployment]] = {}
        for deployment in self.deployments:
            by_kind.setdefault(deployment.availability(), []).append(deployment)
        plan = self._order(by_kind.get(Availability.READY, []), rng)
        plan += self._order(by_kind.get(Availability.DEGRADED, []), rng)
        for kind in LAST_RESORT:
            plan += self._order(by_kind.get(kind, []), rng)
        return plan

    def all_full(self) -> bool:
        return all(d.availability() is Availability.FULL for d in self.deployments)

    def record_latency(self, deployment: Deployment, ttft_s: float, tpot_s: float | None) -> None:
        deployment.stats.record(ttft_s, tpot_s)
        for index in find_slow([d.stats for d in self.deployments], self._settings.slow):
            self.deployments[index].stats.degrade(self._settings.slow.cooldown_s)

    @property
    def ready(self) -> bool:
        return any(d.serving for d in self.deployments)


class Router:
    def __init__(
        self,
        groups: dict[str, ModelGroup],
        settings: RoutingSettings,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.groups = groups
        self._settings = settings
        self._rng = rng or random.Random()
        self._clock = clock

    async def stream(
        self,
        model: str,
        body: dict[str, Any],
        log: RouteLog,
        resume: tuple[str, int] | None = None,
        trace: RouteTrace | None = None,
        allowed: frozenset[str] | None = None,
        operation: Operation = Operation.CHAT,
    ) -> AsyncGenerator[Chunk, None]:
        """The answer for `body` from the best deployments of `model`, as one uninterrupted stream.

        Failures before the first output are retried (`_serve`); a failure after it is handed to
        the next deployment that can continue the partial answer, up to `max_failovers` times.
        `resume` is the (text, chunks) a client already has when a session is taken over; `trace`
        hears about attempts, retries and failovers.
        """
        group = self.groups[model]
        if not any(operation in d.settings.serves for d in group.deployments):
            raise InvalidRequest(
                f"The model '{model}' serves no {operation.value}: none of its deployments lists it in 'serves'",
                param="model",
            )
        trace = trace or UntracedRoute()
        progress = StreamProgress(body, resume, allowed, operation)
        avoid: set[str] = set()
        while True:
            try:
                async with contextlib.aclosing(self._serve(group, progress, log, avoid, trace)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
            except Interrupted as interrupted:
                # What the failed attempt generated counts, even though its usage never arrived.
                yield Chunk(
                    usage=Usage(completion_tokens=interrupted.output_chunks, total_tokens=interrupted.output_chunks)
                )
                if progress.budget_spent:
                    yield Chunk(finish_reason="length")
                    return
                if log.failovers >= self._settings.max_failovers or not progress.continuable:
                    raise StreamInterrupted(progress.content_chunks, interrupted.cause) from None
                log.failovers += 1
                trace.failover(
                    interrupted.deployment, interrupted.cause.reason, interrupted.output_chunks, log.failovers
                )
                avoid = {interrupted.deployment}

    async def _serve(
        self, group: ModelGroup, progress: StreamProgress, log: RouteLog, avoid: set[str], trace: RouteTrace
    ) -> AsyncGenerator[Chunk, None]:
        """One deployment's answer (or the rest of it), retrying other deployments until its first output."""
        retry = self._settings.retry
        last_error: UpstreamError | None = None
        tried = set(avoid)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.deadline_s
        for attempt_number in range(retry.max_attempts):
            deployment = self._choose(group, tried, last_error, progress)
            if last_error is not None:
                trace.retry(deployment.name, last_error.reason, len(log.attempts) + 1)
            pause = self._backoff(attempt_number) if deployment.name in tried else 0.0
            if loop.time() + pause >= deadline:
                deployment.breaker.release()  # a half-open trial taken by _choose must not leak
                raise self._deadline_passed(group, last_error)
            if pause:
                try:
                    await asyncio.sleep(pause)
                except BaseException:
                    deployment.breaker.release()
                    raise
            tried.add(deployment.name)
            # While another attempt may follow, one attempt gets at most half of what is left: a
            # deployment that never answers cannot use up the time another one could answer in.
            last = attempt_number == retry.max_attempts - 1
            first_output_by = deadline if last else loop.time() + (deadline - loop.time()) / 2
            attempt = Attempt(deployment.name)
            log.attempts.append(attempt)
            progress.begin_attempt()
            body = progress.request_for(deployment.settings)
            try:
                with trace.attempt(group.name, deployment, attempt, len(log.attempts), body) as traced:
                    request = BackendRequest(
                        {**body, "model": deployment.settings.model}, traced.headers, progress.operation.value
                    )
                    upstream = self._attempt(group, deployment, request, attempt, progress, first_output_by)
                    async with contextlib.aclosing(upstream) as chunks:
                        async for chunk in chunks:
                            yield chunk
                return
            except UpstreamError as error:
                if attempt.ttft_s is not None:
                    raise Interrupted(error, deployment.name, attempt.output_chunks) from None
                if not error.retryable:
                    raise  # another deployment of the same model would refuse the same request
                last_error = error
                if isinstance(error, UpstreamStatusError) and error.retry_after_s is not None:
                    deployment.cool_down(min(error.retry_after_s, retry.retry_after_max_s))
        assert last_error is not None  # max_attempts >= 1 and every path above returns or records one
        if loop.time() >= deadline:
            raise self._deadline_passed(group, last_error)
        raise _final_error(last_error)

    def _deadline_passed(self, group: ModelGroup, last_error: UpstreamError | None) -> DeadlineExceeded:
        cause = f" (last attempt: {last_error.reason})" if last_error is not None else ""
        return DeadlineExceeded(
            f"no deployment of {group.name!r} answered within the {self._settings.deadline_s:g}s deadline{cause}"
        )

    def _choose(
        self, group: ModelGroup, tried: set[str], last_error: UpstreamError | None, progress: StreamProgress
    ) -> Deployment:
        plan = [d for d in group.plan(self._rng) if progress.can_serve(d.settings)]
        fresh = [d for d in plan if d.name not in tried]
        for deployment in fresh or plan:
            if deployment.breaker.acquire():
                return deployment
        if group.all_full():
            raise RateLimited(f"every deployment of {group.name!r} is at its max_inflight", retry_after_s=1)
        if last_error is not None:
            raise _final_error(last_error)
        if progress.started:
            raise NoDeploymentAvailable(f"no deployment of {group.name!r} can continue the interrupted answer")
        raise NoDeploymentAvailable(
            f"no deployment of {group.name!r} can take traffic (circuit breakers open)",
            retry_after_s=self._settings.breaker.cooldown_s,
        )

    async def _attempt(
        self,
        group: ModelGroup,
        deployment: Deployment,
        request: BackendRequest,
        attempt: Attempt,
        progress: StreamProgress,
        first_output_by: float,
    ) -> AsyncGenerator[Chunk, None]:
        started = self._clock()
        deployment.inflight += 1
        try:
            async with contextlib.aclosing(deployment.backend.stream(request)) as upstream:
                held, committed = await _until_first_output(upstream, attempt, first_output_by, deployment.name)
                if committed:
                    attempt.ttft_s = self._clock() - started
                    for passed in map(progress.admit, held):
                        if passed is not None:
                            yield passed
                    held.clear()
                async for chunk in upstream:
                    if progress.overran:
                        break  # the answer was ended at its limit: closing the stream stops the upstream
                    _note(attempt, chunk)
                    passed = progress.admit(chunk)
                    if passed is not None:
                        yield passed
                    if progress.overran:
                        break
            for passed in _drain(held, progress):
                yield passed
        except UpstreamError as error:
            progress.discard_pending()
            attempt.error = error.reason
            if isinstance(error, UpstreamTimeout) and error.deployment_limit:
                deployment.stalled()
            else:
                deployment.breaker.record_failure()
            raise
        except BaseException:
            deployment.breaker.release()  # the client went away: no verdict on the deployment
            raise
        finally:
            deployment.inflight -= 1
        deployment.breaker.record_success()
        if attempt.ttft_s is not None:
            attempt.tpot_s = _tpot(started, attempt.ttft_s, self._clock(), attempt.usage)
            group.record_latency(deployment, attempt.ttft_s, attempt.tpot_s)

    def _backoff(self, attempt_number: int) -> float:
        retry = self._settings.retry
        ceiling = min(retry.backoff_max_s, retry.backoff_base_s * 2.0 ** max(0, attempt_number - 1))
        return ceiling * self._rng.uniform(0.5, 1.0)


async def _until_first_output(
    upstream: AsyncGenerator[Chunk, None], attempt: Attempt, by: float, deployment: str
) -> tuple[list[Chunk], bool]:
    """The chunks up to and including the first that carries output (and True), or all of them
    if none does (and False). Nothing goes out meanwhile, so that a retry stays invisible; the
    wait ends at `by` (loop time) as a first-token timeout. No yield happens inside the timeout,
    so it never spans a hand-over of the stream to another task."""
    held: list[Chunk] = []
    try:
        with deadline_at(by):
            async for chunk in upstream:
                _note(attempt, chunk)
                held.append(chunk)
                if chunk.carries_output:
                    return held, True
    except TimeoutError:
        raise UpstreamTimeout(
            "no first output within this attempt's share of the deadline", deployment=deployment, phase="first_token"
        ) from None
    return held, False


def _note(attempt: Attempt, chunk: Chunk) -> None:
    if chunk.usage is not None:
        attempt.usage = chunk.usage
    if chunk.finish_reason is not None:
        attempt.finish_reason = chunk.finish_reason
    if chunk.tokens is not None:
        attempt.output_chunks = chunk.tokens  # the upstream's own running count (vLLM's continuous usage)
    elif chunk.content:
        attempt.output_chunks += 1


def _drain(held: list[Chunk], progress: StreamProgress) -> list[Chunk]:
    """What is still held when the upstream finished: an answer without any output (usage only),
    then tool calls that never got a finish_reason."""
    passed = [chunk for chunk in map(progress.admit, held) if chunk is not None]
    tail = progress.flush()
    return passed if tail is None else [*passed, tail]


def _tpot(started: float, ttft_s: float, ended: float, usage: Usage | None) -> float | None:
    if usage is None or usage.completion_tokens < 2:
        return None
    return (ended - started - ttft_s) / (usage.completion_tokens - 1)


def _final_error(error: UpstreamError) -> Exception:
    """What the client sees when every attempt failed before output."""
    if isinstance(error, UpstreamStatusError) and error.upstream_status == 429:
        return RateLimited(
            f"every deployment is rate limited: {error.public_message}", retry_after_s=error.retry_after_s or 1
        )
    return error
