"""Every example runs to completion on the embedded model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(name: str) -> subprocess.CompletedProcess:
    """Runs an example to completion; it must exit 0."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_engine_quickstart_runs():
    proc = _run("engine_quickstart.py")
    lines = proc.stdout.splitlines()
    assert "{'type': 'length', 'length': 12}" in lines[0]
    assert sum("cached prompt tokens" in line for line in lines) == 3
    # The system prompt is shared: the second and third chat requests hit the cache.
    cached = [
        int(line.rsplit(": ", 1)[1].rstrip(")")) for line in lines if "cached prompt tokens" in line
    ]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] > 0
    assert any(line.startswith("stream:") for line in lines)
    assert "8" not in next(
        line for line in lines if line.startswith("stream:")
    )  # the stop string is trimmed


def test_constrained_decoding_example_outputs_are_in_their_languages():
    import json
    import re

    proc = _run("constrained_decoding.py")
    lines = {
        line.split(":", 1)[0]: line.split(":", 1)[1].strip()
        for line in proc.stdout.splitlines()
        if ":" in line
    }
    assert re.fullmatch(r"([01][0-9]|2[0-3]):[0-5][0-9]", lines["regex"])
    items = lines["ebnf"].split(" {")[0]
    assert re.fullmatch(r'\["[a-z]+"(,"[a-z]+")*\]', items) and json.loads(items)
    assert "city" in lines["json_schema"]
    email = (
        r"[a-z]+@[a-z]+\.(com|org)"  # the example's, written out: 8 tokens, sampled, yet complete
    )
    assert all(re.fullmatch(email, t) for t in json.loads(lines["budget"]))


def test_cpu_quantized_example_reports_each_layout():
    proc = _run("cpu_quantized.py")
    lines = proc.stdout.splitlines()
    heads = [line for line in lines if line.split(":")[0].startswith(("bf16", "int4", "int8"))]
    assert len(heads) == 3
    assert "'int4_g32': 120" in heads[1]  # every linear layer of the 30 kept int4
    assert "'int8': 120" in heads[2] or "'int8_g32': 120" in heads[2]
    assert "int4" not in heads[0] and "int8" not in heads[0]  # quantization="none": dense
    assert sum(" 48 tokens in " in line for line in lines) == 3


def test_model_families_example_loads_each_and_refuses_an_unknown_key():
    proc = _run("model_families.py")
    lines = {line.split(":")[0]: line for line in proc.stdout.splitlines() if ":" in line}
    assert "features=['logit_cap', 'sliding_window']" in lines["Gemma2ForCausalLM"]
    assert "features=['sliding_window']" in lines["MistralForCausalLM"]
    assert (
        "experts=4" in lines["MixtralForCausalLM"] and "experts=8" in lines["Qwen3MoeForCausalLM"]
    )
    assert sum(line.endswith("tokens=8") for line in lines.values()) == 7
    assert "config key 'hidden_act' = 'relu'" in lines["refused"]


def test_speculative_extraction_example_reports_its_drafts():
    """Each verify step keeps its accepted drafts and one drawn token (the first token comes
    from the prefill), so the counts bound the output; quoting the document accepts drafts."""
    import re

    proc = _run("speculative_extraction.py")
    counts = [
        tuple(int(x) for x in m.groups())
        for m in re.finditer(
            r"tokens: (\d+), verify steps: (\d+), drafted: (\d+), accepted: (\d+)", proc.stdout
        )
    ]
    assert len(counts) == 2, proc.stdout
    for tokens, verify, drafted, accepted in counts:
        assert 0 < verify < tokens <= verify + accepted + 1 and accepted <= drafted
    rate = float(re.search(r"engine: acceptance ([0-9.]+)", proc.stdout).group(1))
    assert 0 < rate <= 1
