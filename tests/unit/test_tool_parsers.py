"""Tool-call and reasoning parsers (sgl.tool_calls): hand-checked results per format, and
streaming equal to the whole parse for every split of every example (the server relies on it)."""

from __future__ import annotations

import ast
import json
import random
import sys
from pathlib import Path

import pytest

from sgl.tool_calls import (
    PARSERS,
    REASONING_STYLES,
    HermesParser,
    ReasoningParser,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    detect_parser,
    get_parser,
)

# (format, output text, expected content, expected calls as (name, arguments))
TOOL_CASES: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    # -- hermes
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"celsius"}}\n</tool_call>',
        "",
        [("get_weather", '{"city": "Paris", "unit": "celsius"}')],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>\n',
        "",
        [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "Europe/Paris"}')],
    ),
    (
        "hermes",
        'I\'ll look that up.\n\n<tool_call>\n{"name": "search", "arguments": {"q": '
        '"sgl"}}\n</tool_call>',
        "I'll look that up.\n\n",
        [("search", '{"q": "sgl"}')],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT \'}\' FROM t", '
        '"opts": {"limit": 10, "tags": ["a}", "{b", "\\"}"]}}}\n</tool_call>',
        "",
        [
            (
                "run_sql",
                '{"query": "SELECT \'}\' FROM t", "opts": {"limit": 10, "tags": ["a}", "{b", '
                '"\\"}"]}}',
            )
        ],
    ),
    (
        "hermes",
        '<tool_call>{"name": "echo", "arguments": {"text": "close with </tool_call> then '
        '<tool_call>"}}</tool_call>',
        "",
        [("echo", '{"text": "close with </tool_call> then <tool_call>"}')],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "traduire", "arguments": {"texte": "Où est la gare ? 東京 '
        '🚉"}}\n</tool_call>',
        "",
        [("traduire", '{"texte": "Où est la gare ? 東京 🚉"}')],
    ),
    (
        "hermes",
        '<tool_call>  {"name":"f","parameters":{"a":[1,2,{"b":null}]}}\t</tool_call>',
        "",
        [("f", '{"a":[1,2,{"b":null}]}')],
    ),
    ("hermes", '<tool_call>\n{"name": "list_files"}\n</tool_call>', "", [("list_files", "{}")]),
    (
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n\nDone.',
        "\n\nDone.",
        [("f", "{}")],
    ),
    # malformed: bad JSON, no name, arguments not an object, a missing brace, unclosed, no end tag
    (
        "hermes",
        'Sure.<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>',
        'Sure.<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>',
        [],
    ),
    (
        "hermes",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        [],
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
        [],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>\nmore',
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>\nmore',
        [],
    ),
    (
        "hermes",
        'Calling.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
        'Calling.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
        [],
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {}}',
        '<tool_call>{"name": "f", "arguments": {}}',
        [],
    ),
    (
        "hermes",
        '<tool_call>{"name": oops}</tool_call>\n<tool_call>{"name": "g", "arguments": {"x": '
        "1}}</tool_call>\n",
        '<tool_call>{"name": oops}</tool_call>\n',
        [("g", '{"x": 1}')],
    ),
    ("hermes", "a < b, and <tool is not <tool_call", "a < b, and <tool is not <tool_call", []),
    ("hermes", "", "", []),
    # -- llama3_json
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [("get_weather", '{"city": "Paris"}')],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [("get_weather", '{"city": "Paris"}')],
    ),
    (
        "llama3_json",
        '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": "};{"}}',
        "",
        [("a", '{"x": 1}'), ("b", '{"y": "};{"}')],
    ),
    (
        "llama3_json",
        'Let me check that.<|python_tag|>{"name": "search", "parameters": {"q": "llama 3"}}',
        "Let me check that.",
        [("search", '{"q": "llama 3"}')],
    ),
    ("llama3_json", '\n\n  {"name": "f", "parameters": {}}\n', "", [("f", "{}")]),
    (
        "llama3_json",
        '  <|python_tag|>{"name": "f", "parameters": {"k": [1, {"z": null}]}};',
        "",
        [("f", '{"k": [1, {"z": null}]}')],
    ),
    (
        "llama3_json",
        '{"name": "translate", "parameters": {"text": "naïve café 日本"}}',
        "",
        [("translate", '{"text": "naïve café 日本"}')],
    ),
    ("llama3_json", '{"name": "Bob", "age": 42}', '{"name": "Bob", "age": 42}', []),
    (
        "llama3_json",
        'Here: {"name": "f", "parameters": {}}',
        'Here: {"name": "f", "parameters": {}}',
        [],
    ),
    (
        "llama3_json",
        '{"name": "f", "parameters": {}} and more',
        '{"name": "f", "parameters": {}} and more',
        [],
    ),
    (
        "llama3_json",
        '{"name": "f", "parameters": {"a": }}',
        '{"name": "f", "parameters": {"a": }}',
        [],
    ),
    (
        "llama3_json",
        '{"name": "f", "parameters": {"a": "b',
        '{"name": "f", "parameters": {"a": "b',
        [],
    ),
    ("llama3_json", 'Sure<|python_tag|>print("hi")', 'Sure<|python_tag|>print("hi")', []),
    ("llama3_json", "The capital of France is Paris.", "The capital of France is Paris.", []),
    # -- mistral
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "",
        [("get_weather", '{"city": "Paris"}')],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"s": '
        '"]}[TOOL_CALLS]"}}]',
        "",
        [("a", '{"x": 1}'), ("b", '{"s": "]}[TOOL_CALLS]"}')],
    ),
    (
        "mistral",
        'Let me check.[TOOL_CALLS] [{"name": "f", "arguments": {}}]',
        "Let me check.",
        [("f", "{}")],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        "",
        [("get_weather", '{"city": "Paris"}')],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": '
        '"Europe/Paris"}',
        "",
        [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "Europe/Paris"}')],
    ),
    (
        "mistral",
        '[TOOL_CALLS]note[ARGS]{"text": "literal [TOOL_CALLS] and [ARGS] 📝", "n": {"d": [1]}}',
        "",
        [("note", '{"text": "literal [TOOL_CALLS] and [ARGS] 📝", "n": {"d": [1]}}')],
    ),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {}}]\nDone', "\nDone", [("f", "{}")]),
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}]',
        '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}]',
        [],
    ),
    ("mistral", '[TOOL_CALLS] [{"arguments": {}}]', '[TOOL_CALLS] [{"arguments": {}}]', []),
    ("mistral", "[TOOL_CALLS]f[ARGS][1, 2]", "[TOOL_CALLS]f[ARGS][1, 2]", []),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        [],
    ),
    ("mistral", "Use [TOOL_CALLS] to call tools.", "Use [TOOL_CALLS] to call tools.", []),
    ("mistral", "[TOOL_CALLS] []", "[TOOL_CALLS] []", []),
    ("mistral", "No tools needed [TOOL", "No tools needed [TOOL", []),
    # -- pythonic
    (
        "pythonic",
        '[get_weather(city="Paris", days=3)]',
        "",
        [("get_weather", '{"city": "Paris", "days": 3}')],
    ),
    (
        "pythonic",
        '[get_weather(city="Paris"), get_time()]',
        "",
        [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")],
    ),
    (
        "pythonic",
        '<|python_start|>[search(query="llama 4", filters={"year": 2025, "tags": ["ai", "}"]}, '
        "exact=True, limit=None)]<|python_end|>",
        "",
        [
            (
                "search",
                '{"query": "llama 4", "filters": {"year": 2025, "tags": ["ai", "}"]}, "exact": '
                'true, "limit": null}',
            )
        ],
    ),
    (
        "pythonic",
        "\n [f(x=1.5, y=-2, pt=(1, 2))] \n",
        "",
        [("f", '{"x": 1.5, "y": -2, "pt": [1, 2]}')],
    ),
    (
        "pythonic",
        '[traduire(texte="Où est 東京 ?")]',
        "",
        [("traduire", '{"texte": "Où est 東京 ?"}')],
    ),
    ("pythonic", "[math.sqrt(x=4)]", "", [("math.sqrt", '{"x": 4}')]),
    ("pythonic", '[get_weather("Paris")]', '[get_weather("Paris")]', []),
    ("pythonic", "[f(x=y)]", "[f(x=y)]", []),
    ("pythonic", "[f(s={1, 2})]", "[f(s={1, 2})]", []),
    ("pythonic", "[1, 2, 3]", "[1, 2, 3]", []),
    ("pythonic", "[]", "[]", []),
    ("pythonic", "The answer is [1, 2, 3].", "The answer is [1, 2, 3].", []),
    ("pythonic", '[get_weather(city="Par', '[get_weather(city="Par', []),
    ("pythonic", "Sure! [f()]", "Sure! [f()]", []),
    ("pythonic", "[f()] and then", "[f()] and then", []),
]

