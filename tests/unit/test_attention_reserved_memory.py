"""`reserved_memory_bytes`: what a backend may hold beyond the KV pool, for the memory plan.
torch_native's decode mirror is driven through resizes up to its worst case, counting every
mirror tensor alive at once, and must stay within the reported bound."""

from __future__ import annotations

import shutil
import weakref

import pytest
import torch

import sgl.runtime.attention.torch_native as tn
from sgl.runtime.attention import AttentionBackend, ForwardBatch
from sgl.runtime.attention.cpu_backend import CpuBackend
from sgl.runtime.attention.torch_native import MIRROR_MAX_BYTES, TorchNativeBackend
from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool

EMBEDDED = dict(num_kv_heads=3, head_dim=64, num_layers=30)  # the embedded model's shape
LAYERS, KV_HEADS, HEADS, HEAD_DIM = 2, 1, 2, 16  # small, for the driven cases: 256 B per token


class CountingTorch:
    """`torch` for torch_native's module, counting the bytes of live tensors made by zeros
    (the mirror's only allocation) and their peak."""

    def __init__(self) -> None:
        self.live = self.peak = 0

    def __getattr__(self, name):
        return getattr(torch, name)

    def zeros(self, *args, **kwargs):
        t = torch.zeros(*args, **kwargs)
        n = t.numel() * t.element_size()
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(t, self._free, n)
        return t

    def _free(self, n: int) -> None:
        self.live -= n


class Driver:
    """Decode/extend steps over one pool: requests keep their rows and slots across steps."""

    def __init__(self, backend, capacity: int, dtype=torch.float32) -> None:
        self.backend = backend
        self.pool = TokenToKVPool(capacity, LAYERS, KV_HEADS, HEAD_DIM, dtype, "cpu")
        for buf in self.pool.k_buffers + self.pool.v_buffers:
            buf[1:] = torch.randn(buf[1:].shape).to(dtype)
        self.table = ReqToTokenPool(64, capacity, "cpu")
        self.lens: dict[int, int] = {}  # table row -> tokens in the pool

    def step(self, decodes: list[int], new: list[int]) -> list[int]:
        """One step: rows `decodes` decode a token, and fresh requests with `new` prompt lengths
        start."""
        rows, prefix, ext = list(decodes), [self.lens[r] for r in decodes], [1] * len(decodes)
        for n in new:
            rows.append(self.table.alloc())
            prefix.append(0)
            ext.append(n)
        loc = []
        for r, p, e in zip(rows, prefix, ext):
            slots = self.pool.alloc(e)
            assert slots is not None, "the pool is full"
            self.table.write(r, p, slots)
            self.lens[r] = p + e
            loc.append(slots)
        t = sum(ext)
        batch = ForwardBatch(
            input_ids=torch.zeros(t, dtype=torch.int64),
            positions=torch.zeros(t, dtype=torch.int64),
            out_cache_loc=torch.cat(loc), req_rows=rows, prefix_lens=prefix, extend_lens=ext,
            kv_pool=self.pool, req_to_token=self.table, attn_backend=self.backend,
            row_epochs=[self.table.epochs[r] for r in rows],
        )  # fmt: skip
        self.backend.init_forward_metadata(batch)
        q = torch.randn(t, HEADS, HEAD_DIM)
        k, v = torch.randn(t, KV_HEADS, HEAD_DIM), torch.randn(t, KV_HEADS, HEAD_DIM)
        for layer in range(LAYERS):
            out = self.backend.forward(q, k, v, layer, HEAD_DIM**-0.5, batch)
            assert torch.isfinite(out).all()
        return rows


def reserved(backend, capacity: int, dtype=torch.float32) -> int:
    return backend.reserved_memory_bytes(capacity, KV_HEADS, HEAD_DIM, LAYERS, dtype)


@pytest.fixture
def counting(monkeypatch) -> CountingTorch:
    c = CountingTorch()
    monkeypatch.setattr(tn, "torch", c)
    return c


