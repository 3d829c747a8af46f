"""Building native code says what it does and how long it took: a first build reads
'building', a cached one 'loading', each ended by a line with its seconds."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch.utils.cpp_extension

from sgl import native


def test_build_then_load_are_logged_with_their_time(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))

    def fake_load(name, sources, build_directory, **_):  # stands for torch's compile: leaves the .so
        (Path(build_directory) / f"{name}.so").write_bytes(b"")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_load)
    source = tmp_path / "k.cpp"
    source.write_text("// kernel")
    with caplog.at_level(logging.INFO, logger="sgl.native"):
        native.build("sgl_test", source, [], python_module=False)
        native.build("sgl_test", source, [], python_module=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "sgl.native"]
    assert len(lines) == 4, lines
    assert re.fullmatch(r"building k\.cpp \(cached in .*sgl_test_[0-9a-f]{12}\)", lines[0])
    assert re.fullmatch(r"built k\.cpp in \d+\.\d s", lines[1])
    assert re.fullmatch(r"loading k\.cpp \(cached in .*sgl_test_[0-9a-f]{12}\)", lines[2])
    assert re.fullmatch(r"loaded k\.cpp in \d+\.\d s", lines[3])
