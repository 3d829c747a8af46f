"""Extract structured data as JSON: with a JSON schema, and with regexes inside a var_scope.

    .venv/bin/python examples/json_extraction.py

Constrained decoding guarantees the shape of the output, so `json.loads` always succeeds
(the values are only as good as the tiny embedded model).
"""

import json

import sgl

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}

WORDS = r"[A-Za-z][A-Za-z .'-]{0,23}"  # a name or a city, without quotes

TEXTS = [
    "Alice Smith is 34 years old and lives in Paris.",
    "Bob, aged 27, moved to Berlin last year.",
]


@sgl.function
def extract_with_schema(s, text):
    s += sgl.system("You extract information from text as JSON.")
    s += sgl.user("Extract the person's name, age and city from this text:\n" + text)
    s += sgl.assistant(sgl.gen("json", json_schema=json.dumps(SCHEMA), max_tokens=64))


@sgl.function
def extract_with_regex(s, text):
    s += sgl.system("You extract information from text as JSON.")
    s += sgl.user("Extract the person's name, age and city from this text:\n" + text)
    with s.assistant():
        # The var_scope captures all text added inside it: the literal JSON skeleton and
        # the three regex-constrained generations. Each regex ends with the character the
        # model wants to write next (a closing quote, a comma), so it can finish cleanly.
        with s.var_scope("json"):
            s += '{"name": ' + sgl.gen("name", regex='"' + WORDS + '"', max_tokens=12)
            s += ', "age": ' + sgl.gen("age", regex=r"[0-9]{1,3},", max_tokens=4)
            s += ' "city": ' + sgl.gen("city", regex='"' + WORDS + '"', max_tokens=12) + "}"


def main() -> None:
    for text in TEXTS:
        print("text:", text)
        state = extract_with_schema.run(text=text, temperature=0)
        print("json_schema:", json.dumps(json.loads(state["json"])))
        state = extract_with_regex.run(text=text, temperature=0)
        print("regex:", json.dumps(json.loads(state["json"])))
        print(f"  fields: name={state['name']} age={state['age'].rstrip(',')} city={state['city']}")


if __name__ == "__main__":
    main()
