"""The Triton attention backend, run on CPU by Triton's interpreter.

Oracles: a float64 softmax(QK^T * scale + causal mask) V in plain torch, and the torch_native
backend on the same pool. The kernels run interpreted (numpy, one program at a time), so
shapes and tiles stay tiny; on a GPU the same kernels compile (the last test checks that
they compile for sm_90 without a GPU).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import importlib  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip(
    "triton", reason="triton is not installed (the `test` extra pins it on Linux)"
)

from sgl.runtime.attention import ForwardBatch, triton_kernels  # noqa: E402
from sgl.runtime.attention.torch_native import TorchNativeBackend  # noqa: E402
from sgl.runtime.attention.triton_backend import TritonBackend, TritonMetadata  # noqa: E402

if type(triton_kernels.extend_kernel).__name__ != "InterpretedFunction":
    # Imported earlier without the interpreter (e.g. by another test): decorate the kernels again.
    importlib.reload(triton_kernels)

from attention_cases import MAX_CONTEXT, TOL, make_case, reference, run  # noqa: E402
from triton_compile import assert_compiles_for_sm90  # noqa: E402

DECODE = [(0, 1), (36, 1), (99, 1), (7, 1), (16, 1)]  # includes extend 1 with prefix 0
PREFILL = [(0, 37), (0, 5), (0, 1)]
MIXED = [(20, 17), (45, 1), (0, 1), (0, 23), (63, 3), (31, 16)]  # prefix hits, decodes, prefills


@pytest.mark.parametrize(
    "specs,kv_heads,head_dim,dtype",
    [
        (DECODE, 2, 32, torch.float32),
        (DECODE, 1, 64, torch.float32),
        (DECODE, 4, 24, torch.float32),  # no GQA; head_dim not a power of two
        (PREFILL, 2, 16, torch.float32),
        (MIXED, 2, 32, torch.float32),
        (MIXED, 1, 16, torch.float32),
        (MIXED, 4, 24, torch.float32),
        (DECODE, 2, 32, torch.bfloat16),
        (MIXED, 1, 64, torch.bfloat16),
        (MIXED, 2, 16, torch.float16),
    ],
    ids=lambda x: x if isinstance(x, (int, torch.dtype)) else None,
)
def test_matches_float64_reference_and_torch_native(specs, kv_heads, head_dim, dtype):
    case = make_case(specs, kv_heads, head_dim, dtype)
    expected = reference(case)  # before the backend writes the new K/V into the pool
    got = run(TritonBackend(num_kv_splits=4), case)
    assert got.dtype == dtype and got.shape == case.q.shape
    torch.testing.assert_close(got.double(), expected, **TOL[dtype])
    # The new tokens' K/V landed in their slots.
    pool, loc = case.batch.kv_pool, case.batch.out_cache_loc
    assert torch.equal(pool.k_buffers[0][loc], case.k) and torch.equal(
        pool.v_buffers[0][loc], case.v
    )

    native = run(TorchNativeBackend(), case)
    torch.testing.assert_close(got.double(), native.double(), **TOL[dtype])


@pytest.mark.parametrize(
    "features",
    [
        dict(sliding_window=1),
        dict(sliding_window=6),
        dict(sliding_window=50),
        dict(logit_cap=0.7),
        dict(sliding_window=9, logit_cap=0.3),
    ],
    ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()),
)
@pytest.mark.parametrize("specs", [DECODE, MIXED], ids=["decode", "mixed"])
def test_sliding_window_and_logit_cap_match_reference(specs, features):
    """Windows that empty whole key blocks and decode splits (rows must stay NaN-free) and caps."""
    case = make_case(specs, 2, 32, torch.float32, seed=5)
    expected = reference(case, **features)
    got = run(TritonBackend(num_kv_splits=4), case, **features)
    torch.testing.assert_close(got.double(), expected, **TOL[torch.float32])


def test_decode_metadata_and_split_counts():
    """A decode step takes the split-K path; the split count changes nothing but rounding."""
    case = make_case(DECODE, 2, 32, torch.float32, seed=3)
    expected = reference(case)
    backend = TritonBackend(num_kv_splits=1)
    backend.init_forward_metadata(case.batch)
    md: TritonMetadata = case.batch.metadata
    assert md.is_decode and md.prefix_lens is None
    assert (
        md.seq_lens.tolist() == [p + 1 for p, _ in DECODE]
        and md.req_rows.tolist() == case.batch.req_rows
    )
    for splits in (1, 2, 8):
        got = run(TritonBackend(num_kv_splits=splits, block_n=32), case)
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="power of two"):
        TritonBackend(num_kv_splits=3)


def test_extend_metadata():
    case = make_case(MIXED, 2, 16, torch.float32)
    TritonBackend().init_forward_metadata(case.batch)
    md: TritonMetadata = case.batch.metadata
    assert not md.is_decode and md.max_extend_len == 23
    assert md.prefix_lens.tolist() == [p for p, _ in MIXED] and md.extend_lens.tolist() == [
        e for _, e in MIXED
    ]
    assert md.qo_start.tolist() == [0, 17, 18, 19, 42, 45]
    assert md.seq_lens.tolist() == [p + e for p, e in MIXED]


def test_cuda_graph_hooks_replay_fresh_metadata():
    """What a graph runner does: static buffers, capture-time views, replay copies into them."""
    backend = TritonBackend(num_kv_splits=4)
    backend.init_cuda_graph_state(max_bs=8, max_context_len=MAX_CONTEXT, device="cpu")
    bs = len(DECODE)
    captured = backend.init_forward_metadata_capture(bs)
    assert captured.from_graph_buffers and captured.batch_size == bs

    # Replay the same batch size for two different batches; the metadata the launches read
    # must equal what init_forward_metadata builds, and so must the outputs.
    for seed, specs in ((1, DECODE), (2, [(50, 1), (3, 1), (0, 1), (88, 1), (12, 1)])):
        case = make_case(specs, 2, 32, torch.float32, seed=seed)
        eager = TritonBackend(num_kv_splits=4)
        want = run(eager, make_case(specs, 2, 32, torch.float32, seed=seed))
        backend.init_forward_metadata_replay(
            bs, case.batch.req_rows, torch.tensor(case.batch.seq_lens)
        )
        assert captured.req_rows.tolist() == case.batch.req_rows
        assert captured.seq_lens.tolist() == case.batch.seq_lens
        case.batch.attn_backend, case.batch.metadata = backend, captured
        got = backend.forward(case.q, case.k, case.v, 0, case.scale, case.batch)
        assert torch.equal(got, want)
    scratch = backend.graph_state.part_out.data_ptr()

    # A smaller real batch padded to the captured size: padding rows are row 0, length 1.
    specs = [(40, 1), (9, 1), (70, 1)]
    case = make_case(specs, 2, 32, torch.float32, seed=4)
    want = reference(case)
    backend.init_forward_metadata_replay(bs, case.batch.req_rows, case.batch.seq_lens)
    assert captured.req_rows.tolist() == case.batch.req_rows + [0, 0]
    assert captured.seq_lens.tolist() == case.batch.seq_lens + [1, 1]
    pad = bs - len(specs)
    q = torch.cat([case.q, torch.zeros(pad, *case.q.shape[1:])])
    k = torch.cat([case.k, torch.zeros(pad, *case.k.shape[1:])])
    v = torch.cat([case.v, torch.zeros(pad, *case.v.shape[1:])])
    case.batch.out_cache_loc = torch.cat(
        [case.batch.out_cache_loc, torch.zeros(pad, dtype=torch.int64)]
    )  # padding slot
    case.batch.metadata = captured
    got = backend.forward(q, k, v, 0, case.scale, case.batch)
    torch.testing.assert_close(got[: len(specs)].double(), want, rtol=1e-5, atol=1e-5)
    assert (
        backend.graph_state.part_out.data_ptr() == scratch
    )  # captured launches keep their buffers

    with pytest.raises(ValueError, match="max_bs"):
        backend.init_forward_metadata_capture(9)
    with pytest.raises(RuntimeError, match="init_cuda_graph_state"):
        TritonBackend().init_forward_metadata_replay(1, [0], [1])


# ---------------------------------------------------------------------------- end to end

VOCAB = 200


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tiny_models import save_tiny_engine_dir

    path, _ = save_tiny_engine_dir(tmp_path_factory.mktemp("tiny-llama-triton"), VOCAB)
    return path, VOCAB


class RecordingTritonBackend(TritonBackend):
    """Notes which kinds of step ran: decode, extend over a cached prefix, decodes in an extend."""

    kinds: set[str] = set()

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        super().init_forward_metadata(batch)
        if batch.metadata.is_decode:
            self.kinds.add("decode")
        else:
            if any(p > 0 and e > 1 for p, e in zip(batch.prefix_lens, batch.extend_lens)):
                self.kinds.add("extend over prefix")
            if 1 in batch.extend_lens:
                self.kinds.add("mixed")


def greedy(
    path,
    monkeypatch,
    backend_factory,
    prompts_in_order: list[list[list[int]]],
    graph_max_bs: int = 0,
) -> list[tuple[list[int], int]]:
    """(output ids, cached tokens) for each prompt; each inner list is one generate call.
    `graph_max_bs` > 0 sends decode steps through the CUDA-graph runner (on CPU it runs the
    same static buffers and hooks without capturing)."""
    import sgl
    import sgl.runtime.model_runner as runner_mod

    if backend_factory is not None:
        monkeypatch.setattr(
            runner_mod,
            "create_attention_backend",
            lambda name, device, dtype=None, needs=frozenset(): backend_factory(),
        )
    if graph_max_bs:
        monkeypatch.setattr(runner_mod, "cuda_graph_max_bs", lambda cfg, device: graph_max_bs)
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    results = []
    with sgl.Engine(
        model_path=str(path),
        dtype="float32",
        max_total_tokens=2048,
        chunked_prefill_size=16,
        attention_backend="auto" if backend_factory else "torch_native",
    ) as engine:
        assert (engine.get_server_info()["attention_backend"] == TritonBackend.name) == (
            backend_factory is not None
        )
        for batch in prompts_in_order:
            for out in engine.generate(input_ids=batch, sampling_params=params):
                results.append((out["output_ids"], out["meta_info"]["cached_tokens"]))
        graph_steps = engine.get_server_info()["cuda_graph_steps"]
    assert (graph_steps > 0) == bool(graph_max_bs)
    monkeypatch.undo()
    return results


def test_engine_greedy_tokens_match_torch_native(tiny_dir, monkeypatch):
    """Prefill (chunked at 16 tokens), radix-cache prefix hits, mixed and pure decode steps."""
    path, vocab = tiny_dir
    rng = random.Random(0)
    shared = [rng.randrange(1, vocab) for _ in range(21)]
    prompts = [
        [
            shared + [rng.randrange(1, vocab) for _ in range(5)],
            [rng.randrange(1, vocab) for _ in range(9)],
        ],
        [
            shared + [rng.randrange(1, vocab) for _ in range(3)],
            [rng.randrange(1, vocab) for _ in range(1)],
        ],
    ]
    want = greedy(path, monkeypatch, None, prompts)
    RecordingTritonBackend.kinds.clear()
    got = greedy(path, monkeypatch, RecordingTritonBackend, prompts)
    assert RecordingTritonBackend.kinds == {"decode", "extend over prefix", "mixed"}
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    assert got[2][1] >= len(shared) - 1  # the second call's first prompt reused the shared prefix
    assert all(len(ids) == 8 for ids, _ in got)


def test_graph_runner_with_triton_hooks_matches_torch_native(tiny_dir, monkeypatch):
    """Decode steps through the CUDA-graph runner's static buffers and the Triton hooks
    (capture, then replay per step, padded to the captured sizes) give torch_native's tokens."""
    path, vocab = tiny_dir
    rng = random.Random(3)
    prompts = [[[rng.randrange(1, vocab) for _ in range(rng.randint(2, 20))] for _ in range(3)]]
    want = greedy(path, monkeypatch, None, prompts)
    got = greedy(path, monkeypatch, TritonBackend, prompts, graph_max_bs=4)
    assert [ids for ids, _ in got] == [ids for ids, _ in want]


