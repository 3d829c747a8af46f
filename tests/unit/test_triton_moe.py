"""The Triton grouped-MoE kernels (CUDA's MoE path), run on CPU by Triton's interpreter.

Oracle: a float64 per-token loop over each token's chosen experts (the definition of the
block), and the torch grouped path the CPU runs. Shapes stay small (interpreted kernels run
one program at a time); the last test compiles the kernels for sm_90 without a GPU.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import importlib  # noqa: E402
import textwrap  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

pytest.importorskip("triton", reason="triton is not installed (the `test` extra pins it on Linux)")

from triton_compile import assert_compiles_for_sm90  # noqa: E402

from sgl.runtime.model import moe_triton  # noqa: E402
from sgl.runtime.model.moe import StackedExperts  # noqa: E402

if type(moe_triton.gate_up_kernel).__name__ != "InterpretedFunction":
    importlib.reload(
        moe_triton
    )  # imported earlier without the interpreter: decorate the kernels again


def reference(x, gate_up, down, experts, weights, act):
    """float64, token by token: sum_j w_j * down_e(act(gate_e x) * up_e x)."""
    inter = down.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for e, w in zip(experts[t].tolist(), weights[t].tolist()):
            gate, up = (gate_up[e].double() @ x[t].double()).split(inter)
            a = F.gelu(gate, approximate="tanh") if act == "gelu_tanh" else F.silu(gate)
            out[t] += w * (down[e].double() @ (a * up))
    return out


def routed(tokens: int, num_experts: int, k: int, seed: int, skew: bool = False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(tokens, num_experts, generator=g)
    if skew:  # most tokens to expert 0, some experts never chosen
        scores[:, 0] += 4.0
        scores[:, -1] -= 8.0
    weights, experts = scores.softmax(-1).topk(k, -1)
    return experts, weights


@pytest.mark.parametrize(
    "tokens,num_experts,k,hidden,inter,act,dtype",
    [
        (1, 4, 2, 64, 32, "silu", torch.float32),  # one decode row: blocks of 16, mostly padding
        (7, 8, 2, 48, 40, "silu", torch.float32),  # sizes not multiples of the tiles
        (70, 4, 2, 64, 96, "silu", torch.float32),  # > 16 rows per expert: blocks of 64
        (33, 6, 3, 32, 24, "gelu_tanh", torch.float32),
        (20, 8, 1, 64, 64, "silu", torch.bfloat16),
    ],
)
def test_grouped_kernels_match_float64_reference_and_torch_path(
    tokens, num_experts, k, hidden, inter, act, dtype
):
    g = torch.Generator().manual_seed(tokens)
    experts_mod = StackedExperts(num_experts, hidden, inter, act)
    with torch.no_grad():
        experts_mod.gate_up_proj.copy_(
            torch.randn(num_experts, 2 * inter, hidden, generator=g) * hidden**-0.5
        )
        experts_mod.down_proj.copy_(
            torch.randn(num_experts, hidden, inter, generator=g) * inter**-0.5
        )
    experts_mod = experts_mod.to(dtype)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    experts, weights = routed(tokens, num_experts, k, seed=tokens, skew=tokens == 70)
    with torch.no_grad():
        got = moe_triton.grouped_experts(
            x, experts_mod.gate_up_proj, experts_mod.down_proj, experts, weights, act
        )
        torch_path = experts_mod.grouped_matmuls(x, experts, weights)
    want = reference(x, experts_mod.gate_up_proj, experts_mod.down_proj, experts, weights, act)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    torch.testing.assert_close(got.double(), torch_path.double(), atol=tol, rtol=tol)


def test_expert_blocks_give_each_block_one_expert():
    """Every pair lands in exactly one padded row of a block owned by its expert; unused blocks are
    -1."""
    experts, _ = routed(37, 5, 2, seed=1, skew=True)
    pair_of_row, block_expert = moe_triton.expert_blocks(experts, 5, 16)
    num_pairs = experts.numel()
    rows = pair_of_row.tolist()
    assert sorted(p for p in rows if p < num_pairs) == list(range(num_pairs))
    flat = experts.reshape(-1).tolist()
    for row, pair in enumerate(rows):
        if pair < num_pairs:
            assert block_expert[row // 16] == flat[pair]
    used = {flat[p] for p in range(num_pairs)}
    assert sorted(e for e in block_expert.tolist() if e >= 0) == sorted(
        e for e in used for _ in range(-(-flat.count(e) // 16))
    )
    assert set(block_expert.tolist()) <= used | {-1}


def test_moe_kernels_compile_for_sm90(tmp_path):
    """Interpreted kernels are not compiled ones: compile them for an H100/H200 target, no GPU
    needed."""
    script = textwrap.dedent(
        """
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from sgl.runtime.model import moe_triton as mt

        def compile(fn, ptrs, consts):
            sig = {n: "constexpr" if n in consts else ptrs.get(n, "i32") for n in fn.arg_names}
            triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=4))

        for ty, dot_dtype, precision, block_m in (("*bf16", tl.bfloat16, "tf32", 64),
                                                  ("*fp32", tl.float32, "ieee", 16)):
            tiles = dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=64, DOT_DTYPE=dot_dtype,
                         DOT_PRECISION=precision)
            for gelu in (False, True):
                compile(mt.gate_up_kernel,
                        dict(X=ty, W=ty, H=ty, Pair_of_row="*i32", Block_expert="*i32"),
                        dict(GELU_TANH=gelu, **tiles))
            compile(mt.down_kernel,
                    dict(H=ty, W=ty, Out="*fp32", Pair_of_row="*i32", Block_expert="*i32",
                         Pair_weight="*fp32"),
                    tiles)
        print("compiled")
        """
    )
    assert_compiles_for_sm90(script, tmp_path)
