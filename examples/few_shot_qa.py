"""Few-shot question answering on a batch, plus `select` and `gen_int`.

    .venv/bin/python examples/few_shot_qa.py

Each program starts with constant few-shot examples: `run_batch` finds that prefix by
tracing the program and computes it into the radix cache once, so every item in the batch
starts with a cache hit. (The embedded model is tiny: expect some wrong answers.)
"""

import sgl

QA_EXAMPLES = """The following are questions with short answers.

Question: What is the capital of Italy?
Answer: Rome

Question: How many legs does a spider have?
Answer: Eight

Question: What colour is the sky on a clear day?
Answer: Blue

"""

TOPIC_EXAMPLES = """Classify each question's topic.

Question: What is the longest river in Africa?
Topic: geography

Question: What gas do plants absorb from the air?
Topic: science

Question: Who was the first emperor of Rome?
Topic: history

Question: How many points is a touchdown worth?
Topic: sports

"""

COUNT_EXAMPLES = """Answer with a number.

Question: How many legs does a spider have?
Answer: 8

Question: How many months are there in a year?
Answer: 12

"""

TOPICS = ["geography", "science", "history", "sports"]


@sgl.function
def few_shot_qa(s, question):
    s += QA_EXAMPLES
    s += "Question: " + question + "\n"
    s += "Answer:" + sgl.gen("answer", max_tokens=12, stop="\n")


@sgl.function
def classify_topic(s, question):
    s += TOPIC_EXAMPLES
    s += "Question: " + question + "\n"
    s += "Topic: " + sgl.select("topic", choices=TOPICS)


@sgl.function
def count(s, question):
    s += COUNT_EXAMPLES
    s += "Question: " + question + "\n"
    s += "Answer: " + sgl.gen_int("number", max_tokens=3)


def main() -> None:
    questions = [
        "What is the capital of France?",
        "Who was the first president of the United States?",
        "What is the chemical symbol for water?",
        "How many players are on a soccer team?",
        "In which year did World War II end?",
    ]
    states = few_shot_qa.run_batch([{"question": q} for q in questions], temperature=0)
    for q, state in zip(questions, states):
        print(f"qa: {q} -> {state['answer'].strip()}")

    states = classify_topic.run_batch([{"question": q} for q in questions])
    for q, state in zip(questions, states):
        print(f"topic: {q} -> {state['topic']}")

    counts = [
        "How many legs does a dog have?",
        "How many continents are there?",
        "What is 3 plus 4?",
    ]
    states = count.run_batch([{"question": q} for q in counts], temperature=0)
    for q, state in zip(counts, states):
        print(f"gen_int: {q} -> {int(state['number'])}")


if __name__ == "__main__":
    main()
