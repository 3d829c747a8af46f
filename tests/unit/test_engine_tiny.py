"""The whole engine on a tiny random model saved as an HF directory (sharded safetensors +
a byte-level BPE tokenizer), checked against HF transformers' greedy `generate`."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import save_tiny_engine_dir

import sgl

VOCAB = 320
NEW = 24


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_engine_dir(tmp_path_factory.mktemp("tiny-llama"), VOCAB)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 40))] for _ in range(n)]


def hf_greedy(hf, ids: list[int], new: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def engine_greedy(engine, batch: list[list[int]], new: int = NEW) -> list[list[int]]:
    outs = engine.generate(
        input_ids=batch,
        sampling_params={"max_new_tokens": new, "temperature": 0, "ignore_eos": True},
    )
    return [o["output_ids"] for o in outs]


def assert_no_leak(engine) -> None:
    assert engine.flush_cache()
    info = engine.get_server_info()
    assert info["available_kv_tokens"] == info["max_total_tokens"]


def test_greedy_batch_equals_hf_generate(tiny_dir):
    path, hf = tiny_dir
    batch = prompts(6)
    with sgl.Engine(model_path=str(path), dtype="float32", max_total_tokens=4096) as engine:
        got = engine_greedy(engine, batch)
        for ids, out in zip(batch, got):
            assert out == hf_greedy(hf, ids, NEW)
        assert_no_leak(engine)


@pytest.mark.parametrize(
    "options",
    [
        dict(disable_radix_cache=True),
        dict(chunked_prefill_size=3),
        dict(chunked_prefill_size=-1, max_prefill_tokens=8),
        dict(schedule_policy="fcfs"),
        dict(schedule_policy="dfs-weight"),
        dict(max_running_requests=2),
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_scheduling_options_do_not_change_greedy_tokens(tiny_dir, options):
    path, hf = tiny_dir
    batch = prompts(8, seed=1)
    batch += [batch[0] + batch[1], batch[0][:10] + [5, 6]]  # shared prefixes
    with sgl.Engine(model_path=str(path), dtype="float32", max_total_tokens=4096) as engine:
        reference = [engine_greedy(engine, [ids])[0] for ids in batch]  # one at a time
    with sgl.Engine(
        model_path=str(path), dtype="float32", max_total_tokens=4096, **options
    ) as engine:
        assert engine_greedy(engine, batch) == reference
        assert engine_greedy(engine, batch) == reference  # again, now with a warm cache
        assert_no_leak(engine)


def test_retraction_keeps_outputs_and_frees_memory(tiny_dir):
    path, _ = tiny_dir
    batch = prompts(8, seed=2)
    with sgl.Engine(model_path=str(path), dtype="float32", max_total_tokens=4096) as engine:
        reference = engine_greedy(engine, batch, new=48)
    # 8 requests x (<= 40 + 48 tokens) cannot all fit in 200 slots: decode must retract.
    with sgl.Engine(model_path=str(path), dtype="float32", max_total_tokens=200) as engine:
        assert engine_greedy(engine, batch, new=48) == reference
        assert engine.get_server_info()["retractions"] > 0
        assert_no_leak(engine)


def test_cached_tokens_reported(tiny_dir):
    path, _ = tiny_dir
    shared = prompts(1, seed=3)[0] + prompts(1, seed=4)[0]
    with sgl.Engine(model_path=str(path), dtype="float32", max_total_tokens=4096) as engine:
        first = engine.generate(input_ids=shared + [7], sampling_params={"max_new_tokens": 2})
        second = engine.generate(input_ids=shared + [9], sampling_params={"max_new_tokens": 2})
        assert first["meta_info"]["cached_tokens"] == 0
        assert second["meta_info"]["cached_tokens"] == len(shared)
        assert_no_leak(engine)


def test_load_errors_surface_on_the_callers_thread(tiny_dir):
    """The model loads on a short-lived thread (its OpenMP pool must not outlive it); an error
    there is raised from the constructor, and no scheduler thread is left behind."""
    import threading

    path, _ = tiny_dir
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        sgl.Engine(model_path=str(path), context_length=10**7)
    after = {t.name for t in threading.enumerate()}
    assert not {name for name in after - before if name.startswith("sgl-")}


def test_compiled_decode_equals_hf_generate(tiny_dir):
    """torch_compile=True: decode steps of one request run the static batch-1 graph, decode
    steps of several the dynamic-batch one (the rest eagerly); greedy tokens still equal
    HF's, alone and in batches of changing size (requests of different lengths finish apart)."""
    import shutil

    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler: inductor cannot compile here (the engine runs eagerly)")
    path, hf = tiny_dir
    with sgl.Engine(
        model_path=str(path), dtype="float32", max_total_tokens=4096, torch_compile=True
    ) as engine:
        info = engine.get_server_info()["torch_compile"]
        assert info["enabled"] and set(info["graphs"]) == {"batch 1", "batch 2+"}, info
        assert all(s > 0 for s in info["graphs"].values()), info
        assert info["wrappers"] == {"batch 1": "cpp", "batch 2+": "cpp"}, (
            info
        )  # the faster wrapper builds here
        for ids in prompts(4, seed=5):
            assert engine_greedy(engine, [ids]) == [hf_greedy(hf, ids, NEW)]
        steps = engine.get_server_info()["torch_compile"]["steps"]
        assert steps["batch 1"] >= 4 * (NEW - 1) and steps["batch 2+"] == 0, steps
        batch = prompts(5, seed=6)
        lengths = [
            NEW - 2 * i for i in range(len(batch))
        ]  # rows finish one by one: batch sizes 5, 4, ... 2
        got = engine.generate(
            input_ids=batch,
            sampling_params=[
                {"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in lengths
            ],
        )
        assert [r["output_ids"] for r in got] == [
            hf_greedy(hf, ids, n) for ids, n in zip(batch, lengths)
        ]
        steps = engine.get_server_info()["torch_compile"]["steps"]
        assert steps["batch 2+"] >= lengths[-2] - 1, steps
        assert_no_leak(engine)


def test_speculative_verify_steps_run_the_compiled_decode_graph(tiny_dir):
    """With torch_compile and NGRAM speculation, a request's newest token and its draft run as
    one decode row per token (the batched graph, the same table row, growing context): greedy
    tokens equal HF's, and one request's verify steps ran the batch 2+ graph."""
    import shutil

    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler: inductor cannot compile here (the engine runs eagerly)")
    path, hf = tiny_dir
    rng = random.Random(8)
    with sgl.Engine(
        model_path=str(path),
        dtype="float32",
        max_total_tokens=4096,
        torch_compile=True,
        speculative_algorithm="NGRAM",
    ) as engine:
        accepted = 0
        for _ in range(4):
            span = [rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 8))]
            ids = span * 3 + span[:2]
            out = engine.generate(
                input_ids=ids,
                sampling_params={"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True},
            )
            assert out["output_ids"] == hf_greedy(hf, ids, NEW)
            accepted += out["meta_info"]["spec_accepted_tokens"]
        assert accepted > 0
        steps = engine.get_server_info()["torch_compile"]["steps"]
        assert steps["batch 2+"] > 0, steps  # one request at a time: only verify steps use it
        assert_no_leak(engine)