# (style, output, expected reasoning_content, expected content)
REASONING_CASES: list[tuple[str, str, str | None, str]] = [
    (
        "deepseek-r1",
        "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
        "Let me think.",
        "The answer is 4.",
    ),
    (
        "deepseek-r1",
        "Let me think.\n</think>\n\nThe answer is 4.",
        "Let me think.",
        "The answer is 4.",
    ),
    ("deepseek-r1", "Still thinking about it  ", "Still thinking about it", ""),
    ("deepseek-r1", "<think>\n\n</think>\n\nHi", None, "Hi"),
    ("deepseek-r1", "", None, ""),
    ("deepseek-r1", " <think>a </thin b</think>\n  c </think> d", "a </thin b", "  c </think> d"),
    ("deepseek-r1", "<think>\n東京は… 🤔\n</think>\n\n答え", "東京は… 🤔", "答え"),
    ("qwen3", "<think>\nStep 1.\n\nStep 2.\n</think>\n\nDone.", "Step 1.\n\nStep 2.", "Done."),
    ("qwen3", "Plain answer, thinking off.", None, "Plain answer, thinking off."),
    ("qwen3", "  \nHello <think", None, "  \nHello <think"),
    ("qwen3", "reasoning only</think>\n\nanswer", "reasoning only", "answer"),
    ("qwen3", "<think>never closed\n", "never closed", ""),
    ("qwen3", "<thinking>not a tag</thinking>", None, "<thinking>not a tag</thinking>"),
    ("qwen3", "<think>x</think>", "x", ""),
]


