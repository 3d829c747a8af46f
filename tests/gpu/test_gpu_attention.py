"""Each attention backend on the GPU against a float64 reference: decode, fresh prefill, prefix
hits mixed with decodes, ragged lengths, K/V at scattered pool slots; and each backend's
CUDA-graph hooks, captured and replayed, against its eager decode."""

from __future__ import annotations

import pytest
import torch
from graph_test_backend import DenseDecodeBackend

import sgl.runtime.attention as attn
from sgl.runtime.attention import ForwardBatch, create_attention_backend, supports_cuda_graph
from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 128
TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-5}
# (prefix lengths, extend lengths) per request
CASES = {
    "decode": ([1, 7, 33, 300], [1, 1, 1, 1]),
    "fresh_prefill": ([0, 0, 0, 0], [1, 5, 17, 130]),
    "prefix_hits": ([12, 0, 40, 64, 5], [9, 3, 20, 1, 1]),
    "one_token_prompts": ([0, 0], [1, 1]),
    "long_chunk": ([700], [257]),
}
BACKENDS = ["torch_native", "triton", "flashinfer"]
DTYPES = [torch.bfloat16, torch.float32]


def make_backend(name: str, dtype: torch.dtype):
    if name == "dense_test":
        return DenseDecodeBackend()
    if name == "triton" and not attn.triton_available():
        pytest.skip("the triton backend is not installed")
    if name == "flashinfer":
        if not attn.flashinfer_available():
            pytest.skip("flashinfer is not installed")
        if dtype == torch.float32:
            pytest.skip("flashinfer has no float32 kernels")
    return create_attention_backend(name, "cuda", dtype)


class Setup:
    """A one-layer pool and table holding each request's prefix K/V at scattered slots."""

    def __init__(
        self, backend, dtype: torch.dtype, prefix: list[int], ext: list[int], extra_rows: int = 0
    ) -> None:
        self.pool = TokenToKVPool(8192, 1, KV_HEADS, HEAD_DIM, dtype, "cuda")
        self.table = ReqToTokenPool(len(prefix) + extra_rows + 1, 2048, "cuda")
        self.backend = backend
        backend.bind(self.pool, self.table, HEADS)
        self.dtype, self.prefix, self.ext = dtype, prefix, ext
        self.rows, new_slots = [], []
        for p, e in zip(prefix, ext):
            row = self.table.alloc()
            slots = self.pool.alloc(p + e)
            slots = slots[torch.randperm(len(slots))]
            self.table.write(row, 0, slots)
            if p:
                pre = slots[:p].cuda()
                self.pool.k_buffers[0][pre] = torch.randn(p, KV_HEADS, HEAD_DIM, device="cuda").to(
                    dtype
                )
                self.pool.v_buffers[0][pre] = torch.randn(p, KV_HEADS, HEAD_DIM, device="cuda").to(
                    dtype
                )
            self.rows.append(row)
            new_slots.append(slots[p:])
        self.out_cache_loc = torch.cat(new_slots).cuda()
        t = sum(ext)
        self.q = torch.randn(t, HEADS, HEAD_DIM, device="cuda").to(dtype)
        self.k = torch.randn(t, KV_HEADS, HEAD_DIM, device="cuda").to(dtype)
        self.v = torch.randn(t, KV_HEADS, HEAD_DIM, device="cuda").to(dtype)

    def batch(self) -> ForwardBatch:
        t = sum(self.ext)
        return ForwardBatch(
            input_ids=torch.zeros(t, dtype=torch.int64, device="cuda"),
            positions=torch.zeros(t, dtype=torch.int64, device="cuda"),
            out_cache_loc=self.out_cache_loc,
            req_rows=self.rows,
            prefix_lens=self.prefix,
            extend_lens=self.ext,
            kv_pool=self.pool,
            req_to_token=self.table,
            attn_backend=self.backend,
            row_epochs=[self.table.epochs[r] for r in self.rows],
        )

    def eager(self) -> torch.Tensor:
        b = self.batch()
        self.backend.init_forward_metadata(b)
        return self.backend.forward(self.q, self.k, self.v, 0, HEAD_DIM**-0.5, b)

    def reference(self) -> torch.Tensor:
        """float64 causal attention of each request's queries over its whole row (from the pool)."""
        outs, start = [], 0
        group = HEADS // KV_HEADS
        for row, p, e in zip(self.rows, self.prefix, self.ext):
            slots = self.table.req_to_token[row, : p + e]
            kk = self.pool.k_buffers[0][slots].double().repeat_interleave(group, dim=1)  # [S, H, D]
            vv = self.pool.v_buffers[0][slots].double().repeat_interleave(group, dim=1)
            qq = self.q[start : start + e].double()
            scores = torch.einsum("qhd,khd->hqk", qq, kk) * HEAD_DIM**-0.5
            allowed = (
                torch.arange(p + e, device="cuda")[None, :]
                <= (p + torch.arange(e, device="cuda"))[:, None]
            )
            scores = scores.masked_fill(~allowed, float("-inf"))
            outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv))
            start += e
        return torch.cat(outs)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKENDS)
