"""Constrained decoding: regex, JSON schema and an EBNF grammar on the embedded model,
budget-aware completion for each, and the same schema through llguidance / xgrammar
(grammar_backend) when they are installed.

    .venv/bin/python examples/constrained_decoding.py
"""

import json

import sgl

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
        "population_millions": {"type": "number"},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "country", "population_millions", "is_capital"],
    "additionalProperties": False,
}

EMAIL = r"[a-z]+@[a-z]+\.(com|org)"

GRAMMAR = r"""
root ::= "[" item ("," item)* "]"
item ::= "\"" [a-z]+ "\""
"""


def chat(engine: sgl.Engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def main() -> None:
    with sgl.Engine(model_path="default") as engine:
        out = engine.generate(
            chat(engine, "Describe Paris as JSON."),
            {"json_schema": SCHEMA, "temperature": 0, "max_new_tokens": 96},
        )
        print("json_schema:", json.loads(out["text"]))

        # Budget-aware completion (on by default): sampled freely, yet the e-mail address is
        # complete within 8 tokens; with budget_aware=False some of these get cut.
        params = {"regex": EMAIL, "temperature": 1.0, "max_new_tokens": 8, "n": 4, "seed": 1}
        outs = engine.generate(chat(engine, "Invent a very long e-mail address."), params)
        print("budget:", json.dumps([o["text"] for o in outs]))
        outs = engine.generate(
            chat(engine, "Invent a very long e-mail address."), {**params, "budget_aware": False}
        )
        print("no budget:", json.dumps([o["text"] for o in outs]))

        out = engine.generate(
            chat(engine, "What time is lunch?"),
            {"regex": r"([01][0-9]|2[0-3]):[0-5][0-9]", "temperature": 0, "max_new_tokens": 8},
        )
        print("regex:", out["text"])

        out = engine.generate(
            chat(engine, "List three fruits."),
            {"ebnf": GRAMMAR, "temperature": 0, "max_new_tokens": 32},
        )
        print("ebnf:", out["text"], out["meta_info"]["finish_reason"])
        # Grammars are budget-aware too: a list of fruits that must close within 12 tokens.
        outs = engine.generate(
            chat(engine, "List many fruits."),
            {"ebnf": GRAMMAR, "temperature": 1.0, "max_new_tokens": 12, "n": 4, "seed": 2},
        )
        print("ebnf budget:", json.dumps([o["text"] for o in outs]))

        info = engine.get_server_info()
        print(
            f"jump-forward tokens: {info['jump_forward_tokens']}, forward steps: "
            f"{info['forward_steps']}"
        )

    from sgl.constrained.backends import available_backends

    for backend in available_backends()[1:]:  # the other engines, behind the same contract
        with sgl.Engine(model_path="default", grammar_backend=backend) as engine:
            out = engine.generate(
                chat(engine, "Describe Paris as JSON."),
                {"json_schema": SCHEMA, "temperature": 0, "max_new_tokens": 96},
            )
            print(f"{backend}:", json.loads(out["text"]))


if __name__ == "__main__":
    main()
