"""Speculative decoding on a program that copies its input: prompt-lookup drafts (NGRAM).

    .venv/bin/python examples/speculative_extraction.py

The engine drafts each request's next tokens from its own prompt and output (and from other
cached sequences) and verifies them in one forward, keeping the drafted tokens the model would
have produced itself: the output is what it would be without speculation (exactly in float32;
in bf16 up to the rounding of a verify step's batch, see README "Speculative decoding").
Extraction pays most: the answer quotes the document, so most drafts are accepted.
"""

import sgl
from sgl.lang.backends.engine import EngineBackend

DOCUMENT = (
    "The harbour in Ostvik was rebuilt in 1921 after a long winter storm. "
    "Mara Halden worked at the library of Brenford for 12 years. "
    "Every spring, the people of Larrow paint the old mill a bright blue. "
    "In 1874, Felix Varga wrote a short book about the lighthouse and its visitors."
)


@sgl.function
def quote(s, document, topic):
    s += sgl.user(
        f"{document}\n\nQuote, word for word, the sentence of the text above about the {topic}."
    )
    s += sgl.assistant(sgl.gen("quote", max_tokens=48, stop="\n"))


def main() -> None:
    with sgl.Engine(model_path="default", speculative_algorithm="NGRAM") as engine:
        backend = EngineBackend(engine)
        for topic in ("library", "lighthouse"):
            state = quote.run(document=DOCUMENT, topic=topic, temperature=0, backend=backend)
            meta = state.get_meta_info("quote")
            print(f"{topic}: {state['quote'].strip()}")
            print(
                f"  tokens: {meta['completion_tokens']}, verify steps: {meta['spec_verify_ct']}, "
                f"drafted: {meta['spec_draft_tokens']}, accepted: {meta['spec_accepted_tokens']}"
            )
        info = engine.get_server_info()["speculative"]
        print(
            f"engine: acceptance {info['acceptance_rate']:.2f}, "
            f"tokens per verify step {info['avg_spec_accept_length']:.2f}"
        )


if __name__ == "__main__":
    main()
