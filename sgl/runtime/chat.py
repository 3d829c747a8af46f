"""Chat messages to prompt text: the model's own chat template, or a plain fallback.

The engine owns this (the server and programs ask it), so every entry point renders a
conversation the same way. Tokenizers without a template get `Role: content` lines and a
trailing `Assistant: ` (the same strings as `sgl.lang.chat_template.ChatTemplate.plain`).
"""

from __future__ import annotations

from typing import Any

from sgl.runtime.errors import InvalidRequestError

PLAIN_ROLES = ("system", "user", "assistant")
# apply_chat_template's own parameters: not template variables a request may set
TEMPLATE_CALL_ARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidRequestError(
            "messages must be a non-empty list of {role, content} objects", "messages"
        )
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidRequestError(
                f"messages[{i}] must be an object with a string role", f"messages[{i}].role"
            )
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise InvalidRequestError(
                f"messages[{i}].content must be a string", f"messages[{i}].content"
            )
        out.append({**m, "content": content or ""})
    return out


def render_messages(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text for `messages` (already validated); `tools` (OpenAI function tools)
    and `template_kwargs` (e.g. enable_thinking) go to the template as it defines them."""
    clash = sorted(set(template_kwargs or {}) & TEMPLATE_CALL_ARGS)
    if clash:
        raise InvalidRequestError(
            f"chat_template_kwargs may not set {clash[0]!r} (an argument of the template "
            "call itself)",
            f"chat_template_kwargs.{clash[0]}",
        )
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                **(template_kwargs or {}),
            )
        except Exception as e:  # a template that rejects this conversation (e.g. role order)
            raise InvalidRequestError(
                f"the model's chat template rejected the messages: {e}", "messages"
            ) from e
    text = "".join(
        f"{m['role'].capitalize()}: {m['content']}\n" for m in messages if m["role"] in PLAIN_ROLES
    )
    return text + ("Assistant: " if add_generation_prompt else "")
