"""Quick start for the frontend language: a multi-turn chat program, run and streamed.

    .venv/bin/python examples/quick_start.py

No backend is set, so the first run starts the embedded model (SmolLM2-135M-Instruct) in
process. On SGLang, the same program runs after `import sglang as sgl` and
`sgl.set_default_backend(sgl.RuntimeEndpoint("http://localhost:30000"))`.
"""

import sgl


@sgl.function
def multi_turn_question(s, question_1, question_2):
    s += sgl.system("You are a helpful assistant. Answer in one short sentence.")
    s += sgl.user(question_1)
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=32))
    s += sgl.user(question_2)
    s += sgl.assistant(sgl.gen("answer_2", max_tokens=32))


def single() -> None:
    state = multi_turn_question.run(
        question_1="What is the capital of France?",
        question_2="What is a famous landmark there?",
        temperature=0,
    )
    print("answer_1:", state["answer_1"])
    print("answer_2:", state["answer_2"])
    print("messages:")
    for m in state.messages():
        print(f"  {m['role']:>9}: {m['content']}")


def stream() -> None:
    state = multi_turn_question.run(
        question_1="Name a fruit that is yellow.",
        question_2="What colour is it when it is not ripe?",
        temperature=0,
        stream=True,
    )
    # text_iter() yields the whole text (role markers included) as it is produced;
    # text_iter("answer_2") would yield only that variable's pieces.
    print("stream:")
    for piece in state.text_iter():
        print(piece, end="", flush=True)
    print()
    print("streamed answer_2:", state["answer_2"])


if __name__ == "__main__":
    single()
    stream()
