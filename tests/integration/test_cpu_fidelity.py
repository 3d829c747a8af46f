"""bf16 and quantized models on the embedded SmolLM2 GGUF, held to HF transformers.

(a) bf16 (dense): prompt logprobs vs HF in bf16 on the same weights.
(b) int4 (the Q4_1 file kept quantized) and int8: prompt logprobs vs HF float32 on exactly
    the weights our kernels hold (`held_hf_state_dict`), so only kernel error remains.
(c) teacher-forced greedy agreement of the default engine (bf16, int4) with HF float32 on the
    file's weights: at every position of HF's own greedy continuations, our argmax is HF's
    or within NEAR_TIE_LOGPROB of it in HF's log-probabilities (near ties are not errors).

Tolerances are in log-probability units over every scored position; why each is what it
is sits next to it. A wrong layout, scale or permutation gives errors of whole units.
"""

from __future__ import annotations

import copy

import pytest
import torch
from oracle_helpers import hf_greedy, hf_logits

pytestmark = pytest.mark.integration

# (a) Both sides round activations to bf16 (8 bits) after every op, in different orders and
# with different fused kernels: per-position logprobs wander by a few tenths at most.
BF16_MAX_ERR, BF16_MEAN_ERR = 0.75, 0.08
# (b) Same weights; our int kernels read bf16-rounded activations and the model runs in bf16,
# HF in float32: the bf16 error of (a), not more.
HELD_MAX_ERR, HELD_MEAN_ERR = 0.75, 0.08
# (c) A near tie: HF scores our pick within this of its own argmax.
NEAR_TIE_LOGPROB = 0.5
MAX_NEW = 24


@pytest.fixture(scope="module")
def prompts(greedy_refs):
    return greedy_refs.prompt_ids[:6]


def _engine(**kwargs):
    import sgl

    return sgl.Engine(model_path="default", max_total_tokens=8192, **kwargs)


def _prompt_logprobs(engine, ids: list[int]) -> torch.Tensor:
    res = engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=0,
    )
    return torch.tensor([e[0] for e in res["meta_info"]["input_token_logprobs"][1:]])


def _hf_prompt_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logp = torch.log_softmax(hf_logits(hf, ids).float(), dim=-1)
    return logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def _errors(engine, hf, prompts) -> tuple[float, float]:
    diffs = torch.cat(
        [(_prompt_logprobs(engine, ids) - _hf_prompt_logprobs(hf, ids)).abs() for ids in prompts]
    )
    return float(diffs.max()), float(diffs.mean())


def test_bf16_logprobs_track_hf_bf16(hf_model, prompts):
    hf16 = copy.deepcopy(hf_model).to(torch.bfloat16)
    from sgl.runtime.model.cpu_packed import packing_applies

    with _engine(dtype="bfloat16", quantization="none") as engine:
        layouts = engine.get_server_info()[
            "weight_layouts"
        ]  # prepacked for oneDNN where bf16 is native
        packed = packing_applies(torch.bfloat16, torch.device("cpu"))
        assert set(layouts) == ({"dense_packed", "dense"} if packed else {"dense"}), layouts
        worst, mean = _errors(engine, hf16, prompts)
    print(f"bf16 vs HF bf16: max {worst:.3f}, mean {mean:.4f}")
    assert worst <= BF16_MAX_ERR and mean <= BF16_MEAN_ERR, (worst, mean)


def test_bf16_long_prompts_track_hf(hf_model):
    """Prompts of 150-1,500 tokens in chunks of 256 (each chunk after a cached prefix): the
    prefill attention (sgl's kernel where the CPU has AVX512-BF16, else SDPA) in a bf16 model
    holds to HF float32 within the bf16 tolerances of (a)."""
    import random

    rng = random.Random(3)
    long_prompts = [[rng.randrange(1000, 20000) for _ in range(n)] for n in (150, 700, 1500)]
    with _engine(dtype="bfloat16", quantization="none", chunked_prefill_size=256) as engine:
        worst, mean = _errors(engine, hf_model, long_prompts)
    print(f"bf16 long prompts vs HF float32: max {worst:.3f}, mean {mean:.4f}")
    assert worst <= BF16_MAX_ERR and mean <= BF16_MEAN_ERR, (worst, mean)


@pytest.mark.parametrize("quantization,layout", [("auto", "int4_g32"), ("int8", "int8")])
def test_quantized_logprobs_track_hf_on_held_weights(hf_model, prompts, quantization, layout):
    from sgl.runtime.model.held_weights import held_hf_state_dict

    with _engine(dtype="bfloat16", quantization=quantization) as engine:
        info = engine.get_server_info()
        assert info["weight_layouts"][layout] == 4 * info["num_layers"]
        oracle = copy.deepcopy(hf_model)
        missing, unexpected = oracle.load_state_dict(held_hf_state_dict(engine.model), strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embeddings
        worst, mean = _errors(engine, oracle.eval(), prompts)
    print(f"{layout} vs HF on held weights: max {worst:.3f}, mean {mean:.4f}")
    assert worst <= HELD_MAX_ERR and mean <= HELD_MEAN_ERR, (worst, mean)


def test_default_engine_agrees_with_hf_greedy_teacher_forced(hf_model, prompts):
    import sgl

    with sgl.Engine(model_path="default", max_total_tokens=8192) as engine:
        info = engine.get_server_info()
        checked = near_ties = 0
        for ids in prompts:
            seq = ids + hf_greedy(hf_model, ids, MAX_NEW)
            res = engine.generate(
                input_ids=seq,
                sampling_params={"max_new_tokens": 0},
                return_logprob=True,
                logprob_start_len=0,
                top_logprobs_num=1,
            )
            ours = [top[0][1] for top in res["meta_info"]["input_top_logprobs"][1:]]
            with torch.no_grad():
                logp = torch.log_softmax(hf_logits(hf_model, seq), dim=-1)
            for t in range(len(ids) - 1, len(seq) - 1):  # positions predicting HF's continuation
                pick = ours[t]
                gap = float(logp[t].max() - logp[t, pick])
                assert gap <= NEAR_TIE_LOGPROB, (
                    f"position {t}: ours {pick}, HF {int(logp[t].argmax())}, gap {gap:.3f}"
                )
                checked += 1
                near_ties += pick != int(logp[t].argmax())
    print(
        f"dtype={info['dtype']} layouts={info['weight_layouts']}: {checked} positions, "
        f"{near_ties} near ties"
    )
    assert checked >= 6 * 10
