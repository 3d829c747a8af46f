"""GPU-only tests: every module skips itself without CUDA. They share tests/unit's helpers."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
