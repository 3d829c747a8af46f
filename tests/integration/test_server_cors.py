"""CORS is off unless origins are configured; configured, a browser's preflight is answered
for those origins only, and the API key still guards every real request."""

from __future__ import annotations

import pytest
import requests
from server_helpers import ServerThread

from sgl.server import create_app

pytestmark = pytest.mark.integration
PREFLIGHT = {
    "Origin": "https://app.example",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type",
}


def test_no_cors_headers_by_default(engine):
    with ServerThread(create_app(engine, "m")) as url:
        r = requests.get(url + "/v1/models", headers={"Origin": "https://app.example"}, timeout=30)
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        pre = requests.options(url + "/v1/chat/completions", headers=PREFLIGHT, timeout=30)
        assert "access-control-allow-origin" not in pre.headers


def test_configured_origins_only_and_the_key_still_required(engine):
    with ServerThread(
        create_app(engine, "m", api_key="k", cors_allow_origins=["https://app.example"])
    ) as url:
        pre = requests.options(url + "/v1/chat/completions", headers=PREFLIGHT, timeout=30)
        assert (
            pre.status_code == 200
            and pre.headers["access-control-allow-origin"] == "https://app.example"
        )
        other = requests.options(
            url + "/v1/chat/completions",
            headers={**PREFLIGHT, "Origin": "https://evil.example"},
            timeout=30,
        )
        assert other.headers.get("access-control-allow-origin") != "https://evil.example"
        assert (
            requests.get(
                url + "/v1/models", headers={"Origin": "https://app.example"}, timeout=30
            ).status_code
            == 401
        )
        ok = requests.get(
            url + "/v1/models",
            headers={"Origin": "https://app.example", "Authorization": "Bearer k"},
            timeout=30,
        )
        assert (
            ok.status_code == 200
            and ok.headers["access-control-allow-origin"] == "https://app.example"
        )
