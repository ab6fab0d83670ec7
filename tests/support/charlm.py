"""A tiny character-level transformer: trained on CPU in seconds, greedy and deterministic.

Only for tests: it gives two checkpoints whose answers are visibly different (one trained on
"a"-heavy text, one on "z"-heavy text), so a test can tell which weights answered.
"""

from __future__ import annotations

import string

import torch
from torch import nn

VOCAB = string.printable  # 100 printable ASCII characters
CONTEXT = 32
D_MODEL = 32
_INDEX = {char: i for i, char in enumerate(VOCAB)}


def encode(text: str) -> list[int]:
    """Characters outside the vocabulary become spaces."""
    return [_INDEX.get(char, _INDEX[" "]) for char in text]


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


class CharLM(nn.Module):
    def __init__(self, layers: int = 1, heads: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(len(VOCAB), D_MODEL)
        self.positions = nn.Embedding(CONTEXT, D_MODEL)
        layer = nn.TransformerEncoderLayer(
            D_MODEL, heads, dim_feedforward=4 * D_MODEL, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, len(VOCAB))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(length))
        mask = nn.Transformer.generate_square_subsequent_mask(length)
        logits: torch.Tensor = self.head(self.norm(self.blocks(x, mask=mask, is_causal=True)))
        return logits


def train(text: str, steps: int = 60, seed: int = 0, batch: int = 16) -> dict[str, torch.Tensor]:
    """Next-character training on random windows of `text`; returns the state_dict."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains several times faster on one thread
    try:
        return _train(text, steps, seed, batch)
    finally:
        torch.set_num_threads(threads)


def _train(text: str, steps: int, seed: int, batch: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = CharLM()
    data = torch.tensor(encode(text))
    assert len(data) > CONTEXT + 1, "training text shorter than the context"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - CONTEXT - 1, (batch,))
        inputs = torch.stack([data[s : s + CONTEXT] for s in starts])
        targets = torch.stack([data[s + 1 : s + CONTEXT + 1] for s in starts])
        logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.reshape(-1, len(VOCAB)), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        optimizer.step()
    model.eval()
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def load(state_dict: dict[str, torch.Tensor]) -> CharLM:
    model = CharLM()
    model.load_state_dict(state_dict)
    model.eval()
    return model


@torch.no_grad()
def next_char(model: CharLM, context: list[int]) -> int:
    window = context[-CONTEXT:] or encode(" ")
    logits = model(torch.tensor([window]))[0, -1]
    return int(torch.argmax(logits).item())


def generate(model: CharLM, prompt: str, max_tokens: int) -> str:
    """Greedy continuation of `prompt`, `max_tokens` characters long."""
    ids = encode(prompt)
    out: list[int] = []
    for _ in range(max_tokens):
        out.append(next_char(model, ids + out))
    return decode(out)
