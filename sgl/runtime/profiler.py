"""The torch profiler around the scheduler's steps (`Engine.start_profile` / `stop_profile`,
the server's `/start_profile` and `/stop_profile`).

It runs on the scheduler thread, which does every forward, so the trace holds the model's
ops (and, on CUDA, its kernels). A trace ends at `stop_profile` or after `num_steps` forward
steps, and is written as a Chrome trace (open it in Perfetto or chrome://tracing).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from sgl.runtime.errors import InvalidRequestError

ACTIVITIES = {
    "CPU": torch.profiler.ProfilerActivity.CPU,
    "GPU": torch.profiler.ProfilerActivity.CUDA,
    "CUDA": torch.profiler.ProfilerActivity.CUDA,
}


class StepProfiler:
    def __init__(self) -> None:
        self._prof: Any = None
        self._dir = ""
        self._steps_left: int | None = None
        self.traces: list[str] = []  # files written by profiles that ended on their own (num_steps)
        self._count = 0  # profiles ended by this process: names stay distinct within one second

    @property
    def running(self) -> bool:
        return self._prof is not None

    def start(
        self,
        output_dir: str,
        num_steps: int | None = None,
        activities: list[str] | None = None,
        record_shapes: bool = False,
        with_stack: bool = False,
    ) -> str:
        if self.running:
            raise InvalidRequestError(
                "a profile is already running; stop it first (/stop_profile)", param="output_dir"
            )
        if num_steps is not None and (not isinstance(num_steps, int) or num_steps < 1):
            raise InvalidRequestError(
                f"num_steps must be an integer >= 1, got {num_steps!r}", param="num_steps"
            )
        names = activities or (["CPU", "GPU"] if torch.cuda.is_available() else ["CPU"])
        unknown = [a for a in names if a not in ACTIVITIES]
        if unknown:
            raise InvalidRequestError(
                f"unknown profiler activities {unknown}; use CPU and/or GPU", param="activities"
            )
        try:
            os.makedirs(output_dir, exist_ok=True)
        except OSError as e:
            raise InvalidRequestError(
                f"cannot create output_dir: {e.strerror}", param="output_dir"
            ) from None
        self._dir, self._steps_left = output_dir, num_steps
        self._prof = torch.profiler.profile(
            activities=sorted({ACTIVITIES[a] for a in names}, key=str),
            record_shapes=record_shapes,
            with_stack=with_stack,
        )
        self._prof.start()
        return output_dir

    def after_step(self) -> None:
        """Count a forward step; end the profile once `num_steps` have run."""
        if self._steps_left is not None:
            self._steps_left -= 1
            if self._steps_left <= 0:
                self.traces.append(self.stop())

    def stop(self) -> str:
        """End the profile and write its trace; returns the file (or the one a profile that
        ended after its `num_steps` wrote)."""
        if not self.running and self.traces:
            return self.traces.pop()
        if not self.running:
            raise InvalidRequestError(
                "no profile is running; start one with /start_profile", param=None
            )
        prof, self._prof = self._prof, None
        prof.stop()
        self._count += 1
        name = f"sgl-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{self._count}.trace.json"
        path = os.path.join(self._dir, name)
        prof.export_chrome_trace(path)
        return path