def _ids(cases: list[tuple]) -> list[str]:
    return [f"{c[0]}-{i}" for i, c in enumerate(cases)]


def _calls(pairs: list[tuple[str, str]]) -> list[ToolCall]:
    return [ToolCall(n, a) for n, a in pairs]


def stream_tools(parser: ToolParser, pieces: list[str]) -> tuple[str, list[ToolCall]]:
    """Run a streamer over pieces; check the delta rules; -> (content, calls) as parse gives
    them."""
    streamer = parser.streamer()
    content: list[str] = []
    names: list[str] = []
    args: list[list[str]] = []

    def take(out: tuple[str, list[ToolCallDelta]]) -> None:
        text, deltas = out
        content.append(text)
        for d in deltas:
            if d.index == len(names):  # a new call: its first delta names it
                assert d.name, f"first delta of call {d.index} has no name: {d}"
                names.append(d.name)
                args.append([])
            else:
                assert d.index < len(names), (
                    f"delta for call {d.index} before call {len(names)} was named"
                )
                assert d.name is None, f"name given again: {d}"
            args[d.index].append(d.arguments)

    for piece in pieces:
        take(streamer.feed(piece))
    take(streamer.finish())
    return "".join(content), [ToolCall(n, "".join(a)) for n, a in zip(names, args)]


