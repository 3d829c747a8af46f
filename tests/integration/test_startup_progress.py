"""Engine start-up names its long phases: a start line, then an end line with its seconds."""

from __future__ import annotations

import logging
import re

from oracle_helpers import ORACLE_EXACT


def test_engine_start_logs_weight_loading_with_its_time(caplog):
    import sgl

    with caplog.at_level(logging.INFO, logger="sgl"):
        e = sgl.Engine(**ORACLE_EXACT)
    try:
        lines = [r.getMessage() for r in caplog.records if r.name == "sgl.runtime.worker"]
        start = [i for i, m in enumerate(lines) if re.fullmatch(r"loading the weights of .+", m)]
        end = [
            i for i, m in enumerate(lines) if re.fullmatch(r"loaded the weights in \d+\.\d s", m)
        ]
        assert len(start) == 1 and len(end) == 1 and start[0] < end[0], lines
    finally:
        e.shutdown()
