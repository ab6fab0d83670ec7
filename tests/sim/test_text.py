from __future__ import annotations

from typing import Any

import pytest

from sim.text import (
    VOCABULARY,
    continue_tokens,
    count_prompt_tokens,
    generate_tokens,
    natural_length,
    remaining_tokens,
    seed_digest,
)

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about rivers."},
]


def test_same_request_gives_same_tokens() -> None:
    assert generate_tokens("sim-model", MESSAGES) == generate_tokens("sim-model", [dict(m) for m in MESSAGES])


def test_key_order_does_not_change_the_tokens() -> None:
    reordered = [{"content": m["content"], "role": m["role"]} for m in MESSAGES]
    assert generate_tokens("sim-model", reordered) == generate_tokens("sim-model", MESSAGES)


def test_tokens_are_pinned_across_processes_and_releases() -> None:
    # A fixed expectation catches any change that would make two sim versions disagree.
    messages = [{"role": "user", "content": "hi"}]
    assert seed_digest("m", messages).hex() == ("3aa069de508d123ac29e4ae25f3c1818b33b58c4234696ecb4ffb9bc200c2ca4")
    assert generate_tokens("sim-model", messages, 5) == ["cloud", " rapid", " market", " this", " island"]


def test_different_messages_or_model_give_different_tokens() -> None:
    base = generate_tokens("sim-model", MESSAGES, 20)
    other_messages = [*MESSAGES[:-1], {"role": "user", "content": "Tell me about lakes."}]
    assert generate_tokens("sim-model", other_messages, 20) != base
    assert generate_tokens("other-model", MESSAGES, 20) != base


def test_max_tokens_sets_the_exact_length() -> None:
    for limit in (1, 7, 300):
        assert len(generate_tokens("sim-model", MESSAGES, limit)) == limit


def test_natural_length_comes_from_the_request_hash() -> None:
    tokens = generate_tokens("sim-model", MESSAGES)
    assert len(tokens) == natural_length(seed_digest("sim-model", MESSAGES))
    assert 8 <= len(tokens) < 48


def test_tokens_are_vocabulary_words_with_leading_spaces_after_the_first() -> None:
    tokens = generate_tokens("sim-model", MESSAGES, 50)
    assert tokens[0] in VOCABULARY
    assert all(t.startswith(" ") and t[1:] in VOCABULARY for t in tokens[1:])
    assert len(VOCABULARY) >= 200
    assert len(set(VOCABULARY)) == len(VOCABULARY)


@pytest.mark.parametrize("max_tokens", [None, 12])
@pytest.mark.parametrize("k", [0, 1, 5, 11, 12])
def test_continuation_yields_exactly_the_remaining_tokens(max_tokens: int | None, k: int) -> None:
    full = generate_tokens("sim-model", MESSAGES, max_tokens)
    k = min(k, len(full))
    partial = "".join(full[:k])
    remaining = None if max_tokens is None else max_tokens - k  # vLLM counts only new tokens
    continuation = continue_tokens("sim-model", MESSAGES, partial, remaining)
    assert continuation == full[k:]
    assert partial + "".join(continuation) == "".join(full)


def test_continuation_of_a_prefix_ending_inside_a_token_starts_with_its_tail() -> None:
    full = generate_tokens("sim-model", MESSAGES, 10)
    text = "".join(full)
    cut = len(full[0]) + 2  # two characters into the second token (" x...")
    continuation = continue_tokens("sim-model", MESSAGES, text[:cut], 9)
    assert text[:cut] + "".join(continuation) == text
    assert len(continuation) == 9


def test_foreign_prefix_gets_a_fresh_deterministic_continuation() -> None:
    full = generate_tokens("sim-model", MESSAGES, 10)
    foreign = "Rivers are"
    first = continue_tokens("sim-model", MESSAGES, foreign, 10)
    assert first == continue_tokens("sim-model", MESSAGES, foreign, 10)
    assert first != full
    assert len(first) == 10
    assert first[0].startswith(" ")


def test_remaining_tokens_rejects_non_prefixes() -> None:
    tokens = ["a", " b", " c"]
    assert remaining_tokens(tokens, "a b c") == []
    assert remaining_tokens(tokens, "a b c d") is None
    assert remaining_tokens(tokens, "a x") is None
    assert remaining_tokens(tokens, "") == tokens


def test_prompt_tokens_count_words_plus_per_message_overhead() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "one two three"}, {"type": "image_url"}]},
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    assert count_prompt_tokens(messages) == 2 + 3 + 3 * 3
