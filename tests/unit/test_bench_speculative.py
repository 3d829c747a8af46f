"""benchmarks/bench_speculative.py's pieces that need no server: its prompts (seeded, rendered
in the model's template, the copied material really in the prompt), the engines' launch
flags, and the arithmetic of its report (vLLM's metrics, acceptance, output equality,
ratios), each checked against numbers worked out by hand."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_speculative as bench  # noqa: E402
import spec_workloads as wl  # noqa: E402

USER_TURN = re.compile(
    r"<\|im_start\|>system\n.*<\|im_end\|>\n<\|im_start\|>user\n(.*)<\|im_end\|>\n"
    r"<\|im_start\|>assistant\n",
    re.DOTALL,
)


def user_message(prompt: str) -> str:
    m = USER_TURN.fullmatch(prompt)
    assert m, f"not one rendered user turn: {prompt[:200]!r}"
    return m.group(1)


@pytest.mark.parametrize("name", sorted(wl.MAKERS | wl.HELD_OUT))
def test_prompts_are_seeded_per_cell_and_rendered_in_the_chat_template(name):
    a = wl.build(name, 3, "b1", 10, 16)
    assert a.prompts == wl.build(name, 3, "b1", 10, 16).prompts
    assert not set(a.prompts) & set(wl.build(name, 3, "b16", 10, 16).prompts)
    assert len(set(a.prompts)) == 3
    for prompt in a.prompts:
        user_message(prompt)


def test_extraction_asks_for_a_place_the_document_mentions():
    for prompt in wl.build("extraction", 20, "s", 4, 16).prompts:
        text, ask = user_message(prompt).split("\n\n")
        place = re.fullmatch(r"Quote, word for word, .* mentions the (\w+)\.", ask).group(1)
        assert f" {place} " in text


def test_json_extraction_shows_its_schema_and_the_people_to_copy():
    w = wl.build("json_extraction", 4, "s", 9, 16)
    assert w.json_schema == wl.PEOPLE_SCHEMA
    for prompt in w.prompts:
        _, schema, text = user_message(prompt).split("\n", 2)
        assert json.loads(schema) == wl.PEOPLE_SCHEMA
        people = re.findall(r"(\w+ \w+), aged (\d+), lives in (\w+) and works as a (\w+)\.", text)
        assert len(people) == 3  # every third of 9 sentences


def test_held_out_tasks_ask_for_their_text_back_changed_only_where_asked():
    """proofread: some words have two letters swapped (each a permutation of a word the
    templates use); code_edit: functions taking `items`, to be renamed `records`."""
    swapped = 0
    for prompt in wl.build("proofread", 6, "s", 12, 16).prompts:
        ask, text = user_message(prompt).split("\n\n")
        assert ask.startswith("Rewrite the following text with its spelling mistakes corrected")
        words = [w.strip(".") for w in text.split() if w.strip(".").isalpha()]
        swapped += sum(w not in PROOFREAD_WORDS for w in words)
        assert all(sorted(w) in SORTED_WORDS for w in words)  # swaps keep the letters
    assert swapped > 0
    for prompt in wl.build("code_edit", 3, "s", 10, 16).prompts:
        ask, code = user_message(prompt).split("\n\n", 1)
        assert "`items` to `records`" in ask and code.count("(items, limit=") == 2


PROOFREAD_WORDS = set(
    " ".join(
        [*wl.TOPICS, *wl.VERBS, *wl.OBJECTS]
        + [
            "Nobody living near doubts that it Scientists returned to in with better instruments"
            " and patient assistants Visitors often say that more than anything else nearby"
            " Careful records describe how over many decades"
        ]
    ).split()
)
SORTED_WORDS = [sorted(w) for w in PROOFREAD_WORDS]


def test_full_size_documents_are_about_600_tokens():
    full = bench.SIZES["full"]["sentences"]
    tok = wl._tokenizer()
    for name in ("extraction", "json_extraction"):
        for prompt in wl.build(name, 3, "s", full[name], 16).prompts:
            assert 500 <= len(tok(prompt)["input_ids"]) <= 800


def test_unknown_workload_and_engine_are_refused_by_name():
    with pytest.raises(ValueError, match="'summaries'"):
        wl.build("summaries", 1, "s", 4, 16)
    with pytest.raises(ValueError, match="'tgi-spec'"):
        bench.launch_flags("tgi-spec", 4, 3)
    with pytest.raises(ValueError, match="'sgl-eagle'"):
        bench.launch_flags("sgl-eagle", 4, 3)


def test_launch_flags_give_every_engine_the_same_draft_cap():
    assert bench.launch_flags("sgl", 5, 3) == ("sgl", ("--enable-torch-compile",))
    kind, flags = bench.launch_flags("sgl-spec", 5, 3)
    assert flags[flags.index("--speculative-num-draft-tokens") + 1] == "5"
    assert flags[flags.index("--speculative-algorithm") + 1] == "NGRAM"
    _, flags = bench.launch_flags("sgl-bf16-standalone", 5, 3)
    assert flags[flags.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert flags[flags.index("--quantization") + 1] == "none"
    assert flags[flags.index("--speculative-draft-model-quantization") + 1] == "int4"
    assert flags[flags.index("--speculative-num-draft-tokens") + 1] == "5"
    _, flags = bench.launch_flags("llama.cpp-spec", 5, 3)
    assert flags[flags.index("--spec-ngram-simple-size-m") + 1] == "5"
    assert flags[flags.index("--spec-ngram-simple-size-n") + 1] == "3"
    _, flags = bench.launch_flags("vllm-spec", 5, 3)
    config = json.loads(flags[flags.index("--speculative-config") + 1])
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 4,
    }


def test_vllm_metrics_sum_label_sets_and_skip_other_series():
    text = "\n".join(
        (
            "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.",
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="default"} 40.0',
            'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="default"} 2.0',
            'vllm:spec_decode_num_draft_tokens_created{engine="0"} 1.7e+09',
            'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 17.0',
            'vllm:spec_decode_num_drafts_total{engine="0"} 10.0',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 9.0',
            "vllm:num_requests_running 3.0",
        )
    )
    assert bench.vllm_spec_metrics(text) == {
        "draft_tokens": 42,
        "accepted_tokens": 17,
        "drafts": 10,
    }
    assert bench.vllm_spec_metrics("vllm:num_requests_running 0.0") is None


def done(*drafts: tuple[int, int]) -> list:
    return [bench.Completion("x", 8, 10, n, a) for n, a in drafts]


def test_acceptance_over_a_cell():
    sgl = bench.acceptance(
        True,
        "sgl",
        {"draft_tokens": 100, "accepted_tokens": 50, "verify_steps": 80},
        {"draft_tokens": 140, "accepted_tokens": 80, "verify_steps": 100},
        done(),
    )
    # 30 of 40 drafted accepted; (30 + 20) tokens over 20 steps
    assert sgl == {
        "draft_tokens": 40,
        "accepted_tokens": 30,
        "verify_steps": 20,
        "acceptance_rate": 0.75,
        "accept_length": 2.5,
    }
    llama = bench.acceptance(True, "llama.cpp", None, None, done((6, 3), (4, 1), (0, 0)))
    assert llama == {"draft_tokens": 10, "accepted_tokens": 4, "acceptance_rate": 0.4}
    vllm = bench.acceptance(
        True,
        "vllm",
        {"draft_tokens": 0, "accepted_tokens": 0, "drafts": 0},
        {"draft_tokens": 16, "accepted_tokens": 4, "drafts": 4},
        done(),
    )
    assert vllm["acceptance_rate"] == 0.25 and vllm["accept_length_per_draft"] == 2.0
    assert bench.acceptance(True, "vllm", None, None, done())["unavailable"]
    assert bench.acceptance(False, "sgl", None, None, done()) is None
    assert bench.acceptance(True, "llama.cpp", None, None, done((0, 0)))["acceptance_rate"] is None


def test_outputs_compared_with_the_plain_twin_and_ratios():
    d = bench.digest
    cell = {
        "sgl": {"tok_per_s": 100.0, "output_digests": [d("a"), d("b"), d("c")]},
        "sgl-spec": {"tok_per_s": 150.0, "output_digests": [d("a"), d("x"), d("c")]},
        "llama.cpp": {"tok_per_s": 80.0, "output_digests": [d("a")]},
        "llama.cpp-spec": {"tok_per_s": 120.0, "output_digests": [d("a")]},
        "vllm-spec": {"tok_per_s": 60.0, "output_digests": [d("a")]},
        "vllm": {"skipped": "could not start"},
    }
    bench.compare_outputs(cell)
    assert cell["sgl-spec"]["equal_to_plain"] == "2/3"
    assert cell["sgl-spec"]["differing_requests"] == [1]
    assert cell["llama.cpp-spec"]["equal_to_plain"] == "1/1"
    assert "equal_to_plain" not in cell["vllm-spec"]  # its plain twin did not run
    assert bench.ratios(cell) == {
        "sgl-spec_over_sgl": 1.5,
        "llama.cpp-spec_over_llama.cpp": 1.5,
        "best_peer_spec": "llama.cpp-spec",
        "sgl-spec_over_best_peer_spec": 1.25,
    }


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--engines", "sgl,tgi"], "--engines: 'tgi'"),
        (["--workloads", "chat,summaries"], "--workloads: 'summaries'"),
        (["--batches", "1,0"], "--batches"),
        (["--num-draft-tokens", "0"], "--num-draft-tokens"),
    ],
)
def test_bad_arguments_stop_before_any_server_starts(argv, named, capsys):
    ap = bench.parser()
    with pytest.raises(SystemExit):
        bench.check_args(ap, ap.parse_args(argv))
    assert named in capsys.readouterr().err
