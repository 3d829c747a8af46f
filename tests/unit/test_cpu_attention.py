"""The CPU attention backend and its C++ kernel
(sgl/runtime/attention/csrc/paged_attention_cpu.cpp).

Oracles: a float64 softmax(QK^T * scale + causal mask) V in plain torch, torch_native on the
same pool, and HF transformers' greedy tokens on a tiny model. The kernel is compiled on
first use (about 10 s, then cached); only without a C++ compiler are these tests skipped.
"""

from __future__ import annotations

import random
import shutil

import pytest
import torch
from attention_cases import make_case, reference, run

from sgl.runtime.attention.torch_native import TorchNativeBackend

if not (shutil.which("c++") or shutil.which("g++")):
    pytest.skip(
        "no C++ compiler: the CPU attention kernel cannot be built here", allow_module_level=True
    )

from sgl.runtime.attention.cpu_kernel import load_paged_attention  # noqa: E402

paged_attention = load_paged_attention()  # with a compiler, a failed build fails these tests

from sgl.runtime.attention.cpu_backend import KERNEL_MAX_EXTEND, CpuBackend  # noqa: E402

DECODE = [(0, 1), (36, 1), (99, 1), (7, 1), (16, 1)]
PREFILL = [(0, 37), (0, 5), (0, 1)]
MIXED = [(20, 17), (45, 1), (0, 1), (0, 23), (63, 3), (31, 16)]
JUMP_FORWARD = [(40, 1), (41, 4), (38, 1), (50, 6), (12, 1), (70, 2)]  # decodes + short extends
LONG = [
    (10, KERNEL_MAX_EXTEND + 9),
    (0, 1),
    (30, KERNEL_MAX_EXTEND),
    (0, 90),
    (5, 2),
]  # SDPA for the long rows


def bound(backend: CpuBackend, case) -> CpuBackend:
    backend.bind(case.batch.kv_pool, case.batch.req_to_token, case.q.shape[1])
    return backend


@pytest.mark.parametrize(
    "specs,heads,kv_heads,head_dim",
    [
        (DECODE, 9, 3, 64),  # SmolLM2's shape
        (DECODE, 4, 4, 32),
        (MIXED, 4, 2, 16),
        (PREFILL, 8, 2, 128),
        (MIXED, 6, 2, 96),
        (MIXED, 4, 1, 256),
        (JUMP_FORWARD, 9, 3, 64),
        (LONG, 4, 2, 64),
        (MIXED, 10, 2, 64),  # 5 heads per kv head: a full chunk of 4 and a chunk of 1
        (DECODE, 32, 8, 64),  # Llama-3.2-1B's shape
    ],
)
def test_matches_float64_reference_and_torch_native(specs, heads, kv_heads, head_dim):
    case = make_case(
        specs, kv_heads, head_dim, torch.float32, heads=heads, max_context=256, capacity=1200
    )
    expected = reference(case)
    backend = bound(CpuBackend(paged_attention), case)
    assert backend.uses_kernel
    got = run(backend, case)
    assert got.shape == case.q.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    pool, loc = case.batch.kv_pool, case.batch.out_cache_loc  # the new K/V landed in their slots
    assert torch.equal(pool.k_buffers[0][loc], case.k) and torch.equal(
        pool.v_buffers[0][loc], case.v
    )
    torch.testing.assert_close(got, run(TorchNativeBackend(), case), rtol=1e-5, atol=1e-5)


FEATURES = [
    dict(sliding_window=1),
    dict(sliding_window=5),
    dict(sliding_window=40),
    dict(logit_cap=0.7),
    dict(sliding_window=8, logit_cap=0.3),
]


@pytest.mark.parametrize(
    "features", FEATURES, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items())
)
@pytest.mark.parametrize(
    "specs", [DECODE, MIXED, JUMP_FORWARD, LONG], ids=["decode", "mixed", "jump", "long"]
)
def test_sliding_window_and_logit_cap_match_reference(specs, features):
    """Windows shorter and longer than the contexts, caps that bend the scores: the kernel rows,
    the SDPA rows (LONG) and torch_native with and without its mirror, against float64."""
    case = make_case(specs, 2, 32, torch.float32, heads=6, max_context=256, capacity=1200, seed=11)
    expected = reference(case, **features)
    backend = bound(CpuBackend(paged_attention), case)
    torch.testing.assert_close(
        run(backend, case, **features).double(), expected, rtol=1e-5, atol=1e-5
    )
    for mirror in (True, False):
        got = run(TorchNativeBackend(use_mirror=mirror), case, **features)
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_bf16_pool_with_window_and_cap():
    case = make_case(MIXED, 2, 64, torch.bfloat16, heads=4, max_context=256, capacity=1200, seed=12)
    expected = reference(case, sliding_window=6, logit_cap=0.5)
    got = run(bound(CpuBackend(paged_attention), case), case, sliding_window=6, logit_cap=0.5)
    torch.testing.assert_close(got.double(), expected, rtol=2e-2, atol=2e-2)