def stream_reasoning(parser: ReasoningParser, pieces: list[str]) -> tuple[str, str]:
    streamer = parser.streamer()
    outs = [streamer.feed(p) for p in pieces] + [streamer.finish()]
    return "".join(r for r, _ in outs), "".join(c for _, c in outs)


def splits(text: str, seed: int) -> list[list[str]]:
    """Every 2-piece split, char by char, and 50 random splits."""
    out = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    out.append(list(text))
    rng = random.Random(seed)
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, min(len(text) + 1, 12))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    return out


# ---------------------------------------------------------------------- tool calls


@pytest.mark.parametrize("fmt, text, content, calls", TOOL_CASES, ids=_ids(TOOL_CASES))
def test_parse(fmt: str, text: str, content: str, calls: list[tuple[str, str]]) -> None:
    got_content, got_calls = get_parser(fmt).parse(text)
    assert (got_content, got_calls) == (content, _calls(calls))
    for c in got_calls:
        assert isinstance(json.loads(c.arguments), dict)


@pytest.mark.parametrize("fmt, text, content, calls", TOOL_CASES, ids=_ids(TOOL_CASES))
def test_stream_equals_parse(
    fmt: str, text: str, content: str, calls: list[tuple[str, str]]
) -> None:
    parser = get_parser(fmt)
    for pieces in splits(text, seed=len(text)):
        assert stream_tools(parser, pieces) == (content, _calls(calls)), pieces


# Three fragments that make valid calls (drawn half of the time), then pieces that break them.
FUZZ_FRAGMENTS = {
    "hermes": [
        '<tool_call>{"name": "f", "arguments": {"a": "}"}}</tool_call>',
        "<tool_call>\n",
        "\n</tool_call>",
        '{"name": "g"}',
        "<tool_",
        "call>",
        '{"name": "f"',
        ', "arguments": ',
        "{",
        "}",
        '"',
        "\\",
        "\n",
        " ",
        "x",
        '{"a": 1}',
        ":",
        ",",
    ],
    "llama3_json": [
        '{"name": "f", "parameters": {"a": ";"}}',
        '{"name": "g", "arguments": {}}',
        "; ",
        "<|python_tag|>",
        "<|python",
        '{"name": "f"',
        ', "parameters": ',
        "{",
        "}",
        ";",
        '"',
        "\\",
        "\n",
        " ",
        "x",
    ],
    "mistral": [
        '[TOOL_CALLS]f[ARGS]{"a": "]"}',
        '[TOOL_CALLS] [{"name": "g"}]',
        '[{"name": "h", "arguments": {}}]',
        "[TOOL_CALLS]",
        "[TOOL_",
        "[ARGS]",
        "f",
        '{"name": "f"',
        ', "arguments": ',
        "[",
        "]",
        "{",
        "}",
        '"',
        "\n",
        " ",
        '{"a": 1}',
        ",",
    ],
    "pythonic": [
        "[f(x=1), g(y='a')]",
        " ",
        "\n",
        "[g(",
        "f(",
        "x=",
        "1",
        '"s"',
        ")",
        ", ",
        "]",
        "<|python_start|>",
        "<|python_end|>",
        "[",
        "{",
        "}",
        "a",
        "'",
    ],
}


@pytest.mark.parametrize("fmt", sorted(FUZZ_FRAGMENTS))
def test_fuzz_stream_equals_parse(fmt: str) -> None:
    """Random texts made of the format's markers and JSON pieces: parse never raises, and any
    split streams to the same result."""
    rng = random.Random(1234)
    parser = get_parser(fmt)
    frags = FUZZ_FRAGMENTS[fmt]
    with_calls = 0
    for _ in range(400):
        text = "".join(
            rng.choice(frags[:3] if rng.random() < 0.5 else frags) for _ in range(rng.randint(0, 8))
        )
        expected = parser.parse(text)
        with_calls += bool(expected[1])
        for pieces in [list(text)] + splits(text, rng.randint(0, 10**6))[-3:]:
            assert stream_tools(parser, pieces) == expected, (text, pieces)
    assert with_calls >= 10  # the fuzz does reach valid calls


