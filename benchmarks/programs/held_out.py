"""Two more of the paper's program workloads, written after the engine work on the others and
never tuned on (the issue's held-out check): tree of thought (nested forks, a select at each
leaf) and LLM-as-judge (branch-solve-merge: a fork per dimension, then a merge that reads every
branch's answer). Same rules as workloads.py: the plain form sends the same text at every call.
"""

from __future__ import annotations

import sgl

from .data import paragraph, seeded, sentence
from .plain_client import Completions

# ----------------------------------------------------------------------------- tree of thought

TOT_APPROACHES, TOT_ATTEMPTS = 3, 2
VERDICTS = ["yes", "no"]


def _tot_prompt(question: str) -> str:
    return f"Solve the problem step by step, exploring several approaches.\nProblem: {question}\n"


@sgl.function
def tree_of_thought(s, question):
    s += _tot_prompt(question)
    approaches = s.fork(TOT_APPROACHES)
    for i, a in enumerate(approaches, 1):
        a += f"Approach {i}:"
        a += sgl.gen("plan", max_tokens=32, ignore_eos=True)
        attempts = a.fork(TOT_ATTEMPTS)
        for j, t in enumerate(attempts, 1):
            t += f"\nAttempt {j}:"
            t += sgl.gen("attempt", max_tokens=32, ignore_eos=True)
            t += "\nIs this attempt correct?"
            t += sgl.select("verdict", choices=VERDICTS)
        attempts.join()
    approaches.join()


def plain_tree_of_thought(c: Completions, question: str) -> dict:
    def approach(i: int) -> list[str]:
        prompt = _tot_prompt(question) + f"Approach {i}:"
        prompt += c.complete(prompt, 32, ignore_eos=True)

        def attempt(j: int) -> str:
            text = prompt + f"\nAttempt {j}:"
            text += c.complete(text, 32, ignore_eos=True)
            return c.choose(text + "\nIs this attempt correct?", VERDICTS)

        return c.concurrently([(lambda j=j: attempt(j)) for j in range(1, TOT_ATTEMPTS + 1)])

    return {
        "verdict": c.concurrently([(lambda i=i: approach(i)) for i in range(1, TOT_APPROACHES + 1)])
    }


def tree_of_thought_items(n: int, seed: int) -> list[dict]:
    return [{"question": sentence(seeded(seed, "tot", i), 14)[:-1] + "?"} for i in range(n)]


# ----------------------------------------------------------------------------- LLM as judge

DIMENSIONS = ["helpfulness", "accuracy", "clarity", "depth"]


def _judge_prompt(question: str, answer: str) -> str:
    return f"Evaluate the answer to the question.\nQuestion: {question}\nAnswer: {answer}\n"


def _merge_text(judgements: list[str]) -> str:
    return (
        "Judgements:\n"
        + "".join(f"- {d}:{j}\n" for d, j in zip(DIMENSIONS, judgements))
        + "Overall score (1-10):"
    )


@sgl.function
def llm_judge(s, question, answer):
    s += _judge_prompt(question, answer)
    forks = s.fork(len(DIMENSIONS))
    for f, dim in zip(forks, DIMENSIONS):
        f += f"Judge the answer's {dim} in two sentences:"
        f += sgl.gen("judgement", max_tokens=48, ignore_eos=True)
    forks.join()
    s += _merge_text([f["judgement"] for f in forks])
    s += sgl.gen("score", max_tokens=4, stop="\n")


def plain_llm_judge(c: Completions, question: str, answer: str) -> dict:
    prompt = _judge_prompt(question, answer)
    judgements = c.concurrently(
        [
            (
                lambda dim=dim: c.complete(
                    prompt + f"Judge the answer's {dim} in two sentences:", 48, ignore_eos=True
                )
            )
            for dim in DIMENSIONS
        ]
    )
    return {
        "judgement": judgements,
        "score": c.complete(prompt + _merge_text(judgements), 4, stop="\n"),
    }


def llm_judge_items(n: int, seed: int) -> list[dict]:
    items = []
    for i in range(n):
        rng = seeded(seed, "judge", i)
        items.append({"question": sentence(rng, 12)[:-1] + "?", "answer": paragraph(rng, 4)})
    return items
