"""Constrained decoding: regex, JSON schema and an EBNF grammar on the embedded model.

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

GRAMMAR = r"""
root ::= "[" item ("," item)* "]"
item ::= "\"" [a-z]+ "\""
"""


def chat(engine: sgl.Engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                add_generation_prompt=True)


def main() -> None:
    with sgl.Engine(model_path="default") as engine:
        out = engine.generate(chat(engine, "Describe Paris as JSON."),
                              {"json_schema": SCHEMA, "temperature": 0, "max_new_tokens": 96})
        print("json_schema:", json.loads(out["text"]))

        out = engine.generate(chat(engine, "What time is lunch?"),
                              {"regex": r"([01][0-9]|2[0-3]):[0-5][0-9]", "temperature": 0, "max_new_tokens": 8})
        print("regex:", out["text"])

        out = engine.generate(chat(engine, "List three fruits."),
                              {"ebnf": GRAMMAR, "temperature": 0, "max_new_tokens": 32})
        print("ebnf:", out["text"], out["meta_info"]["finish_reason"])

        info = engine.get_server_info()
        print(f"jump-forward tokens: {info['jump_forward_tokens']}, forward steps: {info['forward_steps']}")


if __name__ == "__main__":
    main()
