"""The model registry: every supported architecture family has a class, the loaders build the
class registered for a config's family, and a family without one is refused by name."""

from __future__ import annotations

import pytest
import torch

from sgl.runtime.model import registry
from sgl.runtime.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from sgl.runtime.model.dummy import dummy_hf_config, load_dummy_model
from sgl.runtime.model.llama import LlamaForCausalLM


def test_every_supported_family_has_a_model_class():
    assert set(SUPPORTED_ARCHITECTURES.values()) <= set(registry.MODEL_CLASSES)


def test_the_loader_builds_the_class_registered_for_the_family(monkeypatch):
    built = []

    class Recording(LlamaForCausalLM):
        def __init__(self, config, tp=None):
            built.append(config.arch)
            super().__init__(config, tp)

    monkeypatch.setitem(registry.MODEL_CLASSES, "llama", Recording)
    model, config = load_dummy_model("tiny-llama", torch.float32, torch.device("cpu"))
    assert isinstance(model, Recording) and built == ["llama"] and config.arch == "llama"


def test_a_family_without_a_class_is_refused_by_name(monkeypatch):
    config = ModelConfig.from_hf_dict(dummy_hf_config("tiny-llama"))
    monkeypatch.delitem(registry.MODEL_CLASSES, "llama")
    with pytest.raises(
        ValueError, match="no model class is registered for the architecture family 'llama'"
    ):
        registry.build_model(config)
