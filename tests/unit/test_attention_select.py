"""Choosing the attention backend: `auto` picks the best installed one for the device, and a
named backend that cannot run fails with a message that says how to fix it. Availability of
flashinfer / triton is faked, so these run on any machine."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from graph_test_backend import DenseDecodeBackend

import sgl.runtime.attention as attn
from sgl.runtime.attention import create_attention_backend, supports_cuda_graph
from sgl.runtime.attention.torch_native import TorchNativeBackend
from sgl.runtime.config import EngineConfig, cuda_graph_max_bs


class FakeFlashInfer(TorchNativeBackend):
    pass


class FakeTriton(TorchNativeBackend):
    pass


class FakeCpu(TorchNativeBackend):
    pass


@pytest.fixture
def installed(monkeypatch):
    """installed({"flashinfer", "triton"}): pretend exactly these GPU packages are importable."""

    def set_(names: set[str]) -> None:
        def available(module: str) -> bool:
            if module == "sgl.runtime.attention.triton_backend":
                return "triton" in names
            if module in ("flashinfer", "triton"):
                return module in names
            raise AssertionError(f"unexpected module probe {module}")

        monkeypatch.setattr(attn, "_module_available", available)

    fake_factory(monkeypatch, "flashinfer", FakeFlashInfer)
    fake_factory(monkeypatch, "triton", FakeTriton)
    fake_factory(monkeypatch, "cpu", FakeCpu)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return set_


def fake_factory(monkeypatch, name: str, make) -> None:
    """Register `make` as the factory of backend `name` (its check stays)."""
    monkeypatch.setitem(attn.REGISTRY, name, dataclasses.replace(attn.REGISTRY[name], make=make))


@pytest.mark.parametrize(
    "device, dtype, packages, expected",
    [
        ("cuda", torch.bfloat16, {"flashinfer", "triton"}, FakeFlashInfer),
        ("cuda:1", torch.float16, {"flashinfer"}, FakeFlashInfer),
        ("cuda", torch.bfloat16, {"triton"}, FakeTriton),
        ("cuda", torch.bfloat16, set(), TorchNativeBackend),
        # flashinfer has no float32 kernels: a float32 engine goes to triton, else torch
        ("cuda", torch.float32, {"flashinfer", "triton"}, FakeTriton),
        ("cuda", torch.float32, {"flashinfer"}, TorchNativeBackend),
        ("cuda", None, {"flashinfer", "triton"}, FakeFlashInfer),
        # never a GPU backend on a CPU, whatever is installed; our kernel for float32 / bf16 / fp16
        ("cpu", torch.float32, {"flashinfer", "triton"}, FakeCpu),
        ("cpu", None, set(), FakeCpu),
        ("cpu", torch.bfloat16, {"flashinfer", "triton"}, FakeCpu),
        ("cpu", torch.float16, set(), FakeCpu),
        ("cpu", torch.float64, {"flashinfer", "triton"}, TorchNativeBackend),
    ],
)
def test_auto_picks_best_available(installed, device, dtype, packages, expected):
    installed(packages)
    assert type(create_attention_backend("auto", device, dtype)) is expected


def test_auto_falls_back_when_an_installed_backend_fails_to_load(installed, monkeypatch):
    installed({"flashinfer", "triton"})

    def broken():
        raise ImportError("libcudart.so.12: cannot open shared object file")

    fake_factory(monkeypatch, "flashinfer", broken)
    assert type(create_attention_backend("auto", "cuda", torch.bfloat16)) is FakeTriton


def _no_compiler():
    raise RuntimeError("the CPU attention kernel could not be built: g++ not found")


def test_auto_on_cpu_falls_back_when_the_kernel_cannot_be_built(installed, monkeypatch, caplog):
    installed(set())

    fake_factory(monkeypatch, "cpu", _no_compiler)
    assert type(create_attention_backend("auto", "cpu", torch.float32)) is TorchNativeBackend
    assert "g++ not found" in caplog.text


def test_cpu_backend_needs_the_cpu_a_kernel_dtype_and_a_build(installed, monkeypatch):
    installed(set())
    assert type(create_attention_backend("cpu", "cpu", torch.float32)) is FakeCpu
    with pytest.raises(ValueError, match="runs on the CPU"):
        create_attention_backend("cpu", "cuda", torch.float32)
    assert type(create_attention_backend("cpu", "cpu", torch.bfloat16)) is FakeCpu
    with pytest.raises(ValueError, match="float32, bfloat16 or float16 KV cache.*torch_native"):
        create_attention_backend("cpu", "cpu", torch.float64)

    fake_factory(monkeypatch, "cpu", _no_compiler)
    with pytest.raises(ValueError, match="g\\+\\+ not found; use attention_backend='torch_native'"):
        create_attention_backend("cpu", "cpu")


def test_torch_native_anywhere(installed):
    installed(set())
    assert type(create_attention_backend("torch_native", "cuda")) is TorchNativeBackend
    assert type(create_attention_backend("torch_native", "cpu")) is TorchNativeBackend


def test_triton_on_cpu_needs_the_interpreter(installed, monkeypatch):
    installed({"triton"})
    with pytest.raises(ValueError) as e:
        create_attention_backend("triton", "cpu")
    msg = str(e.value)
    assert (
        "attention_backend='triton'" in msg
        and "TRITON_INTERPRET=1" in msg
        and "torch_native" in msg
    )
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert type(create_attention_backend("triton", "cpu")) is FakeTriton
    assert type(create_attention_backend("triton", "cuda")) is FakeTriton


def test_triton_and_flashinfer_missing_name_the_install(installed):
    installed(set())
    for name in ("triton", "flashinfer"):
        with pytest.raises(ValueError, match=r"pip install sgl\[cuda\]"):
            create_attention_backend(name, "cuda", torch.bfloat16)


def test_flashinfer_needs_cuda_and_half_precision(installed):
    installed({"flashinfer"})
    with pytest.raises(ValueError, match="CUDA device"):
        create_attention_backend("flashinfer", "cpu")
    with pytest.raises(ValueError, match="bfloat16"):
        create_attention_backend("flashinfer", "cuda", torch.float32)
    assert type(create_attention_backend("flashinfer", "cuda", torch.bfloat16)) is FakeFlashInfer


def test_unknown_backend():
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        create_attention_backend("xformers", "cpu")


def test_real_availability_probes_do_not_raise():
    assert isinstance(attn.flashinfer_available(), bool)
    assert isinstance(attn.triton_available(), bool)


def test_cuda_graph_hooks_are_detected():
    assert not supports_cuda_graph(TorchNativeBackend())
    assert supports_cuda_graph(DenseDecodeBackend())


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("attention_backend", "xformers", "attention_backend must be one of"),
        ("load_format", "gguf", "load_format must be one of"),
        ("cuda_graph_max_bs", 0, "disable_cuda_graph"),
    ],
)
def test_engine_config_rejects(field, value, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**{field: value}).validate()


def test_cuda_graphs_only_on_cuda():
    cfg = EngineConfig(cuda_graph_max_bs=160, max_running_requests=64)
    assert cuda_graph_max_bs(cfg, torch.device("cpu")) == 0
    assert cuda_graph_max_bs(cfg, torch.device("cuda")) == 64  # never beyond the running limit
    assert cuda_graph_max_bs(EngineConfig(cuda_graph_max_bs=24), torch.device("cuda:0")) == 24
    assert cuda_graph_max_bs(EngineConfig(disable_cuda_graph=True), torch.device("cuda")) == 0


def test_cli_flags_mirror_the_new_options():
    from sgl.server.launch import build_parser, engine_kwargs

    args = build_parser().parse_args(
        [
            "--load-format",
            "dummy",
            "--model-path",
            "llama3-8b",
            "--cuda-graph-max-bs",
            "32",
            "--disable-cuda-graph",
            "--attention-backend",
            "flashinfer",
        ]
    )
    kw = engine_kwargs(args)
    assert kw["load_format"] == "dummy" and kw["model_path"] == "llama3-8b"
    assert kw["cuda_graph_max_bs"] == 32 and kw["disable_cuda_graph"] is True
    assert kw["attention_backend"] == "flashinfer"
    defaults = engine_kwargs(build_parser().parse_args([]))
    cfg = EngineConfig()
    for name in ("load_format", "cuda_graph_max_bs", "disable_cuda_graph", "attention_backend"):
        assert defaults[name] == getattr(cfg, name)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--attention-backend", "xformers"])
