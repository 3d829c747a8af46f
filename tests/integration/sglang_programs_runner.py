"""Run SGLang 0.5.23's test programs (sglang/test/test_programs.py) against a server, through
SGLang's real frontend (`sglang`) or sgl's with only the import changed (`sgl`); prints one JSON
object: {program: "ok" | "assertion: <the failed assert line>" | "error: ..."}. Run as a subprocess
by test_sglang_test_programs.py: argv = frontend, server url, program names."""

import json
import sys
import traceback
import types


def load_programs(frontend: str) -> types.ModuleType:
    if frontend == "sglang":
        import sglang
        import sglang.test.test_programs as programs

        sglang.set_default_backend(sglang.RuntimeEndpoint(URL))
        return programs
    import sgl

    path = sys.argv[4]  # the installed test_programs.py, read as text: only its import changes
    source = open(path).read().replace("import sglang as sgl\n", "import sgl\n", 1)
    source = source.replace("from sglang.srt.utils import is_hip\n", "is_hip = lambda: False\n", 1)
    programs = types.ModuleType("test_programs")
    exec(compile(source, path, "exec"), programs.__dict__)
    sgl.set_default_backend(sgl.RuntimeEndpoint(URL))
    return programs


FRONTEND, URL, NAMES = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
programs = load_programs(FRONTEND)
outcome = {}
for name in NAMES:
    fn = getattr(programs, name)
    kwargs = (
        {"check_answer": False}
        if "check_answer" in fn.__code__.co_varnames[: fn.__code__.co_argcount]
        else {}
    )
    try:
        fn(**kwargs)
        outcome[name] = "ok"
    except AssertionError as e:  # the assert statement of test_programs.py that failed
        frames = [
            f
            for f in traceback.extract_tb(e.__traceback__)
            if f.filename.endswith("test_programs.py")
        ]
        outcome[name] = f"assertion: {frames[-1].line if frames else repr(e)}"[:300]
    except BaseException as e:  # noqa: BLE001 - every failure is reported, by kind
        outcome[name] = f"error: {type(e).__name__}: {e}"[:300]
print(json.dumps(outcome))
