"""Every sample format parses into request bodies; overrides build what is actually sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from replay.samples import (
    Overrides,
    PrepareError,
    Sample,
    SampleError,
    apply_overrides,
    load_samples,
    parse_item,
    parse_timestamp,
    prepare,
)
from tests.replay.conftest import SHARED_SAMPLES, chat_body, write_jsonl

ABSENT = f"the shared samples are not checked out at {SHARED_SAMPLES}"


def test_our_jsonl_keeps_id_and_timestamp_out_of_the_body(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "s.jsonl",
        [
            {"id": "a", "timestamp": 1700000000.5, **chat_body(0)},
            {"timestamp": "2024-01-01T00:00:01Z", **chat_body(1)},
        ],
    )
    loaded = load_samples(path)
    first, second = loaded.samples
    assert (first.id, first.timestamp, first.format) == ("a", 1700000000.5, "jsonl")
    assert "id" not in first.body
    assert "timestamp" not in first.body
    assert second.id == "line-2"
    assert second.timestamp == parse_timestamp("2024-01-01T00:00:01+00:00")


def test_shared_sample_lines_use_their_body_and_keep_the_category(tmp_path: Path) -> None:
    line = {"id": "live_simple_0", "category": "live_simple", "expect_tool_call": True, "body": chat_body(0)}
    sample = load_samples(write_jsonl(tmp_path / "s.jsonl", [line])).samples[0]
    assert (sample.id, sample.category, sample.format) == ("live_simple_0", "live_simple", "shared")
    assert sample.body == chat_body(0)


def test_openai_batch_lines_use_custom_id_and_skip_other_endpoints(tmp_path: Path) -> None:
    lines = [
        {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(0)},
        {"custom_id": "req-2", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x", "model": "m"}},
    ]
    loaded = load_samples(write_jsonl(tmp_path / "batch.jsonl", lines))
    assert [(s.id, s.format) for s in loaded.samples] == [("req-1", "batch")]
    assert loaded.skipped == {"batch line for /v1/embeddings": 1}


def test_sharegpt_conversations_become_messages_up_to_the_last_user_turn(tmp_path: Path) -> None:
    conversation = {
        "id": "conv-1",
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello!"},
            {"from": "human", "value": "Tell me a joke"},
            {"from": "gpt", "value": "No."},
        ],
    }
    path = tmp_path / "sharegpt.json"
    path.write_bytes(orjson.dumps([conversation, {"id": "empty", "conversations": [{"from": "gpt", "value": "x"}]}]))
    loaded = load_samples(path)
    (sample,) = loaded.samples
    assert sample.id == "conv-1"
    assert sample.format == "sharegpt"
    assert [m["role"] for m in sample.body["messages"]] == ["system", "user", "assistant", "user"]
    assert sample.body["messages"][-1]["content"] == "Tell me a joke"
    assert loaded.skipped == {"sharegpt conversation without a user turn": 1}


def test_audit_capture_lines_replay_the_captured_request_at_its_start_time(tmp_path: Path) -> None:
    lines: list[dict[str, Any]] = [
        {
            "kind": "request",
            "request_id": "r1",
            "ts": 1000.0,
            "duration_ms": 250.0,
            "capture": {"request": chat_body(0, stream=True), "completion": "hi"},
        },
        {"kind": "request", "request_id": "r2", "ts": 1001.0, "duration_ms": 10.0},
        {"kind": "key_created", "key_id": "k"},
    ]
    loaded = load_samples(write_jsonl(tmp_path / "audit.jsonl", lines))
    (sample,) = loaded.samples
    assert (sample.id, sample.format, sample.timestamp) == ("r1", "audit", 999.75)
    assert sample.body["stream"] is True
    assert loaded.skipped == {"audit request without capture": 1, "audit record of kind 'key_created'": 1}


def test_broken_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(orjson.dumps(chat_body(0)) + b"\n{not json\n\n[1, 2]\n" + orjson.dumps({"x": 1}) + b"\n")
    loaded = load_samples(path)
    assert len(loaded.samples) == 1
    assert loaded.skipped == {"line is not valid JSON": 1, "line is not a JSON object": 1, "unrecognized line": 1}


def test_a_file_without_any_request_is_an_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "none.jsonl", [{"kind": "key_created"}])
    with pytest.raises(SampleError, match="no request samples"):
        load_samples(path)


def test_overrides_apply_and_streaming_always_asks_for_usage() -> None:
    body = chat_body(0, max_completion_tokens=500, stream_options={"include_usage": False, "x": 1})
    out = apply_overrides(body, Overrides(model="m2", max_tokens=20, stream=True))
    assert out["model"] == "m2"
    assert out["max_completion_tokens"] == 20
    assert "max_tokens" not in out
    assert out["stream_options"] == {"include_usage": True, "x": 1}
    assert body["stream_options"] == {"include_usage": False, "x": 1}, "the sample itself is not changed"
    plain = apply_overrides(out, Overrides(stream=False))
    assert "stream_options" not in plain


def test_max_tokens_override_makes_a_length_finish_expected() -> None:
    sample = load_samples_from_body(chat_body(0, stream=True))
    assert prepare(sample, Overrides(max_tokens=20)).expect_length
    assert not prepare(sample, Overrides()).expect_length


def test_a_sample_without_a_model_needs_the_model_option() -> None:
    sample = load_samples_from_body({"messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(PrepareError, match="--model"):
        prepare(sample, Overrides())
    assert orjson.loads(prepare(sample, Overrides(model="m")).body)["model"] == "m"


def load_samples_from_body(body: dict[str, object]) -> Sample:
    sample = parse_item(body, "1")
    assert isinstance(sample, Sample)
    return sample


@pytest.mark.skipif(not (SHARED_SAMPLES / "bfcl_live_requests.jsonl").exists(), reason=ABSENT)
def test_the_shared_bfcl_samples_all_load() -> None:
    loaded = load_samples(SHARED_SAMPLES / "bfcl_live_requests.jsonl")
    assert len(loaded.samples) == 240
    assert loaded.skipped == {}
    assert loaded.formats == {"shared": 240}
    assert len({s.id for s in loaded.samples}) == 240
    assert all(s.body.get("tools") and s.body["messages"] for s in loaded.samples)
    assert {s.category for s in loaded.samples} >= {"live_simple", "live_multiple", "live_irrelevance"}


@pytest.mark.skipif(not (SHARED_SAMPLES / "bfcl_multiturn_sessions.jsonl").exists(), reason=ABSENT)
def test_multiturn_sessions_are_not_single_requests_and_say_so() -> None:
    with pytest.raises(SampleError, match="no request samples found"):
        load_samples(SHARED_SAMPLES / "bfcl_multiturn_sessions.jsonl")


def test_a_body_with_input_and_no_messages_is_a_responses_sample(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        "\n".join(
            [
                '{"id": "r", "model": "m", "input": "hi", "max_output_tokens": 3}',
                '{"id": "c", "model": "m", "messages": [{"role": "user", "content": "hi"}]}',
                '{"custom_id": "b", "url": "/v1/responses", "body": {"model": "m", "input": [{"role": "user"}]}}',
                '{"custom_id": "e", "url": "/v1/embeddings", "body": {"model": "m", "input": "x"}}',
            ]
        )
    )
    loaded = load_samples(path)
    assert [(s.id, s.api) for s in loaded.samples] == [("r", "responses"), ("c", "chat"), ("b", "responses")]
    assert loaded.skipped == {"batch line for /v1/embeddings": 1}
    prepared = prepare(loaded.samples[0], Overrides(max_tokens=9, stream=True))
    # The Responses API names its limit max_output_tokens and has no stream_options.
    assert orjson.loads(prepared.body) == {"model": "m", "input": "hi", "max_output_tokens": 9, "stream": True}
    assert prepared.api == "responses"
