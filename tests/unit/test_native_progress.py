"""Building native code says what it does and how long it took, and a finished build is loaded
directly (torch's loader, which re-runs ninja, is called only to build). A real, tiny C++
source is compiled; the library's own function is the oracle that the right one was loaded."""

from __future__ import annotations

import ctypes
import logging
import re

import torch.utils.cpp_extension

from sgl import native

SOURCE = 'extern "C" int sgl_test_answer() { return 42; }\n'


def test_built_once_then_loaded_directly_and_rebuilt_when_broken(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    calls = []
    real_load = torch.utils.cpp_extension.load

    def counting_load(*args, **kwargs):
        calls.append(kwargs["name"])
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch.utils.cpp_extension, "load", counting_load)
    source = tmp_path / "k.cpp"
    source.write_text(SOURCE)
    name, broken = (native.build_name("sgl_test", source, [flag]) for flag in ("-O1", "-O2"))
    library, broken_library = (native.build_directory(n) / f"{n}.so" for n in (name, broken))
    broken_library.parent.mkdir(parents=True)
    broken_library.write_bytes(b"")  # what a build killed half-way through its link leaves
    with caplog.at_level(logging.INFO, logger="sgl.native"):
        native.build("sgl_test", source, ["-O1"], python_module=False)  # compiled
        native.build("sgl_test", source, ["-O1"], python_module=False)  # loaded as it is
        native.build("sgl_test", source, ["-O2"], python_module=False)  # refused, built again
    assert calls == [name, broken]
    for lib in (library, broken_library):
        assert ctypes.CDLL(str(lib)).sgl_test_answer() == 42
    lines = [r.getMessage() for r in caplog.records if r.name == "sgl.native"]
    assert re.fullmatch(rf"building k\.cpp \(first use; cached in .*{name}\)", lines[0]), lines
    assert re.fullmatch(r"built k\.cpp in \d+\.\d s", lines[1]), lines
    assert re.fullmatch(rf"loaded k\.cpp from .*{name} in \d+\.\d\d s", lines[2]), lines
    assert lines[3].startswith(f"could not load {broken_library}") and lines[3].endswith(
        "rebuilding it"
    ), lines
    assert lines[4].startswith("building k.cpp") and lines[5].startswith("built k.cpp"), lines
