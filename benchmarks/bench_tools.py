"""Function calling with and without the constraint, on the embedded model.

A BFCL-style set of our own: six functions with nested objects, enums, arrays, bounds and
patterns, and twelve requests that each call for one of them. Every request is rendered as
the server renders it (the tools in a system message, Hermes syntax: the embedded model's
template takes no tools) and sampled `--samples` times at temperature `--temperature`:

* constrained: `tool_choice="required"`, i.e. the structural tag the server builds;
* unconstrained: the same prompt with no constraint (what servers without constrained
  tool calling give).

Each output is parsed with the Hermes parser. Reported: the share of outputs with a
well-formed call (parsed, to a declared function), the share whose arguments validate with
`jsonschema` against the parameters, the median time per request (same token cap) and per
output token (request time over its longest output's tokens: the n samples decode together;
forced text emitted by jump-forward makes some constrained tokens cost no decode step).

    .venv/bin/python benchmarks/bench_tools.py [--samples 8] [--temperature 0.7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import print_table, write_result  # noqa: E402

import sgl  # noqa: E402
from sgl.server.openai_tools import history_as_text, parse_tools, tool_constraint  # noqa: E402
from sgl.tool_calls import get_parser  # noqa: E402

ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string", "maxLength": 40},
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
    },
    "required": ["city", "country"],
    "additionalProperties": False,
}
FUNCTIONS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "book_flight": {
        "type": "object",
        "properties": {
            "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "date": {"type": "string", "pattern": "^2026-[01][0-9]-[0-3][0-9]$"},
            "class": {"enum": ["economy", "business", "first"]},
            "passengers": {
                "type": "array",
                "minItems": 1,
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 30},
                        "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    },
                    "required": ["name", "age"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["from", "to", "date", "passengers"],
        "additionalProperties": False,
    },
    "send_email": {
        "type": "object",
        "properties": {
            "to": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {"type": "string", "pattern": "^[a-z.]{1,12}@[a-z]{1,12}\\.(com|org)$"},
            },
            "subject": {"type": "string", "maxLength": 60},
            "body": {"type": "string", "maxLength": 200},
            "priority": {"enum": ["low", "normal", "high"]},
        },
        "required": ["to", "subject", "body"],
        "additionalProperties": False,
    },
    "create_event": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "start": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
            "duration_min": {"type": "integer", "minimum": 5, "maximum": 480},
            "location": ADDRESS,
            "reminders": {
                "type": "array",
                "maxItems": 3,
                "items": {"type": "integer", "minimum": 0, "maximum": 1440},
            },
        },
        "required": ["title", "start", "duration_min"],
        "additionalProperties": False,
    },
    "convert_currency": {
        "type": "object",
        "properties": {
            "amount": {"type": "number", "minimum": 0},
            "from": {"enum": ["EUR", "USD", "GBP", "JPY"]},
            "to": {"enum": ["EUR", "USD", "GBP", "JPY"]},
        },
        "required": ["amount", "from", "to"],
        "additionalProperties": False,
    },
    "ship_order": {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
            "address": ADDRESS,
            "express": {"type": "boolean"},
        },
        "required": ["order_id", "address"],
        "additionalProperties": False,
    },
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": n, "description": n.replace("_", " ") + ".", "parameters": p},
    }
    for n, p in FUNCTIONS.items()
]
REQUESTS = [
    "What's the weather in Lisbon this week, in celsius?",
    "Give me a 3-day forecast for Denver in fahrenheit.",
    "Book me an economy flight from JFK to LHR on 2026-03-14 for Ana (34) and Ben (36).",
    "I need a business class seat from SFO to NRT on 2026-07-02, passenger Kim, age 51.",
    "Email bob@example.com with the subject 'Lunch' and say I'm running late.",
    "Send a high priority email to ops@acme.org and lee@acme.org: the server is down.",
    "Put a 45 minute meeting called Standup at 09:30 in my calendar, remind me 10 minutes before.",
    "Create an event 'Dentist' at 14:00 for one hour at 12 Rue Cler, Paris, FR.",
    "How many yen is 250 euros?",
    "Convert 99.5 USD to GBP.",
    "Ship order ORD-123456 to 5 Main St, Austin, US by express.",
    "Please send order ORD-000042 to Berlin, DE.",
]


def outcome(text: str, parser) -> tuple[bool, bool]:
    """(a well-formed call to a declared function, all its calls' arguments valid)."""
    _content, calls = parser.parse(text)
    calls = [c for c in calls if c.name in FUNCTIONS]
    if not calls:
        return False, False
    try:
        for c in calls:
            jsonschema.validate(json.loads(c.arguments), FUNCTIONS[c.name])
    except (ValueError, jsonschema.ValidationError):
        return True, False
    return True, True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=200)
    args = ap.parse_args()
    engine = sgl.Engine(model_path="default")
    parser = get_parser("hermes")
    tools = parse_tools(TOOLS, "required", True)
    tag, _ = tool_constraint(tools, "hermes")
    modes = {"constrained": {"structural_tag": tag}, "unconstrained": {}}
    engine.generate(
        "Hi", {"structural_tag": tag, "max_new_tokens": 1}
    )  # compile the tag (cached) before timing
    counts = {
        m: {"outputs": 0, "well_formed": 0, "valid": 0, "latency_s": [], "ms_per_token": []}
        for m in modes
    }
    for i, ask in enumerate(REQUESTS):
        prompt = engine.render_messages(
            history_as_text([{"role": "user", "content": ask}], tools, "hermes")
        )
        for mode, extra in modes.items():  # interleaved
            sampling = {
                "temperature": args.temperature,
                "max_new_tokens": args.max_tokens,
                "n": args.samples,
                "seed": i,
                **extra,
            }
            t = time.perf_counter()
            outs = engine.generate(prompt, sampling)
            elapsed = time.perf_counter() - t
            counts[mode]["latency_s"].append(elapsed)
            counts[mode]["ms_per_token"].append(
                1000 * elapsed / max(o["meta_info"]["completion_tokens"] for o in outs)
            )
            for o in outs:
                formed, valid = outcome(o["text"], parser)
                c = counts[mode]
                c["outputs"] += 1
                c["well_formed"] += formed
                c["valid"] += valid
    engine.shutdown()
    rows, results = (
        [],
        {
            "samples": args.samples,
            "temperature": args.temperature,
            "requests": len(REQUESTS),
            "functions": len(FUNCTIONS),
            "modes": {},
        },
    )
    for mode, c in counts.items():
        entry = {
            "outputs": c["outputs"],
            "well_formed_rate": round(c["well_formed"] / c["outputs"], 3),
            "schema_valid_rate": round(c["valid"] / c["outputs"], 3),
            "median_request_s": round(statistics.median(c["latency_s"]), 3),
            "median_ms_per_token": round(statistics.median(c["ms_per_token"]), 2),
        }
        results["modes"][mode] = entry
        rows.append(
            (
                mode,
                entry["outputs"],
                f"{entry['well_formed_rate']:.1%}",
                f"{entry['schema_valid_rate']:.1%}",
                f"{entry['median_request_s']:.2f}",
                f"{entry['median_ms_per_token']:.1f}",
            )
        )
    results["constraint_per_token_ratio"] = round(
        results["modes"]["constrained"]["median_ms_per_token"]
        / results["modes"]["unconstrained"]["median_ms_per_token"],
        2,
    )
    print_table(
        f"Function calling on the embedded model: {len(REQUESTS)} requests x {args.samples} "
        "samples, "
        f"temperature {args.temperature}",
        rows,
        (
            "mode",
            "outputs",
            "well-formed call",
            "schema-valid arguments",
            f"median s / request (n={args.samples})",
            "median ms / token (request time / its longest output)",
        ),
    )
    write_result("tools", results)


if __name__ == "__main__":
    main()
