"""The workloads, each as an sgl program and as the plain calls a vLLM or llama.cpp user writes.

Every `plain_*` function sends, at each generation, exactly the prompt text the sgl program
has at that point (`tests/unit/test_program_workloads.py` checks it with recording backends):
the same text, the same stops and constraints, a fork's branches sent at once. What differs
is only who keeps the state: the sgl runtime (prefix cache, shipped programs, fork admission)
or the client re-sending the whole prompt at every call.

Sizes follow the paper's scripts where they say (5 shots per MMLU subject, 20 HellaSwag shots,
4 chat turns of 4-8 or 256 tokens), scaled so that a 2-core CPU finishes a run in minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sgl

from . import held_out
from .data import SUBJECTS, mcq, paragraph, seeded, sentence
from .plain_client import Completions

# -------------------------------------------------------------------------- few-shot QA (MMLU-like)


def _mcq_block(question: str, options: list[str], answer: str | None) -> str:
    lines = [
        f"Question: {question}",
        *(f"{letter}. {o}" for letter, o in zip("ABCD", options)),
        "Answer:",
    ]
    return "\n".join(lines) + (f" {answer}\n\n" if answer else "")


@sgl.function
def few_shot_qa(s, shots, question):
    s += shots + question
    s += sgl.gen("answer", max_tokens=1)


def plain_few_shot_qa(c: Completions, shots: str, question: str) -> dict:
    return {"answer": c.complete(shots + question, 1)}


def few_shot_qa_items(n: int, seed: int) -> list[dict]:
    """5 shots per subject, shared by its questions: 8 questions per subject, as MMLU's subjects
    hold many."""
    items = []
    for i in range(n):
        subject = SUBJECTS[(i // 8) % len(SUBJECTS)]
        rng = seeded(seed, "shots", subject)
        shots = f"The following are multiple choice questions about {subject}.\n\n" + "".join(
            _mcq_block(*mcq(rng)) for _ in range(5)
        )
        question, options, _ = mcq(seeded(seed, "question", i))
        items.append({"shots": shots, "question": _mcq_block(question, options, None)})
    return items


# -------------------------------------------------------------------------- select (HellaSwag-like)


@sgl.function
def hellaswag(s, shots, context, endings):
    s += shots + context
    s += sgl.select("ending", choices=endings)


def plain_hellaswag(c: Completions, shots: str, context: str, endings: list[str]) -> dict:
    return {"ending": c.choose(shots + context, endings)}


def hellaswag_items(n: int, seed: int) -> list[dict]:
    """20 shots (context and its ending) shared by every item, then a context and 4 endings."""
    rng = seeded(seed, "hellaswag-shots")
    shots = "".join(f"{sentence(rng, 12)} {sentence(rng, 8)}\n\n" for _ in range(20))
    items = []
    for i in range(n):
        rng = seeded(seed, "hellaswag", i)
        items.append(
            {
                "shots": shots,
                "context": sentence(rng, 14),
                "endings": [" " + sentence(rng, rng.randint(6, 10)) for _ in range(4)],
            }
        )
    return items


# ----------------------------------------------------------------------------- ReAct-style agent

REACT_STEPS = 4


def _react_instruction(seed: int) -> str:
    rng = seeded(seed, "react-instruction")
    examples = "".join(
        f"Question: {sentence(rng, 10)[:-1]}?\n"
        + "".join(
            f"Thought {k}: {sentence(rng, 12)}\nAction {k}: Search[{rng.choice(SUBJECTS)}]\n"
            f"Observation {k}: {paragraph(rng, 2)}\n"
            for k in (1, 2, 3)
        )
        + "\n"
        for _ in range(2)
    )
    return (
        "Solve a question answering task with interleaving Thought, Action, Observation steps. "
        "Thought can reason about the current situation, and Action can be Search[entity], which "
        "searches the entity and returns a paragraph, or Finish[answer].\nHere are some "
        "examples.\n\n" + examples
    )


@sgl.function
def react(s, instruction, question, observations):
    s += instruction + f"Question: {question}\n"
    for k, observation in enumerate(observations, 1):
        s += f"Thought {k}:"
        s += sgl.gen(f"thought_{k}", max_tokens=48, stop="Observation")
        s += f"Observation {k}: {observation}\n"


def plain_react(c: Completions, instruction: str, question: str, observations: list[str]) -> dict:
    prompt, out = instruction + f"Question: {question}\n", {}
    for k, observation in enumerate(observations, 1):
        prompt += f"Thought {k}:"
        out[f"thought_{k}"] = c.complete(prompt, 48, stop="Observation")
        prompt += out[f"thought_{k}"] + f"Observation {k}: {observation}\n"
    return out


def react_items(n: int, seed: int) -> list[dict]:
    instruction = _react_instruction(seed)
    items = []
    for i in range(n):
        rng = seeded(seed, "react", i)
        items.append(
            {
                "instruction": instruction,
                "question": sentence(rng, 10)[:-1] + "?",
                "observations": [paragraph(rng, 2) for _ in range(REACT_STEPS)],
            }
        )
    return items


# ----------------------------------------------------------------------------- skeleton of thought

SOT_POINTS = 3


@sgl.function
def skeleton_of_thought(s, topic):
    s += (
        f"Answer with a skeleton of {SOT_POINTS} short points, then expand each point.\n"
        f"Topic: {topic}\nSkeleton:\n1."
    )
    s += sgl.gen("skeleton", max_tokens=48, ignore_eos=True)
    forks = s.fork(SOT_POINTS)
    for k, f in enumerate(forks, 1):
        f += f"\nPoint {k}, expanded in two sentences:"
        f += sgl.gen("expansion", max_tokens=64, ignore_eos=True)
    forks.join()


def plain_skeleton_of_thought(c: Completions, topic: str) -> dict:
    prompt = (
        f"Answer with a skeleton of {SOT_POINTS} short points, then expand each point.\n"
        f"Topic: {topic}\nSkeleton:\n1."
    )
    skeleton = c.complete(prompt, 48, ignore_eos=True)
    prompt += skeleton
    expansions = c.concurrently(
        [
            (
                lambda k=k: c.complete(
                    prompt + f"\nPoint {k}, expanded in two sentences:", 64, ignore_eos=True
                )
            )
            for k in range(1, SOT_POINTS + 1)
        ]
    )
    return {"skeleton": skeleton, "expansion": expansions}


def skeleton_items(n: int, seed: int) -> list[dict]:
    return [{"topic": sentence(seeded(seed, "sot", i), 6)[:-1]} for i in range(n)]


# ----------------------------------------------------------------------- JSON decode (regex fields)

# Each field's constraint as a regex (sgl, SGLang, vLLM) and as the same language in GBNF
# (llama.cpp's server constrains by grammar, not regex).
JSON_FIELDS = [
    ("name", r"[A-Z][a-z]{2,12}", "root ::= [A-Z] [a-z]{2,12}"),
    ("year", r"(19|20)[0-9]{2}", 'root ::= ("19" | "20") [0-9]{2}'),
    ("rooms", r"[1-9][0-9]?", "root ::= [1-9] [0-9]?"),
    ("open", r"(yes|no)", 'root ::= "yes" | "no"'),
    (
        "town",
        r"[A-Z][a-z]{2,12}( [A-Z][a-z]{2,12})?",
        'root ::= [A-Z] [a-z]{2,12} (" " [A-Z] [a-z]{2,12})?',
    ),
]


@sgl.function
def json_decode(s, document):
    s += "Read the document and fill in the record.\n\n" + document + "\n\nRecord:\n{\n"
    for name, regex, _ in JSON_FIELDS:
        s += f'  "{name}": "'
        s += sgl.gen(name, regex=regex, max_tokens=16)
        s += '",\n'


def plain_json_decode(c: Completions, document: str) -> dict:
    prompt, out = (
        "Read the document and fill in the record.\n\n" + document + "\n\nRecord:\n{\n",
        {},
    )
    for name, regex, gbnf in JSON_FIELDS:
        prompt += f'  "{name}": "'
        out[name] = c.complete(prompt, 16, regex=regex, gbnf=gbnf)
        prompt += out[name] + '",\n'
    return out


def json_decode_items(n: int, seed: int) -> list[dict]:
    """A long document per item (the paper's are Wikipedia pages): ~500 tokens here."""
    return [{"document": paragraph(seeded(seed, "json", i), 30)} for i in range(n)]


# ----------------------------------------------------------------------------- multi-turn chat


@sgl.function
def multi_turn_chat(s, questions, max_tokens):
    for k, (question, n) in enumerate(zip(questions, max_tokens)):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen(f"answer_{k}", max_tokens=n, ignore_eos=True))


