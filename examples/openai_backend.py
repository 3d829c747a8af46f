"""sgl programs on an OpenAI-compatible API: here sgl's own server, as a chat and as a completion
model.

    python -m sgl.launch_server --model-path default --port 30000 &     # or: make serve
    python examples/openai_backend.py [--base-url http://127.0.0.1:30000/v1]

The same backend works with vLLM, llama.cpp's llama-server, SGLang or OpenAI itself
(`sgl.OpenAI("gpt-4o-mini")` with OPENAI_API_KEY set); what each can enforce differs (README).
"""

from __future__ import annotations

import argparse

import sgl


@sgl.function
def qa(s, question):
    s += sgl.system("You are a terse assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=32))


@sgl.function(num_api_spec_tokens=48)
def person(s):
    s += "Name: Alice\nAge: 30\nCity: Paris\n\nName: Bob\nAge: 25\nCity: London\n\nName:"
    s += (
        sgl.gen("name", max_tokens=8, stop="\n")
        + "\nAge:"
        + sgl.gen("age", max_tokens=4, stop="\n")
    )
    s += "\nCity:" + sgl.gen("city", max_tokens=8, stop="\n")


@sgl.function
def review(s, text):
    s += f"Review: {text}\nSentiment:" + sgl.select("label", [" positive", " negative"])
    s += "\nStars (1-5): " + sgl.gen_int("stars", max_tokens=2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:30000/v1")
    ap.add_argument("--model", default="default")
    args = ap.parse_args()

    chat_model = sgl.OpenAI(args.model, base_url=args.base_url)
    print("server kind:", chat_model.server_kind)
    state = qa.run(question="What is the capital of France?", temperature=0, backend=chat_model)
    print("chat:", repr(state["answer"]), state.get_meta_info("answer")["finish_reason"])

    text_model = sgl.OpenAICompatible(args.model, args.base_url, is_chat_model=False)
    state = review.run(text="Lovely staff, great food.", temperature=0, backend=text_model)
    print(
        "select:",
        repr(state["label"]),
        "by",
        state.get_meta_info("label")["select_method"],
        "| stars:",
        state["stars"],
    )

    text_model.token_usage.reset()
    state = person.run(temperature=0, backend=text_model)
    print(
        "3 gens, speculative:",
        {k: state[k] for k in ("name", "age", "city")},
        text_model.token_usage.snapshot(),
    )

    try:  # text after the start of the assistant turn cannot be sent to a chat model

        @sgl.function
        def mid_turn(s):
            s += sgl.user("Hi")
            with s.assistant():
                s += "Sure: " + sgl.gen("a", max_tokens=4)

        mid_turn.run(backend=chat_model)
    except sgl.ProgramError as e:
        print("refused:", e.__cause__)


if __name__ == "__main__":
    main()