def test_fuzz_valid_calls_are_found() -> None:
    """Generated hermes calls with tricky strings around them all come back, in order."""
    rng = random.Random(7)
    parser = HermesParser()
    words = ["}", "{", "</tool_call>", "<tool_call>", '\\"', "é", "\\n", " ", "]"]
    for _ in range(100):
        specs = [
            (f"fn_{k}", {"s": "".join(rng.choice(words) for _ in range(5)), "n": [k, {"x": None}]})
            for k in range(rng.randint(1, 3))
        ]
        raw = [json.dumps(a, ensure_ascii=False) for _, a in specs]
        text = "pre\n" + "\n".join(
            f'<tool_call>\n{{"name": "{n}", "arguments": {r}}}\n</tool_call>'
            for (n, _), r in zip(specs, raw)
        )
        expected = ("pre\n", [ToolCall(n, r) for (n, _), r in zip(specs, raw)])
        assert parser.parse(text) == expected
        assert stream_tools(parser, list(text)) == expected


def test_hermes_stream_releases_content_at_once() -> None:
    s = get_parser("hermes").streamer()
    assert s.feed("Hello <tool") == ("Hello ", [])  # only the possible marker is held
    assert s.feed("ing is fun <") == ("<tooling is fun ", [])
    assert s.feed('tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call') == ("", [])
    assert s.feed(">") == ("", [ToolCallDelta(0, "f", '{"a": 1}')])  # emitted when complete
    assert s.feed("\n") == ("", [])  # whitespace after a call waits
    assert s.feed("Bye") == ("\nBye", [])
    assert s.finish() == ("", [])


def test_hermes_stream_releases_a_malformed_call_early() -> None:
    s = get_parser("hermes").streamer()
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>'  # a brace missing
    assert s.feed(text) == (text, [])  # known invalid at the '<': not held to the end


def test_mistral_stream_holds_only_a_partial_marker() -> None:
    s = get_parser("mistral").streamer()
    assert s.feed("abc [TOOL") == ("abc ", [])
    assert s.feed("_CALLS]get_weather[AR") == ("", [])
    assert s.feed('GS]{"city": "Paris"}') == (
        "",
        [ToolCallDelta(0, "get_weather", '{"city": "Paris"}')],
    )
    assert s.finish() == ("", [])


def test_llama3_stream_holds_only_possible_calls() -> None:
    s = get_parser("llama3_json").streamer()
    assert s.feed("Hi there <|pyth") == ("Hi there ", [])
    assert s.feed('on_tag|>{"name": "f", "parameters": {}}') == ("", [])  # held: text may follow
    assert s.finish() == ("", [ToolCallDelta(0, "f", "{}")])
    s = get_parser("llama3_json").streamer()
    assert s.feed(' {"name": "f", "parameters": {}}') == ("", [])
    assert s.feed(" x") == (' {"name": "f", "parameters": {}} x', [])  # cannot be calls any more


def test_pythonic_stream_holds_only_possible_calls() -> None:
    s = get_parser("pythonic").streamer()
    assert s.feed(" [get_") == ("", [])
    assert s.feed("weather(city='Paris')]") == ("", [])
    assert s.finish() == ("", [ToolCallDelta(0, "get_weather", '{"city": "Paris"}')])
    s = get_parser("pythonic").streamer()
    assert s.feed("[1") == ("[1", [])
    assert s.feed(", 2]") == (", 2]", [])
    assert s.finish() == ("", [])


def test_get_parser() -> None:
    assert sorted(PARSERS) == ["hermes", "llama3_json", "mistral", "pythonic"]
    for name, cls in PARSERS.items():
        parser = get_parser(name)
        assert isinstance(parser, cls) and parser.name == name
    with pytest.raises(ValueError) as err:
        get_parser("qwen")
    assert "'qwen'" in str(err.value)
    for name in PARSERS:
        assert name in str(err.value)


