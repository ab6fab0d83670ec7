"""Deterministic reply text for the simulated backend.

The reply depends only on the model name and the messages, so every sim process (and every rerun of
a test) produces the same tokens for the same request. That is what lets a gateway fail over to
another sim mid-stream and check that the continuation joins seamlessly.

Tokens are plain words; every token but the first carries a leading space, so joining the tokens
gives the reply text and any prefix of the token list is a prefix of the text.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

import orjson

Message = dict[str, Any]

# A packed literal is far easier to scan than one word per line.
# fmt: off
VOCABULARY: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "that", "it", "was", "for", "on", "are", "as", "with", "his",
    "they", "at", "be", "this", "from", "have", "or", "by", "one", "had", "not", "but", "what", "all",
    "were", "when", "we", "there", "can", "an", "your", "which", "their", "said", "if", "do", "will",
    "each", "about", "how", "up", "out", "them", "then", "she", "many", "some", "so", "these", "would",
    "other", "into", "has", "more", "her", "two", "like", "him", "see", "time", "could", "no", "make",
    "than", "first", "been", "its", "who", "now", "people", "my", "made", "over", "did", "down", "only",
    "way", "find", "use", "may", "water", "long", "little", "very", "after", "words", "called", "just",
    "where", "most", "know", "get", "through", "back", "much", "before", "go", "good", "new", "write",
    "our", "used", "me", "man", "too", "any", "day", "same", "right", "look", "think", "also", "around",
    "another", "came", "come", "work", "three", "word", "must", "because", "does", "part", "even",
    "place", "well", "such", "here", "take", "why", "things", "help", "put", "years", "different", "away",
    "again", "off", "went", "old", "number", "great", "tell", "men", "say", "small", "every", "found",
    "still", "between", "name", "should", "home", "big", "give", "air", "line", "set", "own", "under",
    "read", "last", "never", "us", "left", "end", "along", "while", "might", "next", "sound", "below",
    "saw", "something", "thought", "both", "few", "those", "always", "looked", "show", "large", "often",
    "together", "asked", "house", "world", "going", "want", "school", "important", "until", "form",
    "food", "keep", "children", "feet", "land", "side", "without", "boy", "once", "animals", "life",
    "enough", "took", "sometimes", "four", "head", "above", "kind", "began", "almost", "live", "page",
    "got", "earth", "need", "far", "hand", "high", "year", "mother", "light", "parts", "country",
    "father", "let", "night", "following", "picture", "being", "study", "second", "eyes", "soon", "times",
    "story", "boys", "since", "white", "days", "ever", "paper", "hard", "near", "sentence", "better",
    "best", "across", "during", "today", "others", "however", "sure", "means", "knew", "try", "told",
    "young", "miles", "sun", "ways", "thing", "whole", "hear", "example", "heard", "several", "change",
    "answer", "room", "sea", "against", "top", "turned", "learn", "point", "city", "play", "toward",
    "five", "using", "himself", "usually", "money", "seen", "car", "morning", "given", "trees", "family",
    "later", "river", "open", "state", "voice", "music", "simple", "table", "winter", "garden", "window",
    "forest", "bridge", "market", "letter", "stone", "cloud", "field", "island", "summer", "road",
    "train", "bread", "apple", "orange", "green", "yellow", "silver", "quiet", "bright", "gentle",
    "rapid", "careful", "clever", "honest", "warm", "cold", "early", "late",
)
# fmt: on

MIN_NATURAL_LENGTH = 8
NATURAL_LENGTH_SPREAD = 40
PER_MESSAGE_OVERHEAD = 3


def seed_digest(model: str, messages: Sequence[Message]) -> bytes:
    """SHA-256 of the canonical JSON of (model, messages); stable across processes and runs."""
    canonical = orjson.dumps([model, list(messages)], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).digest()


def digest_rng(digest: bytes, purpose: bytes = b"") -> random.Random:
    """A PRNG seeded from the digest; `purpose` keeps independent uses from sharing draws."""
    return random.Random(hashlib.sha256(digest + purpose).digest())


def natural_length(digest: bytes) -> int:
    """The reply length used when the request sets no token limit."""
    return MIN_NATURAL_LENGTH + int.from_bytes(digest[:8], "big") % NATURAL_LENGTH_SPREAD


def tokens_from_digest(digest: bytes, max_tokens: int | None, *, lead_space: bool = False) -> list[str]:
    length = natural_length(digest) if max_tokens is None else max_tokens
    words = digest_rng(digest, b"text").choices(VOCABULARY, k=length)
    if not words:
        return []
    first = " " + words[0] if lead_space else words[0]
    return [first, *(" " + word for word in words[1:])]


def generate_tokens(model: str, messages: Sequence[Message], max_tokens: int | None = None) -> list[str]:
    """The full reply for a request; exactly `max_tokens` tokens when a limit is given."""
    return tokens_from_digest(seed_digest(model, messages), max_tokens)


def continue_tokens(model: str, messages: Sequence[Message], prefix: str, max_tokens: int | None = None) -> list[str]:
    """The tokens that follow `prefix`, a partial assistant reply to `messages`.

    `max_tokens` limits the new tokens only, as vLLM counts it for `continue_final_message`. When
    `prefix` is what the sim itself said, the result is exactly the rest of that answer: a gateway
    that lost a stream after k of n tokens and asks for n - k more gets the tokens a healthy stream
    would have delivered. Replies are prefix-consistent (the reply of length n starts with the
    reply of length m < n), which is what makes this work.
    """
    if max_tokens is None:
        rest = remaining_tokens(generate_tokens(model, messages), prefix)
    else:
        # Enough tokens to cover the prefix (each token is at least one character) and the rest.
        longer = generate_tokens(model, messages, len(prefix.split()) + max_tokens)
        rest = remaining_tokens(longer, prefix)
        rest = rest[:max_tokens] if rest is not None else None
    if rest is not None:
        return rest
    # Somebody else wrote the prefix: still answer deterministically, keyed on the whole exchange.
    extended = [*messages, {"role": "assistant", "content": prefix}]
    lead_space = bool(prefix) and not prefix[-1].isspace()
    return tokens_from_digest(seed_digest(model, extended), max_tokens, lead_space=lead_space)


def remaining_tokens(tokens: Sequence[str], prefix: str) -> list[str] | None:
    """The tokens after `prefix`, or None when `prefix` is not a prefix of the joined tokens.

    A prefix that ends inside a token yields that token's tail as the first remaining token.
    """
    consumed = 0
    for index, token in enumerate(tokens):
        end = consumed + len(token)
        if end >= len(prefix):
            if not token.startswith(prefix[consumed:]):
                return None
            cut = len(prefix) - consumed
            tail = [token[cut:]] if cut < len(token) else []
            return [*tail, *tokens[index + 1 :]]
        if prefix[consumed:end] != token:
            return None
        consumed = end
    return [] if consumed == len(prefix) else None


def content_text(content: object) -> str:
    """The text of a message `content`: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        )
    return ""


def count_prompt_tokens(messages: Sequence[Message]) -> int:
    """A rough prompt size: whitespace-separated words of every message text plus a fixed overhead."""
    words = sum(len(content_text(message.get("content")).split()) for message in messages)
    return words + PER_MESSAGE_OVERHEAD * len(messages)