def test_small_pool_bound_holds(counting):
    """A pool too small for the size cap: the bound comes from the pool; a long row, then
    many new rows (a row resize), fill it."""
    capacity = 40
    backend = TorchNativeBackend()
    bound = reserved(backend, capacity)
    assert 0 < bound < MIRROR_MAX_BYTES // 2
    d = Driver(backend, capacity)
    (a,) = d.step([], [30])
    d.step([a], [1] * 8)
    assert backend.mirror is not None and backend.mirror.row_capacity == 16
    assert 0 < counting.peak <= bound


def test_size_cap_bound_holds(counting, monkeypatch):
    """The mirror grown by resizes to the largest the size check admits (rows x length =
    MIRROR_MAX_BYTES / (2 x bytes per token)), then past it (dropped): the peak, a resize's old
    and new copies included, stays within the reported bound."""
    cap = 2 << 20  # 4096 tokens of mirror rows x length at 256 B per token
    monkeypatch.setattr(tn, "MIRROR_MAX_BYTES", cap)
    capacity = 4096
    backend = TorchNativeBackend()
    bound = reserved(backend, capacity)
    assert bound == cap // 2 + cap // 2 // LAYERS  # the pool alone would allow far more
    d = Driver(backend, capacity)
    rows = d.step([], [64] * 8)  # 8 rows x (64 + headroom) = 1024
    rows = d.step(rows, [64] * 16)  # 24 x 128
    rows = d.step(rows, [64] * 8)  # 32 x 128 = 4096: at the cap
    m = backend.mirror
    assert m is not None and m.row_capacity * m.len_capacity * d.pool.bytes_per_token * 2 == cap
    assert cap // 2 < counting.peak <= bound
    del m
    d.step(rows, [64] * 8)  # 40 rows: over the cap, the mirror is dropped
    assert backend.mirror is None and counting.live == 0
    assert counting.peak <= bound


def test_bounds_at_the_embedded_shape():
    backend = TorchNativeBackend()
    for dtype in (torch.float32, torch.bfloat16):
        bound = backend.reserved_memory_bytes(100_000, dtype=dtype, **EMBEDDED)
        assert bound == MIRROR_MAX_BYTES // 2 + -(
            -(MIRROR_MAX_BYTES // 2) // 30
        )  # 512 MiB + a layer's share
    assert (
        TorchNativeBackend(use_mirror=False).reserved_memory_bytes(
            100_000, dtype=torch.float32, **EMBEDDED
        )
        == 0
    )


class Plain(AttentionBackend):
    def init_forward_metadata(self, batch):
        pass

    def forward(self, q, k, v, layer_id, scaling, batch):
        return q


def test_default_is_nothing():
    assert Plain().reserved_memory_bytes(100_000, dtype=torch.float32, **EMBEDDED) == 0


def test_cpu_backend_reserves_only_without_its_kernel():
    cpu, native = CpuBackend(None), TorchNativeBackend()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):  # the kernel runs
        assert cpu.reserved_memory_bytes(100_000, dtype=dtype, **EMBEDDED) == 0
    for dtype, head_dim in ((torch.bfloat16, 48), (torch.float32, 24)):  # torch_native runs
        shape = dict(EMBEDDED, head_dim=head_dim)
        want = native.reserved_memory_bytes(100_000, dtype=dtype, **shape)
        assert cpu.reserved_memory_bytes(100_000, dtype=dtype, **shape) == want > 0


@pytest.mark.skipif(
    not (shutil.which("c++") or shutil.which("g++")), reason="no C++ compiler for the CPU kernel"
)
def test_cpu_kernel_path_allocates_no_mirror(counting):
    """Decodes, short extends and a row too long for the kernel: nothing is kept beyond the pool."""
    from sgl.runtime.attention.cpu_kernel import load_paged_attention

    backend = CpuBackend(load_paged_attention())
    d = Driver(backend, 2048)
    backend.bind(d.pool, d.table, HEADS)
    assert backend.uses_kernel and reserved(backend, 2048) == 0
    rows = d.step([], [100, 5, 1])
    d.step(rows, [3, 90])
    assert counting.peak == 0
