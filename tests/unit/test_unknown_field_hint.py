"""A misspelt field of a request body is refused naming the field it is close to; a field
SGLang's router adds is accepted; one far from every field is refused without a guess."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from sgl.server.errors import install_error_handlers
from sgl.server.protocol import GenerateReqInput


def _client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/generate")
    async def generate(req: GenerateReqInput) -> dict:
        return {"unsupported": req.unsupported_sglang_field()}

    return TestClient(app)


def test_misspelt_field_gets_did_you_mean():
    err = _client().post("/generate", json={"text": "x", "strem": True}).json()["error"]
    assert err["param"] == "strem" and "did you mean 'stream'?" in err["message"]
    err = _client().post("/generate", json={"text": "x", "sampling_param": {}}).json()["error"]
    assert "did you mean 'sampling_params'?" in err["message"]


def test_unrelated_field_gets_no_guess():
    err = _client().post("/generate", json={"text": "x", "zzz": 1}).json()["error"]
    assert err["message"] == "zzz: unknown field (not part of this API)"


def test_router_fields_accepted_at_their_off_values_only():
    router_body = {
        "text": "x",
        "model": None,
        "return_text_in_logprobs": False,
        "stream": False,
        "log_metrics": True,
        "return_hidden_states": False,
        "background": False,
        "no_logs": False,
        "return_bytes": False,
        "return_entropy": False,
    }
    assert _client().post("/generate", json=router_body).json() == {"unsupported": None}
    for field, value in (
        ("background", True),
        ("return_entropy", True),
        ("data_parallel_rank", 1),
        ("bootstrap_room", 7),
    ):
        assert _client().post("/generate", json={**router_body, field: value}).json() == {
            "unsupported": field
        }