def plain_multi_turn_chat(c: Completions, questions: list[str], max_tokens: list[int]) -> dict:
    """The user renders the turns with the model's chat template, as `apply_chat_template` would."""
    t, prompt, out = c.chat_template, "", {}
    for k, (question, n) in enumerate(zip(questions, max_tokens)):
        prompt += (
            t.role_prefix("user", k == 0)
            + question
            + t.role_suffix("user")
            + t.role_prefix("assistant", False)
        )
        out[f"answer_{k}"] = c.complete(prompt, n, ignore_eos=True)
        prompt += out[f"answer_{k}"] + t.role_suffix("assistant")
    return out


def chat_items(lengths: tuple[int, int], question_words: int) -> Callable[[int, int], list[dict]]:
    def items(n: int, seed: int) -> list[dict]:
        out = []
        for i in range(n):
            rng = seeded(seed, "chat", lengths, i)
            out.append(
                {
                    "questions": [sentence(rng, question_words) for _ in range(4)],
                    "max_tokens": [rng.randint(*lengths) for _ in range(4)],
                }
            )
        return out

    return items


# ----------------------------------------------------------------------------- line retrieval

REGISTER_LINES, QUESTIONS_PER_REGISTER = 120, 4


@sgl.function
def line_retrieval(s, register, lines):
    s += "Below is a register of numbered lines, each holding a code.\n" + register + "\n"
    forks = s.fork(len(lines))
    for f, line in zip(forks, lines):
        f += f"Question: what is the code on line {line}?\nAnswer: the code on line {line} is"
        f += sgl.gen("code", max_tokens=8, stop="\n")
    forks.join()


