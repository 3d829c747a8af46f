"""The server's chat endpoint on a tiny model of each family, with the family's chat template.

Oracles: the tokenizer's own `apply_chat_template` for the prompt, HF transformers' greedy
`generate` on the same weights for the answer's tokens.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import requests
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "unit"))  # tiny_models

from server_helpers import ServerThread  # noqa: E402
from tiny_models import save_tiny_engine_dir  # noqa: E402

import sgl  # noqa: E402
from sgl.server import create_app  # noqa: E402

# Gemma-style turns for the Gemma families, ChatML for the Qwen ones, Phi-3's tags, a plain one
# else.
TEMPLATES = {
    "gemma": (
        "{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else "
        "m['role'] }}\n"
        "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt "
        "%}<start_of_turn>model\n"
        "{% endif %}"
    ),
    "qwen": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% "
        "endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "phi": (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
    "plain": "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}",
}
FAMILIES = {
    "gemma2": "gemma",
    "gemma3": "gemma",
    "qwen3-sliding": "qwen",
    "qwen2_moe": "qwen",
    "phi3": "phi",
    "mistral-sliding": "plain",
    "mixtral": "plain",
}
MESSAGES = [
    {"role": "user", "content": "the quick brown fox"},
    {"role": "assistant", "content": "jumps over"},
    {"role": "user", "content": "hello world, structured programs!"},
]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_chat_completion_uses_the_template_and_equals_hf_greedy(tmp_path, family):
    path, hf = save_tiny_engine_dir(
        tmp_path, 320, arch=family, chat_template=TEMPLATES[FAMILIES[family]]
    )
    with sgl.Engine(model_path=str(path), dtype="float32", max_total_tokens=2048) as engine:
        with ServerThread(create_app(engine, "tiny")) as url:
            body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
            resp = requests.post(url + "/v1/chat/completions", json=body, timeout=120)
            assert resp.status_code == 200, resp.text
            answer = resp.json()["choices"][0]["message"]["content"]
        prompt = engine.tokenizer.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=True
        )
        ids = engine.encode(prompt)
        want = engine.generate(
            input_ids=ids, sampling_params={"max_new_tokens": 16, "temperature": 0}
        )
    assert answer == want["text"]
    with torch.no_grad():
        hf_ids = hf.generate(
            torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=0
        )
    n = len(want["output_ids"])  # the same tokens, up to where ours stopped (eos)
    assert want["output_ids"] == hf_ids[0, len(ids) : len(ids) + n].tolist()
