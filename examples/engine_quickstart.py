"""Quick start: generate with the embedded model (SmolLM2-135M-Instruct) in process.

make demo        # or: .venv/bin/python examples/engine_quickstart.py
"""

import sgl


def main() -> None:
    with sgl.Engine(model_path="default") as engine:
        # One prompt, greedy.
        out = engine.generate("The capital of France is", {"max_new_tokens": 12, "temperature": 0})
        print(repr(out["text"]), out["meta_info"]["finish_reason"])

        # Chat messages, rendered by the engine with the model's own template. They share the
        # system prompt: once the first request has cached it, later ones skip it.
        questions = ["What is 2 + 2?", "Name a primary colour.", "What is the opposite of hot?"]
        for q in questions:
            messages = [
                {"role": "system", "content": "Answer in a few words."},
                {"role": "user", "content": q},
            ]
            o = engine.generate(
                messages=messages, sampling_params={"max_new_tokens": 24, "temperature": 0}
            )
            print(
                f"{q} -> {o['text'].strip()!r} (cached prompt tokens: "
                f"{o['meta_info']['cached_tokens']})"
            )

        # Three seeded samples of one prompt, streamed together: chunks carry their sample's index.
        texts = ["", "", ""]
        for chunk in engine.generate(
            "A name for a cat:", {"max_new_tokens": 8, "n": 3, "seed": 1}, stream=True
        ):
            texts[chunk["index"]] += chunk["text"]
        print("samples:", [t.strip() for t in texts])

        # Streaming, with a stop string.
        print("stream:", end=" ", flush=True)
        for chunk in engine.generate(
            "Count: 1, 2, 3,", {"max_new_tokens": 32, "temperature": 0, "stop": ["8"]}, stream=True
        ):
            print(chunk["text"], end="", flush=True)
        print()

        info = engine.get_server_info()
        print(f"KV pool: {info['max_total_tokens']} tokens x {info['kv_bytes_per_token']} bytes")


if __name__ == "__main__":
    main()
