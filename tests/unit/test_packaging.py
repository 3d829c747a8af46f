"""What `pip install sgl` gives: the bare package is the frontend and its clients (pip's own
resolver is the oracle for what it pulls in), the wheel carries the `sgl` command, py.typed
and the LICENSE, and the command starts the server's CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from process_helpers import BLOCK_RUNTIME, RUNTIME_PACKAGES

import sgl

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _pip(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bare_install_resolves_to_the_frontend_only(tmp_path):
    report = tmp_path / "report.json"
    done = _pip(
        "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), "."
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"sgl", "requests", "tqdm"} <= names
    assert not names & RUNTIME_PACKAGES, sorted(names & RUNTIME_PACKAGES)


def test_wheel_carries_the_command_the_types_marker_and_the_license(tmp_path):
    done = _pip("wheel", "--no-deps", "--quiet", "-w", str(tmp_path), ".")
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("sgl-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = next(n.rsplit("/", 1)[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = z.read(f"{info}/entry_points.txt").decode()
        metadata = z.read(f"{info}/METADATA").decode()
    assert "sgl/py.typed" in names
    assert f"{info}/licenses/LICENSE" in names and "License-Expression: Apache-2.0" in metadata
    assert "sgl = sgl.cli:main" in entry_points
    assert (
        "sgl/constrained/csrc/ebnf_native.cpp" in names
    )  # kernels built on first use travel as source


def test_sgl_command():
    version = subprocess.run(
        [str(BIN / "sgl"), "version"], capture_output=True, text=True, timeout=120
    )
    assert version.returncode == 0 and version.stdout.strip() == sgl.__version__
    serve_help = subprocess.run(
        [str(BIN / "sgl"), "serve", "--help"], capture_output=True, text=True, timeout=120
    )
    assert serve_help.returncode == 0 and "--model-path" in serve_help.stdout
    unknown = subprocess.run(
        [str(BIN / "sgl"), "srve"], capture_output=True, text=True, timeout=120
    )
    assert (
        unknown.returncode == 2
        and "unknown command 'srve'" in unknown.stderr
        and "serve" in unknown.stderr
    )


def test_missing_extra_names_the_install_command():
    """With torch unimportable (a meta-path blocker, as on a bare install), asking for the engine
    says which extra to install instead of a traceback from deep inside an import."""
    code = BLOCK_RUNTIME + (
        "import sgl\nfrom sgl.extras import MissingExtraError\n"
        "try:\n    sgl.Engine\nexcept MissingExtraError as e:\n    print('ENGINE', e)\n"
        "@sgl.function\ndef f(s):\n    s += 'x' + sgl.gen('a', max_tokens=1)\n"
        "try:\n    f.run()\nexcept MissingExtraError as e:\n    print('RUN', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    for key in ("ENGINE", "RUN"):
        assert "pip install 'sgl[runtime]'" in lines[key] and "'torch'" in lines[key], lines
