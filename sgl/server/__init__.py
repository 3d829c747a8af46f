"""The HTTP server: native /generate, OpenAI-compatible /v1/*, /v1/extract and /metrics.

`create_app(engine, served_model_name)` builds the FastAPI app around an `sgl.Engine`;
`python -m sgl.launch_server` loads the engine and serves it with uvicorn.
"""

from sgl.server.app import create_app

__all__ = ["create_app"]
