"""A failure inside the server is a 500 that names an incident id, never the exception's
text (it may hold paths or data); the log has the traceback under that id."""

from __future__ import annotations

import logging

import pytest
import requests
from server_helpers import ServerThread, sse_events

from sgl.server import create_app

pytestmark = pytest.mark.integration
SECRET = "/srv/secret/path.txt"


@pytest.fixture()
def failing(engine, monkeypatch):
    async def fail():
        raise RuntimeError(f"cannot open {SECRET}")
        yield  # an async generator: a stream that fails once it has started

    async def boom(*args, stream=False, **kwargs):
        if stream:
            return fail()
        await fail().__anext__()

    monkeypatch.setattr(engine, "async_generate", boom)
    with ServerThread(create_app(engine, "m")) as url:
        yield url


@pytest.mark.parametrize("stream", [False, True])
def test_an_internal_error_names_an_incident_and_nothing_else(failing, caplog, stream):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}, "stream": stream}
    with caplog.at_level(logging.ERROR, logger="sgl.server.errors"):
        r = requests.post(failing + "/generate", json=body, timeout=60)
        if stream:
            events = [e for e in sse_events(r) if isinstance(e, dict)]
            error = next(e["error"] for e in events if "error" in e)
        else:
            assert r.status_code == 500
            error = r.json()["error"]
    assert error["code"] == 500 and "incident" in error["message"]
    assert SECRET not in r.text and "Traceback" not in r.text and "RuntimeError" not in r.text
    incident = error["message"].split("incident ")[1].split(";")[0]
    logged = [rec for rec in caplog.records if incident in rec.getMessage()]
    assert logged and logged[0].exc_info is not None and SECRET in str(logged[0].exc_info[1])
