"""CUDA-graph replay of decode steps gives the greedy tokens of eager decoding, through the
whole engine (padding, static buffers, backend hooks, scheduler routing), per backend."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import assert_same_greedy, free_cuda, greedy_top2, random_prompts, sharpen
from graph_test_backend import DenseDecodeBackend

import sgl
import sgl.runtime.attention as attn
import sgl.runtime.model_runner as runner_mod

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# (logprob tolerance, near-tie margin) on sharpened logits (see gpu_helpers.sharpen): tight in
# float32; in bfloat16 a padded batch or another split of the KV rounds differently
TOLERANCES = {"float32": (1e-2, 1e-2), "bfloat16": (0.5, 0.5)}


@pytest.mark.parametrize(
    "backend, dtype",
    [
        ("dense_test", "float32"),
        ("triton", "float32"),
        ("triton", "bfloat16"),
        ("flashinfer", "bfloat16"),
    ],
)
def test_graph_replay_matches_eager(backend, dtype, monkeypatch):
    if backend == "dense_test":
        monkeypatch.setattr(
            runner_mod,
            "create_attention_backend",
            lambda name, device, dtype=None, needs=frozenset(): DenseDecodeBackend(),
        )
        name = "torch_native"
    elif backend == "triton" and not attn.triton_available():
        pytest.skip("the triton backend is not installed")
    elif backend == "flashinfer" and not attn.flashinfer_available():
        pytest.skip("flashinfer is not installed")
    else:
        name = backend
    prompts = random_prompts(7, 49152, seed=2)
    new_tokens = [
        12,
        3,
        9,
        20,
        1,
        15,
        6,
    ]  # rows finish at different steps: 7 -> 1 rows, padded to 8, 4, 2, 1
    kw = dict(
        model_path="smollm2-135m",
        load_format="dummy",
        random_seed=0,
        device="cuda",
        dtype=dtype,
        attention_backend=name,
        max_total_tokens=16384,
        context_length=256,
        cuda_graph_max_bs=16,
    )
    with sgl.Engine(disable_cuda_graph=True, **kw) as eager:
        sharpen(eager)
        ref = greedy_top2(eager, prompts, new_tokens)
        assert eager.get_server_info()["cuda_graph_steps"] == 0
    free_cuda()
    with sgl.Engine(**kw) as graphed:
        info = graphed.get_server_info()
        if not info["cuda_graph_batch_sizes"]:
            pytest.skip(f"{info['attention_backend']} offers no CUDA-graph hooks")
        sharpen(graphed)
        got = greedy_top2(graphed, prompts, new_tokens)
        info = graphed.get_server_info()
    free_cuda()
    assert info["cuda_graph_batch_sizes"] == [1, 2, 4, 8, 16]
    assert info["cuda_graph_steps"] > 0
    assert_same_greedy(ref, got, *TOLERANCES[dtype])
