"""Oracles shared by the engine integration tests: HF transformers on the same GGUF file.

Nothing here looks at what our engine produced before; every expected value is derived
from HF's fp32 model (logits, greedy generation) or from the token ids themselves.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

EOS = 2
# A genuine near-tie: HF's top-2 logits closer than this at a diverging step.
NEAR_TIE = 1e-4
LOGPROB_ATOL = 1e-3
GREEDY_MAX_NEW = 32
# Small enough that 8 requests x (~40 prompt + 64 new tokens) must be retracted.
TINY_POOL = 400

_LONG_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined a screw press with movable metal type, oil-based ink and a mould for casting "
    "letters. "
    "Before that, books in Europe were copied by hand, usually by monks, and a single Bible could "
    "take "
    "years to finish. Printing changed the economics of knowledge: pamphlets, newspapers and "
    "scientific "
    "journals spread ideas faster than any authority could control them, and literacy rose across "
    "the "
    "continent. Historians still argue about how much of the Reformation, the Scientific "
    "Revolution and "
    "the rise of the modern state can be traced back to this one invention."
)


# Engine options under which greedy tokens must equal HF's float32 ones on the embedded GGUF
# (HF dequantizes it to float32): dense float32, not the bf16 / int4 default of a bf16-capable CPU.
ORACLE_EXACT = dict(dtype="float32", quantization="none")


def load_hf_model() -> Any:
    import transformers

    from sgl.runtime.model.paths import resolve_model_path

    path = resolve_model_path("default")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    )
    return model.eval()


def chat(tokenizer: Any, user: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )


def greedy_prompts(tokenizer: Any) -> list[str]:
    """Varied prompts: plain and chat-rendered, about 5 to 200 tokens."""
    return [
        "The capital of France is",
        chat(tokenizer, "What is 2+2?"),
        chat(tokenizer, "Write a haiku about autumn leaves."),
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
        "Q: What is the boiling point of water in Celsius?\nA:",
        chat(tokenizer, "Summarize the following text in one sentence.\n\n" + _LONG_TEXT),
        "Once upon a time, in a small village at the edge of a great forest, there lived",
        chat(tokenizer, "List three primary colors."),
        _LONG_TEXT[:420] + " In short,",
        "1, 1, 2, 3, 5, 8, 13,",
    ]


def long_text(n_repeat: int = 2) -> str:
    return " ".join([_LONG_TEXT] * n_repeat)


@torch.no_grad()
def hf_logits(hf: Any, ids: Sequence[int]) -> torch.Tensor:
    """[len(ids), vocab] fp32 logits of one unpadded sequence."""
    return hf(torch.tensor([list(ids)])).logits[0].float()


@torch.no_grad()
def hf_greedy(hf: Any, ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """HF greedy generation for one prompt alone; stops after EOS (included) or the limit."""
    inp = torch.tensor([list(ids)])
    out = hf.generate(
        inp,
        attention_mask=torch.ones_like(inp),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )
    return out[0, len(ids) :].tolist()


def top2_gap(hf: Any, ids: Sequence[int]) -> tuple[float, list[int]]:
    vals, idx = hf_logits(hf, ids)[-1].topk(2)
    return float(vals[0] - vals[1]), idx.tolist()


def assert_same_greedy(
    hf: Any, prompt_ids: Sequence[int], want: Sequence[int], got: Sequence[int], what: str = ""
) -> None:
    """`got` equals `want` token for token, or diverges only at a genuine near-tie.

    A divergence at step k is accepted only when HF's top-2 logits after
    prompt + want[:k] are within NEAR_TIE and the two diverging tokens are exactly those two;
    from that point on the sequences may differ.
    """
    want, got = list(want), list(got)
    n = min(len(want), len(got))
    k = next((i for i in range(n) if want[i] != got[i]), None)
    if k is None:
        assert len(want) == len(got), (
            f"{what}: same tokens but lengths differ: want {want}, got {got}"
        )
        return
    gap, top2 = top2_gap(hf, list(prompt_ids) + want[:k])
    assert gap < NEAR_TIE and sorted(top2) == sorted([want[k], got[k]]), (
        f"{what}: token {k} differs (want {want[k]}, got {got[k]}) and it is not a near-tie "
        f"(HF top-2 {top2}, gap {gap:.3g})\nwant {want}\ngot  {got}"
    )


def truncate_at_eos(ids: Sequence[int]) -> list[int]:
    ids = list(ids)
    return ids[: ids.index(EOS) + 1] if EOS in ids else ids


def wait_until(cond: Callable[[], bool], timeout: float = 20.0, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(interval)
    return cond()


def kv_all_returned(engine: Any) -> bool:
    """No request holds KV: every slot is free or held only by the (evictable) radix cache."""
    info = engine.get_server_info()
    return (
        info["num_running_reqs"] == 0
        and info["num_waiting_reqs"] == 0
        and info["available_kv_tokens"] + info["evictable_tokens"] == info["max_total_tokens"]
    )


def assert_pool_whole_after_flush(engine: Any) -> None:
    assert wait_until(lambda: engine.get_server_info()["num_running_reqs"] == 0, timeout=30)
    assert engine.flush_cache() is True
    info = engine.get_server_info()
    assert info["available_kv_tokens"] == info["max_total_tokens"], info
    assert info["radix_cache_tokens"] == 0, info
