"""KV memory: a pool of token slots (page size 1) and the request-to-token table.

Every cached token of every layer lives in one slot of the pool; a request's context is
the row of slot ids in `ReqToTokenPool`. Slot 0 is reserved as a padding slot, so
gathers over padded index tensors never read out of bounds and never need masking to
be safe (only to be correct).
"""

from __future__ import annotations

import torch


class TokenToKVPool:
    """Per-layer K and V buffers of shape [capacity + 1, kv_heads, head_dim] and a free list."""

    def __init__(
        self,
        capacity: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"max_total_tokens must be positive, got {capacity}")
        self.capacity = capacity
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (capacity + 1, num_kv_heads, head_dim)
        # `empty`, not `zeros`: on CPU untouched pages cost nothing, so a large pool is free
        # until used. Only the padding slot must hold finite values (masked reads of it are
        # multiplied by zero attention weight, and 0 * NaN would poison the output).
        self.k_buffers = [
            torch.empty(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]
        self.v_buffers = [
            torch.empty(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]
        for buf in self.k_buffers + self.v_buffers:
            buf[0].zero_()
        self.clear()

    @staticmethod
    def bytes_per_token_for(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """K and V, every layer: 2 x layers x kv_heads x head_dim x element size."""
        return (
            2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        )

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_token_for(
            self.num_layers, self.num_kv_heads, self.head_dim, self.dtype
        )

    def clear(self) -> None:
        # Slots 1..capacity are usable; 0 is the padding slot.
        self._free = torch.arange(1, self.capacity + 1, dtype=torch.int64)
        self._num_free = self.capacity

    def available_size(self) -> int:
        return self._num_free

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take `n` free slots (int64, on CPU), or None when fewer are free."""
        if n > self._num_free:
            return None
        start = self._num_free - n
        out = self._free[start : self._num_free].clone()
        self._num_free = start
        return out

    def free(self, slots: torch.Tensor) -> None:
        n = int(slots.numel())
        if n == 0:
            return
        if self._num_free + n > self.capacity:
            raise RuntimeError("KV pool double free: more slots returned than were allocated")
        self._free[self._num_free : self._num_free + n] = slots.to(torch.int64).cpu().flatten()
        self._num_free += n

    def set_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffers[layer].index_copy_(0, slots, k.to(self.dtype))
        self.v_buffers[layer].index_copy_(0, slots, v.to(self.dtype))


class ReqToTokenPool:
    """Rows of slot ids, one row per running request, indexed by the request's pool index."""

    def __init__(self, max_requests: int, max_context_len: int, device: torch.device | str) -> None:
        self.size = max_requests
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros(
            (max_requests, max_context_len), dtype=torch.int64, device=device
        )
        self._free_rows = list(range(max_requests - 1, -1, -1))
        self.epochs = [0] * max_requests  # bumped on every alloc: tells a row's occupants apart

    def available_size(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self.epochs[row] += 1
        return row

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.req_to_token[row, start : start + slots.numel()] = slots.to(self.req_to_token.device)
