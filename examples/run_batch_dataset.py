"""Run a program over a small dataset with run_batch and score the answers.

    .venv/bin/python examples/run_batch_dataset.py

Reads examples/data/questions.jsonl (one {"question", "answer"} object per line), answers
every question concurrently, prints the results in input order and a crude score: exact
match, and the expected answer contained in the prediction as a word (case-insensitive).
"""

import json
import re
from pathlib import Path

import sgl

DATA = Path(__file__).resolve().parent / "data" / "questions.jsonl"


@sgl.function
def answer_question(s, question):
    s += sgl.system("Answer the question with a single word or number.")
    # Two example turns: constant text that run_batch computes into the cache once.
    s += sgl.user("What is the capital of Germany?")
    s += sgl.assistant("Berlin")
    s += sgl.user("How many legs does a dog have?")
    s += sgl.assistant("4")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=16, stop="\n"))


def main() -> None:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    states = answer_question.run_batch(
        [{"question": row["question"]} for row in rows],
        temperature=0,
        num_threads="auto",
        progress_bar=True,
    )

    exact = contains = 0
    for i, (row, state) in enumerate(zip(rows, states)):
        pred = state["answer"].strip()
        expected = row["answer"]
        is_exact = pred.lower().rstrip(".") == expected.lower()
        is_contained = (
            re.search(r"\b" + re.escape(expected.lower()) + r"\b", pred.lower()) is not None
        )
        exact += is_exact
        contains += is_contained
        verdict = "exact" if is_exact else "contains" if is_contained else "miss"
        print(f"result {i:02d}: {row['question']} -> {pred!r} (expected {expected!r}: {verdict})")
    n = len(rows)
    print(f"score: exact {exact}/{n}, contains {contains}/{n}")


if __name__ == "__main__":
    main()