def test_random_batches_match_reference():
    """Random mixes of decodes, short extends over cached prefixes and fresh prompts."""
    rng = random.Random(7)
    for seed in range(6):
        specs = [
            (
                rng.choice([0, rng.randint(1, 150)]),
                rng.choice([1, 1, 1, rng.randint(2, 12), rng.randint(13, 80)]),
            )
            for _ in range(rng.randint(1, 12))
        ]
        case = make_case(
            specs, 3, 64, torch.float32, seed=seed, heads=9, max_context=256, capacity=3000
        )
        expected = reference(case)
        got = run(bound(CpuBackend(paged_attention), case), case)
        torch.testing.assert_close(
            got.double(), expected, rtol=1e-5, atol=1e-5, msg=lambda m, specs=specs: f"{specs}: {m}"
        )


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 8e-3), (torch.float16, 1e-3)])
@pytest.mark.parametrize("specs", [DECODE, MIXED, JUMP_FORWARD, LONG])
def test_half_precision_pools_run_in_the_kernel(specs, dtype, tol):
    """bf16 / fp16 KV: the kernel widens K/V to float32 as it reads them, so against the
    float64 reference on the same (rounded) values the only error left is the output's
    rounding to the pool dtype (2^-8 relative for bf16, 2^-11 for fp16, on outputs of
    magnitude ~1) and the long rows' SDPA in that dtype."""
    case = make_case(specs, 2, 64, dtype, heads=6)
    backend = bound(CpuBackend(paged_attention), case)
    assert backend.uses_kernel
    got = run(backend, case)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), reference(case), rtol=tol, atol=tol)


def test_unsupported_head_dims_take_the_torch_path():
    """A head_dim the kernel lacks: the backend is torch_native, with its tolerance."""
    from sgl.runtime.attention import backend_name

    case = make_case(MIXED, 2, 24, torch.float32)
    backend = bound(CpuBackend(paged_attention), case)
    assert not backend.uses_kernel and backend_name(backend) == "torch_native"
    torch.testing.assert_close(run(backend, case).double(), reference(case), rtol=1e-5, atol=1e-5)


def test_kernel_checks_its_inputs():
    case = make_case(DECODE, 2, 64, torch.float32)
    pool, table = case.batch.kv_pool, case.batch.req_to_token.req_to_token
    q = case.q.contiguous()
    ok = torch.tensor([[case.batch.req_rows[0], 0, 1, 1]])
    paged_attention(q, pool.k_buffers[0], pool.v_buffers[0], table, ok, 0.125)
    bad_rows = {
        "table row": [[table.shape[0], 0, 1, 1]],
        "past the table": [[0, 0, 1, table.shape[1] + 1]],
        "more queries than keys": [[0, 0, 3, 2]],
        "past the queries": [[0, len(q), 1, 1]],
    }
    for rows in bad_rows.values():
        with pytest.raises(RuntimeError, match="out of range"):
            paged_attention(
                q, pool.k_buffers[0], pool.v_buffers[0], table, torch.tensor(rows), 0.125
            )
    table[case.batch.req_rows[0], 0] = pool.k_buffers[0].shape[0]  # a slot past the pool
    with pytest.raises(RuntimeError, match="outside the KV pool"):
        paged_attention(q, pool.k_buffers[0], pool.v_buffers[0], table, ok, 0.125)
    with pytest.raises(RuntimeError, match="float32 queries"):
        paged_attention(q.double(), pool.k_buffers[0], pool.v_buffers[0], table, ok, 0.125)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        paged_attention(q, pool.k_buffers[0], pool.v_buffers[0].bfloat16(), table, ok, 0.125)
    with pytest.raises(RuntimeError, match="head_dim 48"):
        k48 = torch.zeros(pool.k_buffers[0].shape[0], 2, 48)
        paged_attention(torch.zeros(len(q), 4, 48), k48, k48, table, ok, 0.125)
    with pytest.raises(RuntimeError, match="multiple of kv heads"):
        paged_attention(
            torch.zeros(len(q), 3, 64), pool.k_buffers[0], pool.v_buffers[0], table, ok, 0.125
        )


# ---------------------------------------------------------------------------- end to end

VOCAB = 200


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tiny_models import save_tiny_engine_dir

    return save_tiny_engine_dir(tmp_path_factory.mktemp("tiny-llama-cpu"), VOCAB)