@pytest.mark.parametrize(
    "template, expected",
    [
        (None, "hermes"),
        ("", "hermes"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "hermes"),
        ('{{- "<tool_call>\\n" }}{{ tool_call | tojson }}{{- "\\n</tool_call>" }}', "hermes"),
        ("{{ '[TOOL_CALLS]' + tool_calls | tojson }}", "mistral"),
        ('{{- "<|python_tag|>" + tool_call.name }}', "llama3_json"),
        (
            'Respond as {"name": function name, "parameters": dict}. {% if m.role == "ipython" %}',
            "llama3_json",
        ),
        ("{{- '<|python_start|>[' }}{{ tool_call.name }}(", "pythonic"),
        ('"parameters" without the role', "hermes"),
    ],
)
def test_detect_parser(template: str | None, expected: str) -> None:
    assert detect_parser(template) == expected


def test_pure_stdlib() -> None:
    """The package imports nothing but the stdlib and itself (no torch, runtime or constrained)."""
    pkg = Path(__file__).resolve().parents[2] / "sgl" / "tool_calls"
    paths = sorted(pkg.rglob("*.py"))
    assert {"registry.py", "hermes.py", "pythonic.py"} <= {
        p.name for p in paths
    }  # the package was found
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert (
                    top in sys.stdlib_module_names
                    or name.startswith("sgl.tool_calls")
                    or top == "__future__"
                ), f"{path.name} imports {name}"


# ---------------------------------------------------------------------- reasoning


@pytest.mark.parametrize(
    "style, text, reasoning, content", REASONING_CASES, ids=_ids(REASONING_CASES)
)
def test_reasoning_parse(style: str, text: str, reasoning: str | None, content: str) -> None:
    assert ReasoningParser(style).parse(text) == (reasoning, content)


@pytest.mark.parametrize(
    "style, text, reasoning, content", REASONING_CASES, ids=_ids(REASONING_CASES)
)
def test_reasoning_stream_equals_parse(
    style: str, text: str, reasoning: str | None, content: str
) -> None:
    parser = ReasoningParser(style)
    for pieces in splits(text, seed=len(text)):
        assert stream_reasoning(parser, pieces) == (reasoning or "", content), pieces


@pytest.mark.parametrize("style", REASONING_STYLES)
def test_reasoning_fuzz(style: str) -> None:
    rng = random.Random(99)
    parser = ReasoningParser(style)
    frags = ["<think>", "</think>", "<thi", "nk>", "</", "\n", " ", "a", "b c", "\n\n"]
    for _ in range(300):
        text = "".join(rng.choice(frags) for _ in range(rng.randint(0, 10)))
        reasoning, content = parser.parse(text)
        for pieces in [list(text)] + splits(text, rng.randint(0, 10**6))[-3:]:
            assert stream_reasoning(parser, pieces) == (reasoning or "", content), (text, pieces)


def test_reasoning_stream_holds_only_what_is_undecided() -> None:
    s = ReasoningParser("deepseek-r1").streamer()
    assert s.feed("<think>\n") == ("", "")
    assert s.feed("Let me see ") == ("Let me see", "")  # the trailing space waits
    assert s.feed("now.</thi") == (" now.", "")
    assert s.feed("nk>\n\nIt is") == ("", "It is")
    assert s.finish() == ("", "")
    s = ReasoningParser("qwen3").streamer()  # no <think>: reasoning only if </think> comes
    assert s.feed("Hello") == ("", "")
    assert s.finish() == ("", "Hello")


def test_reasoning_unknown_style() -> None:
    with pytest.raises(ValueError, match="'o1'.*qwen3.*deepseek-r1"):
        ReasoningParser("o1")
    assert REASONING_STYLES == ("qwen3", "deepseek-r1")
