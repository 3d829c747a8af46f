"""Chat roles rendered with the model's own chat template, one role at a time.

A program opens and closes roles incrementally (`with s.user(): ...`), so the template is
needed as per-role prefix/suffix strings rather than as one render of a finished
conversation. They are read off the tokenizer's Jinja template by rendering probe
conversations with sentinel contents. Text built this way equals the template's render
of `s.messages()`, including a default system message the template inserts when a
conversation does not start with one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant")
_S = {
    "system": "\x11SGL_SYSTEM\x11",
    "user": "\x11SGL_USER\x11",
    "assistant": "\x11SGL_ASSISTANT\x11",
}


@dataclass(frozen=True)
class ChatTemplate:
    prefix: dict[str, str]  # role -> text before the content
    suffix: dict[str, str]  # role -> text after the content
    default_system: str = ""  # inserted before a first role other than system
    name: str = "custom"

    def role_prefix(self, role: str, first: bool) -> str:
        self._check(role)
        lead = self.default_system if first and role != "system" else ""
        return lead + self.prefix[role]

    def role_suffix(self, role: str) -> str:
        self._check(role)
        return self.suffix[role]

    @staticmethod
    def _check(role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")

    @classmethod
    def plain(cls) -> ChatTemplate:
        """For models without a chat template: `Role: content` lines."""
        return cls({r: f"{r.capitalize()}: " for r in ROLES}, {r: "\n" for r in ROLES}, "", "plain")

    @classmethod
    def from_hf_tokenizer(cls, tokenizer: Any) -> ChatTemplate:
        """Per-role strings from a HF tokenizer's chat template; `plain()` if it has none or
        it is not a per-message template."""
        if not getattr(tokenizer, "chat_template", None):
            return cls.plain()

        def render(msgs: list[tuple[str, str]]) -> str:
            return tokenizer.apply_chat_template(
                [{"role": r, "content": c} for r, c in msgs],
                tokenize=False,
                add_generation_prompt=False,
            )

        try:
            sys_only = render([("system", _S["system"])])
            with_user = render([("system", _S["system"]), ("user", _S["user"])])
            full = render(
                [("system", _S["system"]), ("user", _S["user"]), ("assistant", _S["assistant"])]
            )
            user_first = render([("user", _S["user"])])
        except Exception:  # a template that rejects these conversations
            return cls.plain()
        if not (with_user.startswith(sys_only) and full.startswith(with_user)):
            return cls.plain()
        prefix, suffix = {}, {}
        for role, piece in (
            ("system", sys_only),
            ("user", with_user[len(sys_only) :]),
            ("assistant", full[len(with_user) :]),
        ):
            before, sep, after = piece.partition(_S[role])
            if not sep:
                return cls.plain()
            prefix[role], suffix[role] = before, after
        user_block = prefix["user"] + _S["user"]
        default_system = (
            user_first[: user_first.find(user_block)] if user_block in user_first else ""
        )
        name = getattr(tokenizer, "name_or_path", "") or "hf"
        return cls(prefix, suffix, default_system, name)
