"""The embedded model on CPU three ways: what `dtype="auto"` picks, the GGUF kept int4, and
int8; each reports its weight layouts and decodes one stream.

    .venv/bin/python examples/cpu_quantized.py              # eager decode steps
    .venv/bin/python examples/cpu_quantized.py --compile    # + torch.compile'd steps

With --compile the engine takes ~12 s to start (~210 s the first time on a 2-core CPU).
"""

import sys
import time

import sgl

VARIANTS = {  # name: engine options
    "bf16 dense": {"dtype": "auto", "quantization": "none"},
    "int4 (the Q4_1 file as it is)": {"dtype": "auto", "quantization": "auto"},
    "int8 (requantized on load)": {"dtype": "auto", "quantization": "int8"},
}


def main() -> None:
    compile_steps = "--compile" in sys.argv
    prompt = [{"role": "user", "content": "Name three uses of a paperclip."}]
    for name, options in VARIANTS.items():
        with sgl.Engine(model_path="default", torch_compile=compile_steps, **options) as engine:
            info = engine.get_server_info()
            print(
                f"{name}: dtype={info['dtype']} ({info['dtype_reason']}) "
                f"layouts={info['weight_layouts']}"
            )
            engine.generate(messages=prompt, sampling_params={"max_new_tokens": 4})  # warm up
            t = time.perf_counter()
            out = engine.generate(
                messages=prompt,
                sampling_params={"max_new_tokens": 48, "temperature": 0, "ignore_eos": True},
            )
            seconds = time.perf_counter() - t
            tokens = out["meta_info"]["completion_tokens"]
            print(
                f"  {tokens} tokens in {seconds:.2f} s ({tokens / seconds:.0f} tok/s): "
                f"{out['text'][:60]!r}"
            )


if __name__ == "__main__":
    main()
