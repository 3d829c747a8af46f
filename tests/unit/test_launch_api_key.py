"""Where the server's API key comes from: the flag, the environment, or a file (which `ps`
does not show); conflicting or unreadable sources are refused with the reason."""

from __future__ import annotations

import pytest

from sgl.server.launch import build_parser, resolve_api_key


def key_of(argv, monkeypatch, env=None):
    for name in ("SGL_API_KEY", "SGL_API_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    return resolve_api_key(build_parser().parse_args(argv))


def test_the_key_sources(tmp_path, monkeypatch):
    f = tmp_path / "key"
    f.write_text("  s3cret\n")
    assert key_of([], monkeypatch) is None
    assert key_of(["--api-key", "a"], monkeypatch) == "a"
    assert key_of([], monkeypatch, {"SGL_API_KEY": "b"}) == "b"
    assert key_of(["--api-key-file", str(f)], monkeypatch) == "s3cret"
    assert key_of([], monkeypatch, {"SGL_API_KEY_FILE": str(f)}) == "s3cret"


@pytest.mark.parametrize(
    "setup,words",
    [
        (lambda d: ["--api-key", "a", "--api-key-file", str(d / "key")], "not both"),
        (lambda d: ["--api-key-file", str(d / "missing")], "cannot read"),
        (lambda d: ["--api-key-file", str(d / "empty")], "holds no key"),
    ],
)
def test_bad_key_sources_are_refused(tmp_path, monkeypatch, setup, words):
    (tmp_path / "key").write_text("k")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match=words):
        key_of(setup(tmp_path), monkeypatch)
