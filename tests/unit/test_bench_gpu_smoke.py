"""benchmarks/bench_gpu.py --smoke: the GPU benchmark's code paths (sgl and HF, tables, JSON
and Markdown results) on a tiny model on the CPU, so the script does not rot between GPU runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_gpu_smoke(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_gpu.py"),
            "--smoke",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "gpu.json").read_text())
    assert result["smoke"] is True and result["device_name"]
    sgl_r, hf_r, summary = result["sgl"], result["hf"], result["summary"]
    for bs in result["workload"]["batch_sizes"]:
        assert sgl_r["decode"][str(bs)]["tokens_per_s"] > 0
        assert hf_r["decode"][str(bs)]["tokens_per_s"] > 0
        assert summary[f"batch{bs}_vs_hf"] > 0
    assert sgl_r["decode"]["4"]["cached_tokens"] > 0  # the timed run decodes from cached prompts
    assert sgl_r["prefill"]["tokens_per_s"] > 0 and hf_r["prefill"]["tokens_per_s"] > 0
    assert summary["batch1_floor_ms"] > 0 and summary["batch1_step_vs_floor"] > 0
    md = (tmp_path / "gpu.md").read_text()
    assert md.startswith("# GPU benchmark: ") and "| batch | sgl tok/s" in md and "floor" in md
