"""The examples' programs, shipped vs interpreted on the client, through one server (greedy,
float32): the static ones ship under ship="auto" and give the client-side results; the
dynamic one (animal_facts returns a value built from its branches) runs client-side."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from server_helpers import ServerThread
from state_compare import same_state

import sgl
from sgl.lang.shipping import ShippedState
from sgl.server import create_app

pytestmark = pytest.mark.integration
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TEXT = "Maria Lopez is 34 and lives in Porto."
CASES = [
    ("few_shot_qa", "few_shot_qa", {"question": "What is the capital of Italy?"}),
    ("few_shot_qa", "classify_topic", {"question": "Who won the 1998 World Cup?"}),
    ("few_shot_qa", "count", {"question": "How many legs does a spider have?"}),
    ("json_extraction", "extract_with_schema", {"text": TEXT}),
    ("json_extraction", "extract_with_regex", {"text": TEXT}),
    ("parallel_fork", "tip_suggestion", {"topic": "staying healthy"}),
    (
        "quick_start",
        "multi_turn_question",
        {
            "question_1": "What is the capital of France?",
            "question_2": "What is a famous landmark there?",
        },
    ),
    ("run_batch_dataset", "answer_question", {"question": "What color is the sky?"}),
]


def program(module: str, name: str):
    spec = importlib.util.spec_from_file_location(f"example_{module}", EXAMPLES / f"{module}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name)


@pytest.fixture(scope="module")
def remote(engine):
    with ServerThread(create_app(engine, "default")) as url:
        yield sgl.RuntimeEndpoint(url)


@pytest.mark.parametrize("module,name,args", CASES, ids=[c[1] for c in CASES])
def test_static_examples_ship_and_equal_client_side(remote, module, name, args):
    fn = program(module, name)
    local = fn.run(backend=remote, temperature=0, ship=False, **args)
    shipped = fn.run(backend=remote, temperature=0, **args)
    same_state(shipped, local)


def test_dynamic_example_runs_client_side(remote):
    fn = program("parallel_fork", "animal_facts")
    state = fn.run(backend=remote, temperature=0, animal="otters")
    assert not isinstance(state, ShippedState) and len(state.ret_value) == 3
