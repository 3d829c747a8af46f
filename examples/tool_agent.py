"""A tool-using agent: the model calls Python functions, the results go back into the
conversation, and it answers (a ReAct-style loop).

    .venv/bin/python examples/tool_agent.py [--url http://127.0.0.1:30000]

`sgl.gen(..., tools=[...])` constrains every call to a declared function with arguments
valid against the schema read from its type annotations, so `fn(**call["arguments"])`
cannot fail on a malformed call. The first step requires a call, later ones may answer in
text. With `--url`, the same loop runs through a server's OpenAI API (`tools=`), as an
agent framework would drive it. (The embedded model is tiny: its calls are well-formed,
not necessarily wise.)
"""

import argparse
import json
from typing import Literal

import sgl
from sgl.tool_calls import function_tool

FORECASTS = {"paris": ("sunny", 21), "oslo": ("snow", -4), "lima": ("cloudy", 17)}


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict:
    """The current weather in a city."""
    sky, celsius = FORECASTS.get(city.strip().lower(), ("unknown", 15))
    return {
        "city": city,
        "sky": sky,
        "temperature": celsius if unit == "celsius" else round(celsius * 9 / 5 + 32),
    }


def convert_temperature(value: float, to: Literal["celsius", "fahrenheit"]) -> float:
    """Convert a temperature to the other unit."""
    return round(value * 9 / 5 + 32, 1) if to == "fahrenheit" else round((value - 32) * 5 / 9, 1)


TOOLS = [get_weather, convert_temperature]
BY_NAME = {f.__name__: f for f in TOOLS}


@sgl.function
def agent(s, question, steps=2):
    s += sgl.system(sgl.tools_prompt(TOOLS))
    s += sgl.user(question)
    for step in range(steps):
        choice = "required" if step == 0 else "auto"
        s += sgl.assistant(
            sgl.gen(f"calls_{step}", tools=TOOLS, tool_choice=choice, max_tokens=120)
        )
        calls = s[f"calls_{step}"]
        if not calls:  # it answered in text
            return
        results = []
        for call in calls:
            result = BY_NAME[call["name"]](**call["arguments"])
            print(f"call: {call['name']} {json.dumps(call['arguments'])} -> {json.dumps(result)}")
            results.append(f"<tool_response>\n{json.dumps(result)}\n</tool_response>")
        s += sgl.user("\n".join(results))
    s += sgl.assistant(sgl.gen("answer", max_tokens=40))


def through_openai_api(url: str, question: str) -> None:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    tools = [function_tool(f) for f in TOOLS]
    messages = [{"role": "user", "content": question}]
    for _ in range(2):
        msg = (
            client.chat.completions.create(
                model="default", messages=messages, tools=tools, temperature=0, max_tokens=120
            )
            .choices[0]
            .message
        )
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            print(f"api answer: {msg.content}")
            return
        for call in msg.tool_calls:
            result = BY_NAME[call.function.name](**json.loads(call.function.arguments))
            print(
                f"api call: {call.function.name} {call.function.arguments} -> {json.dumps(result)}"
            )
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--url", default=None, help="also run the loop through this server's OpenAI API"
    )
    args = ap.parse_args()
    for question in [
        "What's the weather in Paris?",
        "Is it cold in Oslo right now, in fahrenheit?",
    ]:
        state = agent.run(question=question, temperature=0)
        print(f"answer: {state.messages()[-1]['content'].strip()}")
    if args.url:
        through_openai_api(args.url, "What's the weather in Lima?")


if __name__ == "__main__":
    main()