def plain_line_retrieval(c: Completions, register: str, lines: list[int]) -> dict:
    prompt = "Below is a register of numbered lines, each holding a code.\n" + register + "\n"
    codes = c.concurrently(
        [
            (
                lambda line=line: c.complete(
                    prompt
                    + (
                        f"Question: what is the code on line {line}?\n"
                        f"Answer: the code on line {line} is"
                    ),
                    8,
                    stop="\n",
                )
            )
            for line in lines
        ]
    )
    return {"code": codes}


def line_retrieval_items(n: int, seed: int) -> list[dict]:
    items = []
    for i in range(n):
        rng = seeded(seed, "register", i)
        register = "".join(
            f"line {k}: REGISTER_CONTENT is <{rng.randint(10000, 99999)}>\n"
            for k in range(1, REGISTER_LINES + 1)
        )
        items.append(
            {
                "register": register,
                "lines": rng.sample(range(1, REGISTER_LINES + 1), QUESTIONS_PER_REGISTER),
            }
        )
    return items


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Workload:
    name: str
    program: Any  # the @sgl.function
    plain: Callable[..., dict]  # plain(completions, **item): the same calls by hand
    items: Callable[[int, int], list[dict]]  # (programs, seed) -> each program's arguments


WORKLOADS = {
    w.name: w
    for w in [
        Workload("few_shot_qa", few_shot_qa, plain_few_shot_qa, few_shot_qa_items),
        Workload("hellaswag", hellaswag, plain_hellaswag, hellaswag_items),
        Workload("react", react, plain_react, react_items),
        Workload(
            "skeleton_of_thought", skeleton_of_thought, plain_skeleton_of_thought, skeleton_items
        ),
        Workload("json_decode", json_decode, plain_json_decode, json_decode_items),
        Workload("chat_short", multi_turn_chat, plain_multi_turn_chat, chat_items((4, 8), 8)),
        Workload("chat_long", multi_turn_chat, plain_multi_turn_chat, chat_items((256, 256), 16)),
        Workload("line_retrieval", line_retrieval, plain_line_retrieval, line_retrieval_items),
        # held out: written after the engine work on the ones above, never tuned on
        Workload(
            "tree_of_thought",
            held_out.tree_of_thought,
            held_out.plain_tree_of_thought,
            held_out.tree_of_thought_items,
        ),
        Workload(
            "llm_judge", held_out.llm_judge, held_out.plain_llm_judge, held_out.llm_judge_items
        ),
    ]
}