def test_engine_greedy_tokens_equal_hf(tiny_dir):
    """Through the engine (prefill chunks longer than the kernel takes, radix-cache prefix
    hits, mixed steps): greedy tokens equal HF transformers' generate."""
    import sgl

    path, hf = tiny_dir
    rng = random.Random(0)
    shared = [rng.randrange(1, VOCAB) for _ in range(30)]
    batch = [shared + [rng.randrange(1, VOCAB) for _ in range(n)] for n in (5, 90, 1)]
    batch += [[rng.randrange(1, VOCAB) for _ in range(n)] for n in (3, 120)]
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    with sgl.Engine(
        model_path=str(path), dtype="float32", max_total_tokens=4096, chunked_prefill_size=100
    ) as engine:
        assert (
            engine.get_server_info()["attention_backend"] == "cpu"
        )  # the kernel runs (head_dim 16)
        engine.generate(input_ids=batch[:1], sampling_params=params)  # the shared prefix is cached
        outs = engine.generate(input_ids=batch, sampling_params=params)
    for ids, out in zip(batch, outs):
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0
            )
        assert out["output_ids"] == want[0, len(ids) :].tolist()


@pytest.mark.parametrize(
    "dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 8e-3), (torch.float16, 1e-3)]
)
def test_prefill_chunks_after_cached_prefixes_match_reference(dtype, tol):
    """Long rows over a cached prefix (attended as a prefix block and a causal block merged by
    their log-sum-exps): prefixes shorter, equal to and longer than the chunk, one key of prefix."""
    specs = [(1, 70), (300, 120), (97, 97), (20, 400), (0, 1)]
    case = make_case(specs, 3, 64, dtype, heads=9, max_context=512, capacity=1500, seed=5)
    expected = reference(case)
    for backend in (bound(CpuBackend(paged_attention), case), TorchNativeBackend(use_mirror=False)):
        got = run(backend, case)
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- the prefill kernel

from sgl.runtime.attention.cpu_kernel import load_prefill_attention  # noqa: E402
from sgl.runtime.cpu_features import cpu_flags  # noqa: E402

needs_prefill_kernel = pytest.mark.skipif(
    not {"avx512f", "avx512_bf16"} <= cpu_flags(),
    reason="the prefill kernel needs AVX512-BF16 (this CPU lacks it)",
)


class CountingOp:
    """The prefill op, counting its calls: shows which rows took it."""

    def __init__(self, op) -> None:
        self.op, self.calls = op, 0

    def __call__(self, *args):
        self.calls += 1
        return self.op(*args)


@needs_prefill_kernel
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (8, 8, 128), (4, 2, 32)])
def test_prefill_kernel_matches_reference(heads, kv_heads, head_dim):
    """Prefill chunks (rows over KERNEL_MAX_EXTEND new tokens) of a bf16 pool through the prefill
    kernel: query blocks of 32 and key blocks of 64 cut at every offset (chunks of 65-300 new
    tokens after no prefix, 1 key, and prefixes shorter and longer than the chunk), beside
    decode rows in the paged kernel; float64 oracle."""
    op = load_prefill_attention()
    assert op is not None  # AVX512-BF16 and a compiler: the kernel must build
    specs = [(0, 65), (1, 70), (300, 120), (97, 97), (0, 1), (33, 300), (64, 128), (20, 1)]
    case = make_case(
        specs,
        kv_heads,
        head_dim,
        torch.bfloat16,
        heads=heads,
        max_context=512,
        capacity=2000,
        seed=7,
    )
    counting = CountingOp(op)
    got = run(bound(CpuBackend(paged_attention, counting), case), case)
    assert counting.calls == sum(e > KERNEL_MAX_EXTEND for _, e in specs)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), reference(case), rtol=8e-3, atol=8e-3)


@needs_prefill_kernel
def test_prefill_kernel_leaves_window_cap_and_float_pools_to_sdpa():
    """Sliding-window or soft-capped layers and float32 pools are not the prefill kernel's:
    those rows take SDPA and still match the oracle."""
    counting = CountingOp(load_prefill_attention())
    case = make_case(LONG, 2, 64, torch.bfloat16, heads=4, seed=3)
    for features in (dict(sliding_window=5), dict(logit_cap=0.7)):
        got = run(bound(CpuBackend(paged_attention, counting), case), case, **features)
        torch.testing.assert_close(got.double(), reference(case, **features), rtol=8e-3, atol=8e-3)
    case = make_case(LONG, 2, 64, torch.float32, heads=4, seed=3)
    got = run(bound(CpuBackend(paged_attention, counting), case), case)
    torch.testing.assert_close(got.double(), reference(case), rtol=1e-5, atol=1e-5)
    assert counting.calls == 0


@needs_prefill_kernel
def test_prefill_kernel_checks_its_inputs():
    op = load_prefill_attention()
    q, k = torch.zeros(4, 4, 64, dtype=torch.bfloat16), torch.zeros(6, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="bfloat16"):
        op(q.float(), k, k, 0.125)
    with pytest.raises(RuntimeError, match="keys .* >= queries"):
        op(q, k[:3], k[:3], 0.125)
    with pytest.raises(RuntimeError, match="multiple of kv heads"):
        op(
            q,
            torch.zeros(6, 3, 64, dtype=torch.bfloat16),
            torch.zeros(6, 3, 64, dtype=torch.bfloat16),
            0.125,
        )
    with pytest.raises(RuntimeError, match="head_dim 48"):
        op(q[..., :48], k[..., :48], k[..., :48], 0.125)
