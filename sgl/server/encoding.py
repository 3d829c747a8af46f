"""JSON bodies for responses and SSE events.

Logprobs can be -inf (a masked token), which strict JSON cannot carry; such floats go out
as null instead of making the response fail with a 500.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi.responses import JSONResponse


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    """Compact JSON; non-finite floats become null (only walked when there is one)."""
    try:
        return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:
        return json.dumps(_finite(obj), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class JSONBody(JSONResponse):
    """A JSONResponse rendered with `dumps`."""

    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")
