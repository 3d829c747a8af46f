"""Parallelism inside a program: fork the state, generate in every branch, join.

    .venv/bin/python examples/parallel_fork.py

Branches continue from the same text, so they share its cached prefix, and they
generate concurrently (the engine batches them).
"""

import sgl

TIPS = ["Eat a balanced diet.", "Exercise regularly."]


@sgl.function
def tip_suggestion(s, topic):
    s += sgl.system("You are a helpful assistant who gives short, useful tips.")
    s += sgl.user("Give two tips for " + topic + ".")
    s += sgl.assistant("1. " + TIPS[0] + "\n2. " + TIPS[1])

    forks = s.fork(2)
    for tip, f in zip(TIPS, forks):
        f += sgl.user(f'Why is "{tip}" good advice? Answer in one sentence.')
        f += sgl.assistant(sgl.gen("detailed_tip", max_tokens=40, stop="\n"))

    # The default join ("gather_variable") waits for the branches and makes each
    # variable they set a list in s, in fork order; the branches stay readable too.
    forks.join()
    s += sgl.user(
        "Tip 1: " + forks[0]["detailed_tip"] + "\n"
        "Tip 2: " + forks[1]["detailed_tip"] + "\n"
        "Summarize both tips in one sentence."
    )
    s += sgl.assistant(sgl.gen("summary", max_tokens=40, stop="\n"))


@sgl.function
def animal_facts(s, animal):
    s += "Three short facts about " + animal + ".\n"
    forks = s.fork(3)
    for i, f in enumerate(forks):
        aspect = ["diet", "habitat", "size"][i]
        f += f"Fact {i + 1}, about their {aspect}: {animal.capitalize()}"
        f += sgl.gen("fact", max_tokens=24, stop="\n") + "\n"
    # concate_and_append: each branch's new text is appended to s, in fork order, so the
    # summary is generated after all three facts.
    forks.join(mode="concate_and_append")
    s += "In one sentence, " + animal + sgl.gen("summary", max_tokens=24, stop="\n")
    return [f["fact"].strip() for f in forks]  # the program's return value: state.ret_value


def main() -> None:
    state = tip_suggestion.run(topic="staying healthy", temperature=0)
    for i, tip in enumerate(state["detailed_tip"]):
        print(f"tip branch {i}: {tip}")
    print("summary:", state["summary"])

    state = animal_facts.run(animal="elephants", temperature=0)
    for i, fact in enumerate(state.ret_value):
        print(f"fact branch {i}: {fact}")
    print("joined text:")
    print(state.text())


if __name__ == "__main__":
    main()
