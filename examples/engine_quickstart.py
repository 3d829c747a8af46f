"""Quick start: generate with the embedded model (SmolLM2-135M-Instruct) in process.

    make demo        # or: .venv/bin/python examples/engine_quickstart.py
"""

import sgl


def main() -> None:
    with sgl.Engine(model_path="default") as engine:
        # One prompt, greedy.
        out = engine.generate("The capital of France is", {"max_new_tokens": 12, "temperature": 0})
        print(repr(out["text"]), out["meta_info"]["finish_reason"])

        # Chat prompts rendered with the model's own template. They share the system prompt:
        # once the first request has cached it, later ones skip it (cached prompt tokens > 0).
        questions = ["What is 2 + 2?", "Name a primary colour.", "What is the opposite of hot?"]
        prompts = [
            engine.tokenizer.apply_chat_template(
                [{"role": "system", "content": "Answer in a few words."}, {"role": "user", "content": q}],
                tokenize=False,
                add_generation_prompt=True,
            )
            for q in questions
        ]
        for q, p in zip(questions, prompts):
            o = engine.generate(p, {"max_new_tokens": 24, "temperature": 0})
            print(f"{q} -> {o['text'].strip()!r} (cached prompt tokens: {o['meta_info']['cached_tokens']})")

        # Streaming, with a stop string.
        print("stream:", end=" ", flush=True)
        for chunk in engine.generate("Count: 1, 2, 3,", {"max_new_tokens": 32, "temperature": 0, "stop": ["8"]},
                                     stream=True):
            print(chunk["text"], end="", flush=True)
        print()

        info = engine.get_server_info()
        print(f"KV pool: {info['max_total_tokens']} tokens x {info['kv_bytes_per_token']} bytes")


if __name__ == "__main__":
    main()
