"""The families whose attention or MLP differs from Llama's, on the GPU: sliding windows and
soft-capping in the Triton attention kernels, experts through the Triton grouped-MoE kernels
(also under CUDA graphs). Oracle: the same tiny model on the CPU engine (itself held to HF
transformers by tests/unit/test_model_families.py), greedy tokens with near-tie tolerance."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import assert_same_greedy, free_cuda, greedy_top2, random_prompts

import sgl

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("arch", ["gemma2", "mistral-sliding", "mixtral", "qwen3_moe"])
def test_family_greedy_on_gpu_matches_cpu(arch, tmp_path):
    from tiny_models import save_tiny_engine_dir

    path, _ = save_tiny_engine_dir(tmp_path, 320, arch=arch)
    prompts = random_prompts(6, 320, lo=10, hi=60, seed=2)  # longer than the windows (8)
    kw = dict(model_path=str(path), dtype="float32", max_total_tokens=4096)
    with sgl.Engine(device="cpu", **kw) as cpu:
        ref = greedy_top2(cpu, prompts, 24)
    with sgl.Engine(device="cuda", attention_backend="triton", cuda_graph_max_bs=8, **kw) as gpu:
        got = greedy_top2(gpu, prompts, 24)
        info = gpu.get_server_info()
    free_cuda()
    assert info["attention_backend"] == "triton"
    assert_same_greedy(ref, got, lp_tol=1e-3, tie_margin=1e-3)


@pytest.mark.parametrize("rows", [1, 8, 64, 512])
def test_triton_grouped_experts_match_torch_path_at_qwen3_30b_a3b_shape(rows):
    """One layer of Qwen3-30B-A3B's experts (128 of 768, top 8) in bfloat16: the Triton kernels
    against the torch grouped path, in float32 against float64."""
    from sgl.runtime.model.moe import StackedExperts
    from sgl.runtime.model.moe_triton import grouped_experts

    torch.manual_seed(rows)
    experts_mod = StackedExperts(128, 2048, 768, "silu").cuda()
    with torch.no_grad():
        experts_mod.gate_up_proj.normal_(0, 2048**-0.5)
        experts_mod.down_proj.normal_(0, 768**-0.5)
    x = torch.randn(rows, 2048, device="cuda")
    weights, experts = torch.randn(rows, 128, device="cuda").softmax(-1).topk(8, -1)
    with torch.no_grad():
        got32 = grouped_experts(
            x, experts_mod.gate_up_proj, experts_mod.down_proj, experts, weights, "silu"
        )
        gate_up16, down16 = experts_mod.gate_up_proj.bfloat16(), experts_mod.down_proj.bfloat16()
        got16 = grouped_experts(x.bfloat16(), gate_up16, down16, experts, weights, "silu")
        ref = experts_mod.double().grouped_matmuls(
            x.double(), experts, weights.double()
        )  # (in place: last)
    torch.testing.assert_close(got32.double(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got16.double(), ref, atol=3e-2, rtol=3e-2)
    free_cuda()
