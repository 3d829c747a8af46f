"""The tensor-parallel group a model is built for: this rank, the group's size, and the two
collectives the sharded layers need (a sum over ranks, a concatenation of ranks' pieces).

Why an object passed to the model rather than a module-level group: two models in one
process (tests, an engine next to an oracle) must not share hidden state, and at size 1 the
model must run exactly as it did before tensor parallelism existed, so both collectives are
plain returns there and no process group is ever created.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

BACKENDS = ("gloo", "nccl")


@dataclass
class TPGroup:
    """This process's place in a tensor-parallel group (`group` None at size 1)."""

    rank: int = 0
    size: int = 1
    group: Any = None  # a torch.distributed ProcessGroup, or None at size 1
    # Set the first time the backend refuses a low-precision sum (gloo on older torch): from
    # then on such tensors are summed in float32 and cast back.
    _sum_in_float32: bool = field(default=False, repr=False)

    @classmethod
    def single(cls) -> TPGroup:
        """The group of one process (no tensor parallelism)."""
        return cls()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns `x` (untouched at size 1)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        low = x.dtype in (torch.bfloat16, torch.float16)
        if low and not self._sum_in_float32:
            try:
                dist.all_reduce(x, group=self.group)
                return x
            except RuntimeError:  # checked before any data moves, so every rank takes this path
                self._sum_in_float32 = True
        if low:
            wide = x.float()
            dist.all_reduce(wide, group=self.group)
            return x.copy_(wide)
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The ranks' `x` concatenated along `dim`, in rank order (`x` itself at size 1)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=dim)

    def destroy(self) -> None:
        """Leave the process group (a no-op at size 1)."""
        if self.size == 1 or self.group is None:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        self.group = None


def init_tp_group(rank: int, size: int, init_method: str, backend: str = "gloo") -> TPGroup:
    """Join the `size`-process group as `rank` (every rank calls this with the same
    `init_method`: a `tcp://127.0.0.1:PORT` or `file:///path` URL; `backend` "gloo" for CPU
    tensors, "nccl" for CUDA ones, after `torch.cuda.set_device`). Size 1 creates nothing."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"tp rank {rank} is not in a group of size {size}")
    if backend not in BACKENDS:
        raise ValueError(f"tp backend {backend!r} is not one of {BACKENDS}")
    if size == 1:
        return TPGroup.single()
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)
    return TPGroup(rank, size, dist.group.WORLD)
