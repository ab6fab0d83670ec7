"""`POST /v1/embeddings`: deterministic embeddings, so that every sim process (and every rerun)
gives the same vector for the same input, and a test can compute what the answer must be.

Each input's vector is derived from SHA-256 of (model, input): `dimensions` floats in [-1, 1],
normalized to length 1 as OpenAI's are; `encoding_format: base64` sends them as little-endian
float32 bytes. Usage counts an input's words (a string) or its ids (token ids)."""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from typing import Any

DEFAULT_DIMENSIONS = 8


class EmbeddingsError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def vector(model: str, text: str, dimensions: int) -> list[float]:
    raw: list[float] = []
    counter = 0
    while len(raw) < dimensions:
        digest = hashlib.sha256(f"{model}\0{text}\0{counter}".encode()).digest()
        raw += [(value / 2**31) - 1.0 for value in struct.unpack("<8I", digest)]
        counter += 1
    raw = raw[:dimensions]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


def embed(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise EmbeddingsError("body must be an object with a model", "model")
    given = body.get("input")
    inputs = [given] if isinstance(given, str) or _ids(given) else given
    if not isinstance(inputs, list) or not inputs:
        raise EmbeddingsError("input must be a string or a non-empty list", "input")
    dimensions = body.get("dimensions") or DEFAULT_DIMENSIONS
    if not isinstance(dimensions, int) or dimensions < 1 or dimensions > 4096:
        raise EmbeddingsError("dimensions must be 1-4096", "dimensions")
    base64_wanted = body.get("encoding_format") == "base64"
    data, tokens = [], 0
    for index, item in enumerate(inputs):
        text = item if isinstance(item, str) else " ".join(str(i) for i in item) if _ids(item) else None
        if text is None:
            raise EmbeddingsError(f"input[{index}] must be a string or token ids", "input")
        tokens += len(text.split()) or 1
        values = vector(body["model"], text, dimensions)
        encoded: Any = base64.b64encode(struct.pack(f"<{dimensions}f", *values)).decode() if base64_wanted else values
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    return {
        "object": "list",
        "data": data,
        "model": body["model"],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _ids(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    )
