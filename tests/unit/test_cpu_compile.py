"""CompiledDecode's fallbacks: a graph the C++ wrapper cannot build is compiled with the Python
wrapper; a graph neither can build runs eagerly. Each failure is reported in `info`. And the
guards it skips: two models of one class, compiled in one process, never share a graph."""

from types import SimpleNamespace

import torch

from sgl.runtime.cpu_compile import WRAPPERS, CompiledDecode, _options, own_forward


class _Backend:
    def init_forward_metadata(self, batch) -> None:
        pass


def _maker(failing: set[str], calls: list[str]):
    def make(wrapper: str):
        def forward(input_ids, positions, batch):
            calls.append(wrapper)
            if wrapper in failing:
                raise RuntimeError(f"the {wrapper} wrapper failed")
            return input_ids

        return forward

    return make


def _compile(failing: set[str]):
    calls: list[str] = []
    seconds, errors, wrappers = {}, {}, {}
    batch = SimpleNamespace(input_ids=torch.tensor([5]), positions=torch.tensor([0]))
    forward = CompiledDecode(torch.nn.Identity())._compile(
        "batch 1", _maker(failing, calls), batch, _Backend(), seconds, errors, wrappers
    )
    return forward, calls, errors, wrappers


def test_the_cpp_wrapper_is_tried_first():
    forward, calls, errors, wrappers = _compile(set())
    assert (
        WRAPPERS[0] == "cpp" and calls == ["cpp"] and wrappers == {"batch 1": "cpp"} and not errors
    )
    assert forward is not None


def test_a_graph_the_cpp_wrapper_cannot_build_gets_the_python_one():
    forward, calls, errors, wrappers = _compile({"cpp"})
    assert calls == ["cpp", "python"] and wrappers == {"batch 1": "python"}
    assert "the cpp wrapper failed" in errors["batch 1 (cpp wrapper)"]
    assert forward(torch.tensor([9]), None, None).tolist() == [9]


def test_a_graph_no_wrapper_can_build_runs_eagerly():
    forward, calls, errors, wrappers = _compile({"cpp", "python"})
    assert forward is None and calls == ["cpp", "python"] and not wrappers
    assert set(errors) == {"batch 1 (cpp wrapper)", "batch 1 (python wrapper)"}


class _Scaled(torch.nn.Module):
    def __init__(self, out: int, scale: float) -> None:
        super().__init__()
        self.linear, self.scale = torch.nn.Linear(4, out), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


def test_models_of_one_class_keep_their_own_graphs_without_module_guards():
    """The module guards are skipped (`_options`), so only the code copy (`own_forward`) keeps
    b and c from running a's graph: b differs in a weight's shape, c in a constant."""
    torch.manual_seed(0)
    models = [_Scaled(3, 1.0), _Scaled(5, 2.0), _Scaled(3, 3.0)]
    compiled = [
        torch.compile(own_forward(m), dynamic=False, options=_options("python")) for m in models
    ]
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(2):
            for model, forward in zip(models, compiled):
                assert torch.allclose(forward(x), model(x))
