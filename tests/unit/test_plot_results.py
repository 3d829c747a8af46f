"""benchmarks/plot_results.py draws every README chart from the checked-in results JSONs, and a
missing file or field stops it with a message naming the file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "plot_results.py"
RESULTS = ROOT / "benchmarks" / "results"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EXPECTED = ("tp", "dp_saturated", "cpu_peers", "remote_programs", "tools", "program_workloads")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


def test_every_chart_is_a_small_readable_png(tmp_path):
    proc = run("--out-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    for name in EXPECTED:
        png = (tmp_path / f"{name}.png").read_bytes()
        assert png[:8] == PNG_SIGNATURE, name
        width = int.from_bytes(png[16:20], "big")
        assert 700 <= width <= 1300, (name, width)
        assert len(png) < 150_000, (name, len(png))


def test_missing_json_names_the_file(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    proc = run("--results", str(results), "--out-dir", str(tmp_path), "--only", "dp_saturated")
    assert proc.returncode != 0
    assert "dp_saturated.json" in proc.stderr and "missing" in proc.stderr


def test_missing_field_names_file_and_field(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    data = json.loads((RESULTS / "dp_saturated.json").read_text())
    del data["results"]["1 worker"]["output_tok_s"]
    (results / "dp_saturated.json").write_text(json.dumps(data))
    proc = run("--results", str(results), "--out-dir", str(tmp_path), "--only", "dp_saturated")
    assert proc.returncode != 0
    assert "dp_saturated.json" in proc.stderr and "results.1 worker.output_tok_s" in proc.stderr
    assert not (tmp_path / "dp_saturated.png").exists()


def test_the_old_program_workloads_command_still_works(tmp_path):
    shutil.copy(RESULTS / "program_workloads.json", tmp_path)
    out = tmp_path / "pw.png"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "plot_program_workloads.py"),
            "--results",
            str(tmp_path / "program_workloads.json"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == PNG_SIGNATURE