def test_backend_matches_float64_reference(name, dtype, case):
    torch.manual_seed(0)
    s = Setup(make_backend(name, dtype), dtype, *CASES[case])
    out = s.eager()
    assert out.shape == s.q.shape
    assert torch.equal(s.pool.k_buffers[0][s.out_cache_loc], s.k)  # the new K/V went to their slots
    assert torch.equal(s.pool.v_buffers[0][s.out_cache_loc], s.v)
    err = rel_err(out, s.reference())
    assert err < TOL[dtype], f"{name} {dtype} {case}: relative error {err:.3g}"


@pytest.mark.parametrize("bs", [1, 5])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["dense_test", "triton", "flashinfer"])
def test_cuda_graph_hooks_match_eager_decode(name, dtype, bs):
    """Capture the backend's decode forward at a padded size of 8 over static buffers, then
    replay it for `bs` real rows (the rest padding) and compare with the eager decode."""
    torch.manual_seed(1)
    backend = make_backend(name, dtype)
    if not supports_cuda_graph(backend):
        pytest.skip(f"{name} offers no CUDA-graph hooks")
    size = 8
    prefix = [3, 40, 1, 250, 17][:bs]
    s = Setup(backend, dtype, prefix, [1] * bs, extra_rows=1)
    eager = s.eager()
    ref = s.reference()
    padding_row = s.table.alloc()  # never written: zeros, i.e. the padding slot 0

    rows = torch.full((size,), padding_row, dtype=torch.int64, device="cuda")
    lens = torch.ones(size, dtype=torch.int32, device="cuda")
    loc = torch.zeros(size, dtype=torch.int64, device="cuda")
    q = torch.zeros(size, HEADS, HEAD_DIM, dtype=dtype, device="cuda")
    k = torch.zeros(size, KV_HEADS, HEAD_DIM, dtype=dtype, device="cuda")
    v = torch.zeros_like(k)
    backend.init_cuda_graph_state(size, s.table.max_context_len)
    md = backend.init_forward_metadata_capture(size, rows, lens)
    gbatch = ForwardBatch(
        input_ids=torch.zeros(size, dtype=torch.int64, device="cuda"),
        positions=torch.zeros(size, dtype=torch.int64, device="cuda"),
        out_cache_loc=loc,
        req_rows=[padding_row]
        * size,  # placeholders: inside a graph backends read the hook buffers
        prefix_lens=[0] * size,
        extend_lens=[1] * size,
        kv_pool=s.pool,
        req_to_token=s.table,
        attn_backend=backend,
        metadata=md,
    )
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        backend.forward(q, k, v, 0, HEAD_DIM**-0.5, gbatch)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = backend.forward(q, k, v, 0, HEAD_DIM**-0.5, gbatch)

    rows[:bs] = torch.tensor(s.rows, device="cuda")
    lens[:bs] = torch.tensor([p + 1 for p in prefix], dtype=torch.int32, device="cuda")
    loc[:bs] = s.out_cache_loc
    q[:bs], k[:bs], v[:bs] = s.q, s.k, s.v
    backend.init_forward_metadata_replay(size, rows, lens)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out[:bs], ref) < TOL[dtype]
    assert rel_err(out[:bs], eager.double()) < TOL[dtype]
    assert torch.equal(s.pool.k_buffers[0][s.out_cache_loc], s.k)