def test_kernels_compile_for_sm90(tmp_path):
    """Interpreted kernels are not compiled ones: compile them for an H100/H200 target, no GPU
    needed."""
    script = textwrap.dedent(
        """
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from sgl.runtime.attention import triton_kernels as tk

        def compile(fn, ptrs, consts, **options):
            floats = ("sm_scale", "logit_cap")
            sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n in floats else "i32")
                   for n in fn.arg_names}
            triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32),
                           options=options)

        i32 = "*i32"
        for ty, dot_dtype, precision, head_dim, group, features in (
                ("*bf16", tl.bfloat16, "tf32", 128, 4, False),
                ("*bf16", tl.bfloat16, "tf32", 128, 4, True),
                ("*fp32", tl.float32, "ieee", 64, 1, False)):
            dot = dict(DOT_DTYPE=dot_dtype, DOT_PRECISION=precision, USE_WINDOW=features,
                       USE_CAP=features)
            dims = dict(HEAD_DIM=head_dim, BLOCK_D=head_dim)
            compile(tk.decode_split_kernel,
                    dict(Q=ty, K_buf=ty, V_buf=ty, Req_to_token="*i64", Req_rows=i32, Seq_lens=i32,
                         Part_out="*fp32", Part_lse="*fp32"),
                    dict(GROUP=group, BLOCK_H=16, BLOCK_N=64, NUM_SPLITS=8, **dims, **dot),
                    num_warps=4)
            # no features here: the splits are combined as before
            compile(tk.decode_reduce_kernel, dict(Part_out="*fp32", Part_lse="*fp32", Out=ty),
                    dict(NUM_SPLITS=8, **dims), num_warps=4)
            compile(tk.extend_kernel,
                    dict(Q=ty, K_new=ty, V_new=ty, Out=ty, K_buf=ty, V_buf=ty, Req_to_token="*i64",
                         Req_rows=i32, Prefix_lens=i32, Extend_lens=i32, Qo_start=i32),
                    dict(GROUP=group, BLOCK_M=64, BLOCK_N=32, **dims, **dot),
                    num_warps=4, num_stages=2)
        print("compiled")
        """
    )
    assert_compiles_for_sm90(script, tmp_path)


def test_runtime_imports_without_triton():
    """Only the triton backend needs triton; without it, it says how to get it."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None  # what a machine without triton looks like to `import`
        import sgl.runtime, sgl.runtime.attention
        try:
            import sgl.runtime.attention.triton_backend
        except ImportError as e:
            assert "pip install triton" in str(e), e
            print("clear error")
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "clear error" in proc.stdout, proc.stderr[-3000:]
