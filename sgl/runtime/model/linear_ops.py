"""The C++ linear ops (csrc/linear_ops_cpu.cpp, library `sgl_linear`), built on first use.

`int4_dequant_t` serves int4 prefill; `int8_linear`, `int4_linear` and `packed_linear` are what
torch.compile'd graphs call (see the source for why). Each has a fake (shape-only)
implementation registered here, so the compiler can trace through it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "linear_ops_cpu.cpp"
_lock = threading.Lock()
_built: list[bool] = []  # [True / False] once tried


def linear_ops_built() -> bool:
    """Whether torch.ops.sgl_linear is loaded, building it on first call (False where it
    cannot be built: no compiler; callers then use torch ops)."""
    with _lock:
        if not _built:
            try:
                from sgl import native

                # no FMA contraction: a dequantized weight is (q - 8) * s + z rounded as torch
                # rounds it
                native.build(
                    "sgl_linear_ops",
                    SOURCE,
                    ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off"],
                    ldflags=["-fopenmp"],
                    python_module=False,
                )
                _register_fakes()
                _built.append(True)
            except Exception as e:  # no compiler: the torch-ops routes serve
                logger.warning("the C++ linear ops could not be built (%s); using torch ops", e)
                _built.append(False)
        return _built[0]


def compiled_ops_ready() -> bool:
    """Whether the ops were built (without trying): read by layers while being compiled."""
    return bool(_built) and _built[0]


def _register_fakes() -> None:
    fake = torch.library.register_fake
    fake("sgl_linear::int4_dequant_t")(
        lambda packed, scales_zeros, group, block_n, pairs, dtype: packed.new_empty(
            packed.shape[1] * 2, packed.shape[0], dtype=dtype
        )
    )
    fake("sgl_linear::int8_linear")(
        lambda x, qweight, scales, crossover, dense_dtype, dense, dense_from: x.new_empty(
            x.shape[0], qweight.shape[0]
        )
    )

    def int4_linear(
        x, qweight, scales_zeros, group, block_n, pairs, crossover, dense_dtype, dense, dense_from
    ):
        return x.new_empty(x.shape[0], qweight.shape[0])

    fake("sgl_linear::int4_linear")(int4_linear)
    fake("sgl_linear::packed_linear")(
        lambda x, packed, bias: x.new_empty(x.shape[0], packed.shape[0])
    )
