"""Regenerate tests/unit/data/sglang_0_5_launch_flags.txt from an unpacked SGLang wheel:

    cd tests/unit/data
    python extract_sglang_flags.py <site-packages>/sglang/srt > sglang_0_5_launch_flags.txt

Reads the source, imports nothing (SGLang needs CUDA packages to import): the `--` names of the
`Annotated`/`A` fields with an `Arg(...)` or a help string in server_args.py and
arg_groups/fields/*.py (field name -> --kebab-name, or its cli_name, plus its aliases; no_cli
fields skipped), and the literal names of server_args.py's own add_argument calls.
"""

import ast
import glob
import sys

HEADER = (
    "# SGLang {version}'s `python -m sglang.launch_server` flags (ServerArgs.add_cli_args), "
    "one a line.\n"
    "# Extracted from the source of the sglang {version} wheel by "
    "tests/unit/data/extract_sglang_flags.py\n"
    "# (see its docstring to regenerate). Compared with ours by "
    "tests/unit/test_sglang_flag_parity.py."
)


def _annotated_meta(ann: ast.expr) -> list[ast.expr] | None:
    head = getattr(ann, "value", None)
    if not (
        isinstance(ann, ast.Subscript)
        and getattr(head, "id", getattr(head, "attr", "")) in ("Annotated", "A")
    ):
        return None
    return list(ann.slice.elts[1:]) if isinstance(ann.slice, ast.Tuple) else []


def field_flags(node: ast.AnnAssign) -> list[str]:
    meta = _annotated_meta(node.annotation)
    if meta is None or not isinstance(node.target, ast.Name):
        return []
    arg = next(
        (m for m in meta if isinstance(m, ast.Call) and getattr(m.func, "id", "") == "Arg"), None
    )
    if arg is None and not any(
        isinstance(m, ast.Constant) and isinstance(m.value, str) for m in meta
    ):
        return []
    kw = {k.arg: k.value for k in (arg.keywords if arg else [])}
    if getattr(kw.get("no_cli"), "value", False):
        return []
    names = [kw["cli_name"].value if "cli_name" in kw else "--" + node.target.id.replace("_", "-")]
    if isinstance(kw.get("aliases"), ast.List):
        names += [e.value for e in kw["aliases"].elts if isinstance(e, ast.Constant)]
    return names


def flags(srt_dir: str) -> set[str]:
    out: set[str] = set()
    for path in [
        f"{srt_dir}/server_args.py",
        *sorted(glob.glob(f"{srt_dir}/arg_groups/fields/*.py")),
    ]:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign):
                out.update(field_flags(node))
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                out.update(
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                )
    return out


if __name__ == "__main__":
    srt = sys.argv[1]
    version = sys.argv[2] if len(sys.argv) > 2 else "0.5"
    print(HEADER.format(version=version))
    print("\n".join(sorted(flags(srt))))
