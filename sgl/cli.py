"""The `sgl` command: `sgl serve ...` is `python -m sgl.launch_server ...` (SGLang's
`sglang serve` / vLLM's `vllm serve` shape); `sgl version` prints the version."""

from __future__ import annotations

import sys

USAGE = (
    "usage: sgl <command> [args]\n"
    "\n"
    "commands:\n"
    "  serve [flags]   start the server (the flags of `python -m sgl.launch_server`; "
    "`sgl serve --help` lists them)\n"
    "  version         print sgl's version\n"
)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else ""
    if command == "serve":
        from sgl.extras import needs_extra

        with needs_extra("server", "`sgl serve`"):
            from sgl.server.launch import main as serve
        serve(args)
        return 0
    if command == "version":
        from sgl import __version__

        print(__version__)
        return 0
    if command in ("", "-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    print(f"sgl: unknown command {command!r}\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
