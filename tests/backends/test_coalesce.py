"""The plain content chunks that arrived in one read are joined into one, its running count kept in
upstream chunks; for a streamed answer the joined chunk keeps each upstream chunk's content, and the
client gets exactly the events it would have got chunk by chunk. Everything else goes as it came."""

from __future__ import annotations

from gateway.backends.base import BackendRequest
from gateway.backends.coalesce import Coalescer
from gateway.backends.openai_compat import OpenAICompatBackend
from gateway.core.chunks import Chunk, ToolCallDelta, Usage
from gateway.settings import Continuation
from gateway.surfaces.chat_completions import ChunkRenderer
from gateway.wire import dumps
from tests.backends.upstream import DEPLOYMENT, FakeUpstream, answer, chunk, http_chunked, sse


def test_plain_content_of_one_read_becomes_one_chunk_counted_in_upstream_chunks() -> None:
    read = [Chunk(role="assistant", content=""), Chunk(content="a"), Chunk(content="b"), Chunk(content="c")]
    joined = Coalescer(upstream_counts=False).join(read)
    assert [(c.role, c.content, c.tokens) for c in joined] == [("assistant", "", None), (None, "abc", 3)]
    assert [c.pieces for c in joined] == [(), ("a", "b", "c")]


def test_the_count_runs_on_across_reads_and_a_lone_chunk_is_kept_as_it_is() -> None:
    coalescer = Coalescer(upstream_counts=False)
    assert [(c.content, c.tokens) for c in coalescer.join([Chunk(content="a"), Chunk(content="b")])] == [("ab", 2)]
    lone = Chunk(content="c")
    assert coalescer.join([lone]) == [lone]
    assert lone.tokens == 3


def test_anything_but_plain_content_splits_the_run_and_is_never_merged() -> None:
    finish = Chunk(finish_reason="stop")
    tool = Chunk(tool_calls=[ToolCallDelta(index=0, id="call_1", name="f", arguments="{}")])
    extra = Chunk(content="x", choice_extra={"logprobs": {"content": []}})
    usage = Chunk(usage=Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7))
    read = [Chunk(content="a"), Chunk(content="b"), tool, Chunk(content="c"), extra, Chunk(content="d"), finish, usage]
    joined = Coalescer(upstream_counts=False).join(read)
    assert [c.content for c in joined] == ["ab", None, "c", "x", "d", None, None]
    assert [joined[1], joined[3], joined[5], joined[6]] == [tool, extra, finish, usage]
    assert [c.tokens for c in joined if c.content] == [2, 3, 4, 5]  # the same count, chunk by chunk


def test_an_upstream_running_count_is_kept_and_chunks_without_one_are_left_alone() -> None:
    read = [
        Chunk(content="a", tokens=2),
        Chunk(content="bc", tokens=5),
        Chunk(content="d"),
        Chunk(content="e", tokens=7),
    ]
    joined = Coalescer(upstream_counts=True).join(read)
    assert [(c.content, c.tokens) for c in joined] == [("abc", 5), ("d", None), ("e", 7)]


async def test_one_read_is_few_chunks_and_a_streamed_request_keeps_the_pieces() -> None:
    role = {"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    finish = {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    body = sse(role, chunk("a"), chunk("b"), chunk("c"), finish)
    async with FakeUpstream(answer(http_chunked(body))) as upstream:
        backend = OpenAICompatBackend(DEPLOYMENT.model_copy(update={"api_base": upstream.url}))
        one = [c async for c in backend.stream(BackendRequest({"model": "m", "messages": []}))]
        streamed = [c async for c in backend.stream(BackendRequest({"model": "m", "messages": [], "stream": True}))]
        await backend.aclose()
    assert [(c.content, c.tokens, c.finish_reason) for c in one] == [
        ("", None, None),
        ("abc", 3, None),
        (None, None, "stop"),
    ]
    assert one[1].pieces == ("a", "b", "c")
    assert [(c.content, c.pieces, c.tokens) for c in streamed] == [
        ("", (), None),
        ("abc", ("a", "b", "c"), 3),
        (None, (), None),
    ]
    assert upstream.bodies[0]["stream"] is True  # the upstream streams either way


async def test_vllm_running_usage_is_the_joined_chunks_count() -> None:
    def counted(content: str, tokens: int) -> dict[str, object]:
        return {
            **chunk(content),
            "usage": {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1},
        }

    body = sse(counted("ab", 2), counted("c", 3), counted("de", 5))
    deployment = DEPLOYMENT.model_copy(update={"continuation": Continuation.VLLM})
    async with FakeUpstream(answer(http_chunked(body))) as upstream:
        backend = OpenAICompatBackend(deployment.model_copy(update={"api_base": upstream.url}))
        chunks = [c async for c in backend.stream(BackendRequest({"model": "m", "messages": []}))]
        await backend.aclose()
    assert [(c.content, c.tokens) for c in chunks] == [("abcde", 5)]


def test_a_joined_chunk_renders_as_the_events_of_the_chunks_it_joined() -> None:
    renderer = ChunkRenderer("chatcmpl-1", 7, "model-a")
    one_by_one = [Chunk(content="Hel"), Chunk(content="lo"), Chunk(content=" there")]
    expected = [renderer.render(c) for c in one_by_one]
    (joined,) = Coalescer(upstream_counts=False).join(
        [Chunk(content="Hel"), Chunk(content="lo"), Chunk(content=" there")]
    )
    assert [dumps(d) for d in renderer.render_all(joined)] == [dumps(d) for d in expected if d is not None]


def test_a_joined_chunk_whose_content_a_stage_rewrote_renders_as_one_event() -> None:
    renderer = ChunkRenderer("chatcmpl-1", 7, "model-a")
    (joined,) = Coalescer(upstream_counts=False).join([Chunk(content="a"), Chunk(content="b")])
    joined.content = "ab\n(note)"
    (event,) = renderer.render_all(joined)
    assert event["choices"][0]["delta"] == {"content": "ab\n(note)"}


def test_plain_text_never_made_a_chunk_joins_like_a_plain_chunk() -> None:
    coalescer = Coalescer(upstream_counts=False)
    joined = coalescer.join(
        [Chunk(role="assistant", content=""), "a", Chunk(content="b"), "c", Chunk(finish_reason="stop")]
    )
    assert [(c.role, c.content, c.pieces, c.tokens, c.finish_reason) for c in joined] == [
        ("assistant", "", (), None, None),
        (None, "abc", ("a", "b", "c"), 3, None),
        (None, None, (), None, "stop"),
    ]
    (lone,) = coalescer.join(["d"])
    assert (lone.content, lone.pieces, lone.tokens) == ("d", (), 4)


def test_plain_text_from_an_upstream_that_counts_has_no_count_to_join_on() -> None:
    joined = Coalescer(upstream_counts=True).join([Chunk(content="a", tokens=1), Chunk(content="b", tokens=2), "c"])
    assert [(c.content, c.tokens) for c in joined] == [("ab", 2), ("c", None)]
