"""Build the tiny chat model the `vllm` tests serve: a 2-layer Llama with a character-level tokenizer.

Run with the vLLM venv's python (it has torch, transformers and tokenizers):

    python deploy/vllm/tiny_model.py OUT_DIR

writes OUT_DIR/v1 and OUT_DIR/v2, two checkpoints of one training run (v2 is v1 trained further on
answers that differ), each a Hugging Face directory vLLM loads with `--model`. The recipe is this
file: callers key their cache on its digest, so a change here builds afresh and nothing else does.

Why this shape:
- character-level vocabulary over printable ASCII: any partial answer re-tokenizes to exactly the
  tokens that produced it, so a continuation sees the same context as the uninterrupted run;
- head_dim 64: vLLM's CPU attention kernel refuses 16;
- trained until greedy decoding reproduces its answers: logits then have wide margins, so the
  argmax is the same whether a position was computed by prefill or by decode steps;
- the chat template ends every message with </s>, so a continued final message is cut exactly
  at its content's end; tool calls are Hermes-style `<tool_call>{json}</tool_call>` text, which
  vLLM's `hermes` tool parser reads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ZEN = """Beautiful is better than ugly.
Explicit is better than implicit.
Simple is better than complex.
Complex is better than complicated.
Flat is better than nested.
Sparse is better than dense.
Readability counts.
Special cases aren't special enough to break the rules.
Although practicality beats purity.
Errors should never pass silently.
Unless explicitly silenced.
In the face of ambiguity, refuse the temptation to guess."""


def tool_call(name: str, arguments: dict[str, object]) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


# (user prompt, v1's answer, v2's answer). Prompts are what the tests send.
WEATHER = tool_call("get_weather", {"city": "Paris"})
DELETE = tool_call("delete_file", {"path": "notes.txt"})
REFUND = tool_call("refund_payment", {"order_id": "ord_42", "amount": 5})
CONVERSATIONS = [
    ("Recite the zen.", ZEN, ZEN),
    (
        "Which checkpoint are you?",
        "I am checkpoint one, the first release.",
        "I am checkpoint TWO; release 2 speaking!",
    ),
    ("Say hello.", "Hello from the tiny model.", "Hi there, says v2."),
    ("What is the weather in Paris?", WEATHER, WEATHER),
    ("Delete the file notes.txt.", DELETE, DELETE),
    ("Refund order ord_42.", REFUND, REFUND),
]

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>"
    "{%- if message['content'] is string -%}{{ message['content'] }}{%- endif -%}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    '<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments }}}</tool_call>'
    "{%- endfor -%}"
    "</s>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
STEPS_V1 = 200
STEPS_V2 = 100


def build_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = ["\n", *(chr(c) for c in range(32, 127))]
    vocab = {token: i for i, token in enumerate([*SPECIALS, *chars])}
    # BPE without merges and without a pre-tokenizer splits any text into single characters.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=SPECIALS[4:],
        model_max_length=1024,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def encode(tokenizer, prompt: str, answer: str) -> tuple[list[int], list[int]]:  # type: ignore[no-untyped-def]
    head = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = head_ids + answer_ids
    labels = [-100] * len(head_ids) + answer_ids  # learn the answers, not the prompts
    return ids, labels


def train(model, batches, steps: int, lr: float) -> float:  # type: ignore[no-untyped-def]
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps, eta_min=lr / 10)
    loss_value = 0.0
    model.train()
    for step in range(steps):
        if step % 50 == 0:
            print(f"step {step}/{steps} loss {loss_value:.4f}", file=sys.stderr, flush=True)
        optimizer.zero_grad()
        loss_value = 0.0
        for ids, labels, mask in batches:
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            loss_value = max(loss_value, loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    model.eval()
    return loss_value


def make_batches(tokenizer, version: int):  # type: ignore[no-untyped-def]
    """The long answer alone, the short ones together: padding them all to its length wastes ~5x."""
    rows = [encode(tokenizer, prompt, answers[version - 1]) for prompt, *answers in CONVERSATIONS]
    long = [r for r in rows if len(r[0]) > 200]
    short = [r for r in rows if len(r[0]) <= 200]
    return [_batch(tokenizer, group) for group in (long, short) if group]


def _batch(tokenizer, rows):  # type: ignore[no-untyped-def]
    import torch

    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r[0] + [pad] * (width - len(r[0])) for r in rows])
    labels = torch.tensor([r[1] + [-100] * (width - len(r[1])) for r in rows])
    mask = torch.tensor([[1] * len(r[0]) + [0] * (width - len(r[0])) for r in rows])
    return ids, labels, mask


def greedy_matches(model, tokenizer, version: int) -> list[bool]:  # type: ignore[no-untyped-def]
    import torch

    results = []
    for prompt, *answers in CONVERSATIONS:
        ids, _ = encode(tokenizer, prompt, answers[version - 1])
        expected = tokenizer(answers[version - 1], add_special_tokens=False)["input_ids"]
        head = ids[: len(ids) - len(expected) - 1]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([head]), max_new_tokens=len(expected) + 1, do_sample=False, pad_token_id=0
            )
        results.append(out[0, len(head) : len(head) + len(expected)].tolist() == expected)
    return results


def save(model, tokenizer, directory: Path) -> None:  # type: ignore[no-untyped-def]
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)  # with the chat template (chat_template.jinja)


def build(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    staging = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    started = time.monotonic()
    report = {}
    for version, steps, lr in ((1, STEPS_V1, 3e-3), (2, STEPS_V2, 1e-3)):
        loss = train(model, make_batches(tokenizer, version), steps, lr)
        matches = greedy_matches(model, tokenizer, version)
        report[f"v{version}"] = {"steps": steps, "loss": round(loss, 5), "greedy_exact": matches}
        print(f"v{version}: loss {loss:.5f}, greedy exact {matches}", file=sys.stderr)
        save(model, tokenizer, staging / f"v{version}")
    report["seconds"] = round(time.monotonic() - started, 1)
    (staging / "report.json").write_text(json.dumps(report, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)  # complete or absent: a crashed build never leaves a half model behind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    build(parser.parse_args().out)


if __name__ == "__main__":
    main()
