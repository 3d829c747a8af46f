"""The frontend-language examples run to completion on the default backend and do their work.

Each example runs as a subprocess from the repository root; the checks read its stdout.
They check structure and constraints (JSON that validates, choices from the list, one
result per input line), not what the tiny model happens to answer.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stderr[-3000:]}"
    return proc.stdout.splitlines()


def values(lines: list[str], prefix: str) -> list[str]:
    """The rest of each line that starts with `prefix`, in order."""
    return [line[len(prefix) :].strip() for line in lines if line.startswith(prefix)]


def load_example(name: str):
    """Import an example as a module (only `import sgl` runs; no model is started)."""
    spec = importlib.util.spec_from_file_location(
        f"lang_example_{Path(name).stem}", EXAMPLES / name
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_start():
    lines = run_example("quick_start.py")
    assert values(lines, "answer_1:")[0] and values(lines, "answer_2:")[0]
    start = lines.index("messages:")
    roles = [line.split(":", 1)[0].strip() for line in lines[start + 1 : start + 6]]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    # The assistant messages are the generated answers.
    assert lines[start + 3].split(":", 1)[1].strip() == values(lines, "answer_1:")[0]
    # Streaming: the streamed pieces (printed between "stream:" and the final line) hold
    # the whole conversation, including the second answer read from the state afterwards.
    streamed = "\n".join(lines[lines.index("stream:") + 1 : -1])
    answer_2 = values(lines, "streamed answer_2:")[0]
    assert answer_2 and answer_2 in streamed
    assert "What colour is it when it is not ripe?" in streamed


def test_few_shot_qa():
    lines = run_example("few_shot_qa.py")
    qa = values(lines, "qa:")
    assert len(qa) == 5 and all(" -> " in x for x in qa)
    assert qa[0].startswith("What is the capital of France? -> ")  # run_batch keeps input order
    topics = values(lines, "topic:")
    module = load_example("few_shot_qa.py")
    assert len(topics) == 5 and all(x.rsplit(" -> ", 1)[1] in module.TOPICS for x in topics)
    numbers = values(lines, "gen_int:")
    assert len(numbers) == 3 and all(
        re.fullmatch(r"-?\d+", x.rsplit(" -> ", 1)[1]) for x in numbers
    )


def test_json_extraction_outputs_validate_against_the_schema():
    import jsonschema

    lines = run_example("json_extraction.py")
    schema = load_example("json_extraction.py").SCHEMA
    by_schema = [json.loads(x) for x in values(lines, "json_schema:")]
    by_regex = [json.loads(x) for x in values(lines, "regex:")]
    assert len(by_schema) == 2 and len(by_regex) == 2
    for obj in by_schema + by_regex:
        jsonschema.validate(obj, schema)


def test_parallel_fork():
    lines = run_example("parallel_fork.py")
    tips = values(lines, "tip branch")
    assert len(tips) == 2 and all(t.split(":", 1)[1].strip() for t in tips)
    assert values(lines, "summary:")
    facts = [x.split(":", 1)[1].strip() for x in values(lines, "fact branch")]
    assert len(facts) == 3 and all(facts)
    # concate_and_append put the three branches' text into the parent, in fork order.
    joined = "\n".join(lines[lines.index("joined text:") + 1 :])
    positions = [joined.index(f"Fact {i + 1},") for i in range(3)]
    assert positions == sorted(positions)
    assert all(fact in joined for fact in facts)


def test_run_batch_dataset_prints_one_result_per_input_line_in_order():
    lines = run_example("run_batch_dataset.py")
    rows = [
        json.loads(x)
        for x in (EXAMPLES / "data" / "questions.jsonl").read_text().splitlines()
        if x.strip()
    ]
    assert len(rows) >= 10
    results = [x for x in lines if x.startswith("result ")]
    assert len(results) == len(rows)
    for i, (line, row) in enumerate(zip(results, rows)):
        assert line.startswith(f"result {i:02d}: {row['question']} -> ")
        assert line.endswith(("exact)", "contains)", "miss)"))
    m = re.fullmatch(r"score: exact (\d+)/(\d+), contains (\d+)/(\d+)", lines[-1])
    assert m, lines[-1]
    exact, n, contains, n2 = map(int, m.groups())
    assert n == n2 == len(rows) and exact <= contains <= n


def test_tool_agent_calls_declared_functions_with_valid_arguments():
    import jsonschema

    module = load_example("tool_agent.py")
    lines = run_example("tool_agent.py")
    calls = values(lines, "call:")
    assert len(calls) >= 2  # the first step of each question must call
    for line in calls:
        name, rest = line.split(" ", 1)
        arguments, result = rest.split(" -> ")
        fn = module.BY_NAME[name]
        jsonschema.validate(
            json.loads(arguments), module.function_tool(fn)["function"]["parameters"]
        )
        assert json.loads(result) == fn(**json.loads(arguments))
    assert len(values(lines, "answer:")) == 2
