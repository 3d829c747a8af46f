"""The engine on the GPU: an embedded-size model in float32 decodes the same greedy tokens as
on the CPU, and the KV pool is sized from the memory left after the weights."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from gpu_helpers import assert_same_greedy, free_cuda, greedy_top2, random_prompts, sharpen

import sgl
from sgl.runtime.memory_plan import kv_pool_tokens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def embedded_model() -> dict:
    """The embedded SmolLM2-135M when its package (and gguf) is installed; else a dummy model
    of its shape, whose CPU weights the GPU engine copies."""
    from sgl.runtime.model.paths import resolve_model_path

    try:
        resolve_model_path("default")
        if importlib.util.find_spec("gguf") is not None:
            return {"model_path": "default"}
    except FileNotFoundError:
        pass
    return {"model_path": "smollm2-135m", "load_format": "dummy", "random_seed": 0}


def test_gpu_float32_greedy_matches_cpu():
    kw = dict(embedded_model(), dtype="float32", max_total_tokens=8192, context_length=512)
    prompts = random_prompts(6, 49152, seed=1)
    dummy = kw.get("load_format") == "dummy"
    with sgl.Engine(device="cpu", **kw) as cpu:
        if dummy:
            sharpen(cpu)
        ref = greedy_top2(cpu, prompts, 16)
        with sgl.Engine(device="cuda", **kw) as gpu:
            if dummy:  # CPU and CUDA generators differ: share the weights (copied in place)
                gpu.model.load_state_dict(cpu.model.state_dict())
            got = greedy_top2(gpu, prompts, 16)
            info = gpu.get_server_info()
    free_cuda()
    assert all(len(o["ids"]) == 16 for o in got)
    assert_same_greedy(ref, got, lp_tol=1e-2, tie_margin=1e-2)
    assert info["dtype"] == "float32" and info["device"].startswith("cuda")


def test_bfloat16_is_the_cuda_default_and_the_pool_is_sized_after_the_weights():
    fraction = 0.3
    with sgl.Engine(
        model_path="smollm2-135m",
        load_format="dummy",
        device="cuda",
        mem_fraction_static=fraction,
        max_running_requests=32,
        chunked_prefill_size=512,
        cuda_graph_max_bs=8,
    ) as engine:
        info = engine.get_server_info()
        plan = info["memory_plan"]
        out = engine.generate(
            input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 4, "temperature": 0}
        )
        free_now, _ = torch.cuda.mem_get_info()
    free_cuda()
    assert info["dtype"] == "bfloat16"
    expected = kv_pool_tokens(
        plan["free_bytes_after_weights"],
        fraction,
        plan["kv_bytes_per_token"],
        plan["headroom_bytes"],
    )
    assert info["max_total_tokens"] == plan["max_total_tokens"] == expected
    # 30 layers x 3 KV heads x 64 dims x K/V x 2 bytes
    assert plan["kv_bytes_per_token"] == 30 * 3 * 64 * 2 * 2
    assert plan["headroom_bytes"] > 1 << 30
    assert free_now > plan["headroom_bytes"]  # what the pool left is at least the headroom
    assert len(out["output_ids"]) == 4


def test_the_scheduler_in_its_own_process_on_the_gpu():
    """The scheduler process on CUDA (CUDA graphs, the server's default mode): the same greedy
    tokens as the scheduler on a thread, and no process left after shutdown."""
    import os

    kw = dict(
        model_path="smollm2-135m",
        load_format="dummy",
        random_seed=0,
        device="cuda",
        dtype="float32",
        max_total_tokens=8192,
        context_length=512,
    )
    prompts = random_prompts(4, 49152, seed=2)
    with sgl.Engine(**kw) as threaded:
        ref = greedy_top2(threaded, prompts, 12)
    free_cuda()
    with sgl.Engine(**kw, scheduler_process=True) as proc:
        pid = proc.scheduler_pids[0]
        got = greedy_top2(proc, prompts, 12)
        info = proc.get_server_info()
    assert info["scheduler_process"] and info["device"].startswith("cuda")
    assert_same_greedy(ref, got, lp_tol=1e-3, tie_margin=1e-3)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[
        1
    ].startswith("Z")
