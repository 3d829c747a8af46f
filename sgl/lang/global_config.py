"""`sgl.global_config`: the frontend's process-wide settings, under SGLang's names.

`default_backend` is the backend `run` / `run_batch` use when none is given (the same one
`sgl.set_default_backend` sets; reading it never starts the embedded model, unlike
`get_default_backend()`). `enable_precache_with_tracing`: `run_batch` first computes the
program's constant prefix (found by tracing) into the cache, so every item starts with a
hit. `verbosity` > 0 logs each program's gens at INFO (to stderr unless logging is set up). SGLang's
runtime-side knobs (token ratio estimation, ...) belong to the engine's options here and are not
read.
"""

from __future__ import annotations

import logging
from typing import Any


class GlobalConfig:
    def __init__(self) -> None:
        self.enable_precache_with_tracing = True
        self._verbosity = 0

    @property
    def default_backend(self) -> Any:
        from sgl.lang import api

        with api._backend_lock:
            return api._default_backend

    @default_backend.setter
    def default_backend(self, backend: Any) -> None:
        from sgl.lang import api

        if backend is None:
            with api._backend_lock:
                api._default_backend = None
        else:
            api.set_default_backend(backend)

    @property
    def verbosity(self) -> int:
        return self._verbosity

    @verbosity.setter
    def verbosity(self, level: int) -> None:
        self._verbosity = int(level)
        log = logging.getLogger("sgl.lang")
        log.setLevel(logging.INFO if level > 0 else logging.NOTSET)
        if (
            level > 0 and not log.handlers and not logging.getLogger().handlers
        ):  # nothing would print it
            log.addHandler(logging.StreamHandler())


global_config = GlobalConfig()
