"""Token ids of prompts and environment observations, the way SkyRL's generator builds them.

Token-in-token-out: a trajectory's context is its prompt's ids followed by every turn's sampled ids and the ids of
what the environment answered, never the re-tokenized text. An observation becomes a chat turn through the
"fixed base" trick: the chat template is applied to a fixed two-message conversation with and without the new
messages, and the difference (from the base's last EOS on) is what the observation adds. A custom template
(`generator.chat_template`) is instead applied to the whole conversation every turn (`retokenize`), and its
`{% generation %}` blocks mark the model's tokens.
"""

from __future__ import annotations

import os
from typing import Any

# Templates by name (`chat_template.source: name`; core.runtime_facts.CHAT_TEMPLATE_NAMES lists them for the
# compiler): ChatML as Qwen3 writes it, with the assistant's part inside
# `{% generation %}` so the loss mask can be read back. `qwen3_without_thinking` drops the reasoning (up to
# `</think>`) of every assistant message but the last, as Qwen3's own template does.
_CHATML_TURN = "{{ '<|im_start|>' + m['role'] + '\\n' }}"
NAMED_TEMPLATES = {
    "qwen3_with_thinking": (
        "{% for m in messages %}" + _CHATML_TURN + "{% if m['role'] == 'assistant' %}{% generation %}"
        "{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
        "{% else %}{{ m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
    "qwen3_without_thinking": (
        "{% for m in messages %}" + _CHATML_TURN + "{% if m['role'] == 'assistant' %}"
        "{% set text = m['content'] %}"
        "{% if not loop.last and '</think>' in text %}{% set text = text.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
        "{% generation %}{{ text + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
        "{% else %}{{ m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
}
_MAX_TEMPLATE_BYTES = 1 << 20


class ChatTemplateError(ValueError):
    """generator.chat_template names a template that does not exist or cannot be read."""


def custom_template(source: str, name_or_path: str | None) -> str | None:
    """The template `generator.chat_template` names, or None for the tokenizer's own."""
    if not name_or_path:
        return None
    if source == "name":
        if name_or_path not in NAMED_TEMPLATES:
            raise ChatTemplateError(
                f"generator.chat_template names {name_or_path!r}; rlc has {', '.join(sorted(NAMED_TEMPLATES))} "
                "(or use source: file with a path)"
            )
        return NAMED_TEMPLATES[name_or_path]
    path = os.path.expanduser(name_or_path)
    try:
        if os.path.getsize(path) > _MAX_TEMPLATE_BYTES:
            raise ChatTemplateError(f"the chat template {path} is larger than 1 MiB")
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise ChatTemplateError(f"cannot read the chat template {path}: {exc.strerror or exc}") from None


# A fixed conversation the observations are appended to (its own tokens are cut off again).
_BASE = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "I am a user."}]


class Templater:
    """Prompt and observation ids of one tokenizer, template and `chat_template_kwargs`."""

    def __init__(self, tokenizer, custom: str | None = None, kwargs: dict | None = None):
        self.tok = tokenizer
        self.custom = custom
        self.kwargs = dict(kwargs or {})
        self.eos = tokenizer.eos_token_id
        self.chat = bool(custom or getattr(tokenizer, "chat_template", None))
        self._base_ids: list[int] | None = None
        self._generation_prompt: list[int] | None = None

    def _apply(self, messages: list[dict], *, generation_prompt: bool, custom: bool = False) -> list[int]:
        return list(
            self.tok.apply_chat_template(
                messages,
                add_generation_prompt=generation_prompt,
                tokenize=True,
                return_dict=False,
                **({"chat_template": self.custom} if custom and self.custom else {}),
                **self.kwargs,
            )
        )

    def prompt_ids(self, prompt: Any, *, generation_prompt: bool = True, custom: bool = False) -> list[int]:
        """Ids of a prompt: chat messages through the template, a text (or messages without a template) as is."""
        if isinstance(prompt, list) and self.chat:
            return self._apply(prompt, generation_prompt=generation_prompt, custom=custom)
        if isinstance(prompt, list):
            prompt = "\n".join(str(m.get("content", "")) for m in prompt)
        return self.text_ids(str(prompt))

    def text_ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False).input_ids)

    def observation_ids(self, observations: list[dict], done: bool, conversation: bool) -> list[int]:
        """What an environment's answer adds to the context: a chat turn (and the next generation prompt unless
        the trajectory is done) in conversation mode, else its text."""
        if not conversation or not self.chat:
            return [i for m in observations for i in self.text_ids(str(m.get("content", "")))]
        if not observations:
            return [] if done else self.generation_prompt()
        return self._apply([*_BASE, *observations], generation_prompt=not done)[len(self.base_ids()) :]

    def base_ids(self) -> list[int]:
        if self._base_ids is None:
            ids = self._apply(_BASE, generation_prompt=False)
            if self.eos in ids:  # up to the base's last EOS: what follows it belongs to the next turn
                ids = ids[: len(ids) - ids[::-1].index(self.eos)]
            self._base_ids = ids
        return self._base_ids

    def generation_prompt(self) -> list[int]:
        """The ids that open an assistant turn (e.g. `<|im_start|>assistant\\n`)."""
        if self._generation_prompt is None:
            empty = [{"role": "user", "content": ""}]
            plain = self._apply(empty, generation_prompt=False)
            self._generation_prompt = self._apply(empty, generation_prompt=True)[len(plain) :]
        return self._generation_prompt

    def assistant_tokens(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """Ids of a run of messages through the custom template, and 1 on the assistant's tokens (its
        `{% generation %}` blocks)."""
        out = self.tok.apply_chat_template(
            messages,
            chat_template=self.custom,
            add_generation_prompt=False,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            **self.kwargs,
        )
        return list(out["input_ids"]), [int(m) for m in out["assistant_masks"]]
