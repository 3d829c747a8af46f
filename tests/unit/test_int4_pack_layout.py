"""torch's CPU int4 pack layouts (sgl/runtime/model/quant.py Int4PackLayout, int4_pack_layout).

torch packs int4 codes for the matmul kernel of the CPU capability it runs: blocks of 64 rows
on AVX-512, of 32 on AVX2, adjacent row pairs on neither. Each layout is held here to a literal
transcription of torch's packing loops, whatever this machine's CPU is. The layout torch
writes in this process is held to torch itself, and so is a second one, forced in a
subprocess with ATEN_CPU_CAPABILITY.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sgl.runtime.model import quant
from sgl.runtime.model.quant import INT4_PACK_LAYOUTS, int4_pack_layout, pack_int4, unpack_int4

LAYOUTS = {layout.name: layout for layout in INT4_PACK_LAYOUTS}
REPO = Path(__file__).resolve().parents[2]


def _torch_pack_loops(codes: torch.Tensor, capability: str) -> torch.Tensor:
    """torch 2.13's weight_to_int4pack_kernel (aten/src/ATen/native/cpu/int4mm_kernel.cpp),
    transcribed loop for loop for whole blocks: one branch per CPU capability (avx512, avx2,
    default). This is the reference each layout is checked against."""
    n, k = codes.shape
    src = codes.tolist()
    block_n = 64 if capability == "avx512" else 32
    assert n % block_n == 0
    dst = [0] * (n * k // 2)
    for i in range(n // block_n):
        base, row = i * k * block_n // 2, i * block_n
        for kk in range(k):
            if capability == "avx512":
                for d in range(16):
                    v0, v1, v2, v3 = (src[row + d + off][kk] for off in (0, 16, 32, 48))
                    dst[base + kk * 32 + d] = (v2 << 4) | v0
                    dst[base + kk * 32 + 16 + d] = (v3 << 4) | v1
            elif capability == "avx2":
                for d in range(16):
                    dst[base + kk * 16 + d] = (src[row + d + 16][kk] << 4) | src[row + d][kk]
            else:
                for nn in range(0, block_n, 2):
                    dst[base + kk * block_n // 2 + nn // 2] = (src[row + nn + 1][kk] << 4) | src[
                        row + nn
                    ][kk]
    return torch.tensor(dst, dtype=torch.uint8).reshape(n, k // 2)


def _codes(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randint(
        0, 16, (n, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


def test_the_probe_tells_every_layout_apart():
    """int4_pack_layout relies on this: the probe packed in any one layout reads back to its
    codes in that layout and in no other."""
    probe = quant.int4_probe_codes()
    n, k = probe.shape
    for packed_as in INT4_PACK_LAYOUTS:
        packed = _torch_pack_loops(probe, packed_as.name)
        for read_as in INT4_PACK_LAYOUTS:
            assert torch.equal(unpack_int4(packed, n, k, read_as), probe) == (read_as == packed_as)


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("n,k", [(64, 64), (192, 96)])
def test_unpack_inverts_torchs_pack_in_every_layout(name, n, k):
    codes = _codes(n, k, seed=n + k)
    assert torch.equal(unpack_int4(_torch_pack_loops(codes, name), n, k, LAYOUTS[name]), codes)


def test_the_detected_layout_is_the_one_torch_packs_here():
    """The probe's answer is torch's actual layout on this machine (a larger matrix than the
    probe, packed in chunks by pack_int4), and it agrees with the capability torch reports."""
    layout = int4_pack_layout()
    codes = _codes(320, 96, seed=5)
    assert torch.equal(pack_int4(codes, chunk_elems=64 * 96), _torch_pack_loops(codes, layout.name))
    assert torch.equal(unpack_int4(pack_int4(codes), 320, 96), codes)
    capability = torch.backends.cpu.get_cpu_capability()
    expected = {"AVX512": "avx512", "AVX2": "avx2", "DEFAULT": "default"}.get(capability)
    if expected is not None:
        assert layout.name == expected, (capability, layout)


def test_an_unknown_layout_fails_loudly(monkeypatch):
    """A torch whose pack matches no known layout is refused, never read with a wrong one."""
    monkeypatch.setattr(
        quant,
        "_torch_pack_int4",
        lambda codes: torch.zeros(codes.shape[0], codes.shape[1] // 2, dtype=torch.uint8),
    )
    int4_pack_layout.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="known layouts"):
            int4_pack_layout()
    finally:
        monkeypatch.undo()
        int4_pack_layout.cache_clear()
    assert int4_pack_layout() in INT4_PACK_LAYOUTS


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_cpp_dequantize_reads_every_layout(name):
    """int4_dequant_t (the prefill route) on bytes in each layout: each weight
    (q - 8) * scale + zero in float32, exactly, or rounded once to bf16. The expected weights are
    computed from the codes themselves, without unpacking; the torch-ops route must match too."""
    op = quant.int4_dequant_op()
    if op is None:
        pytest.skip("no C++ compiler: the int4 dequantize kernel cannot be built here")
    layout, (n, k, g) = LAYOUTS[name], (128, 192, 64)
    gen = torch.Generator().manual_seed(7)
    codes = _codes(n, k, seed=9)
    scales_zeros = (
        torch.rand(k // g, n, 2, generator=gen) - 0.5
    ).bfloat16()  # [K/g, N, (scale, zero)]
    scale, zero = (
        scales_zeros[..., i].float().t().repeat_interleave(g, dim=1) for i in (0, 1)
    )  # [N, K]
    want = ((codes.float() - 8) * scale + zero).t()
    packed = _torch_pack_loops(codes, name)
    assert torch.equal(
        op(packed, scales_zeros, g, layout.block_n, layout.pairs, torch.float32), want
    )
    assert torch.equal(
        op(packed, scales_zeros, g, layout.block_n, layout.pairs, torch.bfloat16), want.bfloat16()
    )
    held = quant.int4_dequantized(packed, scales_zeros, g, n, k, layout, torch.float32)
    assert torch.equal(held.t(), want)
    with pytest.raises(RuntimeError, match="unknown int4 pack layout"):
        op(packed, scales_zeros, g, 16, False, torch.bfloat16)


_UNDER_CAPABILITY = textwrap.dedent("""
    import torch
    from sgl.runtime.model import quant, quant_route
    from sgl.runtime.model.quant import Int4Linear, int4_pack_layout, unpack_int4
    from sgl.runtime.model.quant_tensor import quantize_int4

    print(int4_pack_layout().name)
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (192, 96), dtype=torch.uint8, generator=gen)
    assert torch.equal(unpack_int4(quant.pack_int4(codes), 192, 96), codes)
    q = quantize_int4(torch.randn(97, 128, generator=gen) * 0.05, 32)
    layer = Int4Linear(q, None)
    assert torch.equal(layer.held_weight(), q.rounded_scales().dequantize())
    held_t = torch.cat([layer.held_weight(),
                        layer.held_weight()[:1].expand(layer.padded_out - 97, -1)]).t()
    assert torch.equal(layer.dequantized_t(), held_t.to(quant_route.dense_dtype()))
    x = torch.randn(3, 128, generator=gen).bfloat16()
    ref = x.double() @ layer.held_weight().double().t()
    assert (layer.packed_mm(x)[:, :97].double() - ref).abs().max() <= 1e-2 * ref.abs().max()
""")


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_int4_linear_is_exact_under_another_torch_capability(capability):
    """In a process where torch packs for another CPU kernel (ATEN_CPU_CAPABILITY, which can
    only lower the capability safely), the detected layout is that kernel's, and an Int4Linear's
    held weight, its dequantized W^T and its packed matmul all agree with its codes."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("ATEN_CPU_CAPABILITY names x86 kernels")
    if capability == "avx2" and "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("no AVX2 here")
    if torch.backends.cpu.get_cpu_capability().lower() == capability:
        pytest.skip(
            "this process's own layout (test_the_detected_layout_is_the_one_torch_packs_here)"
        )
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    run = subprocess.run(
        [sys.executable, "-c", _UNDER_CAPABILITY],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == [capability]
