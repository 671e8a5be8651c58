"""Chat prompt templates: turn messages into the single prompt a Triton LLM model takes."""

from __future__ import annotations

from collections.abc import Sequence

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gateway.inference.types import ChatMessage

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n"
    ),
    "llama3": (
        "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m.role }}"
        "<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    "plain": "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:",
}

# Templates come from ops' config; the sandbox keeps one from reaching Python internals.
_ENV = ImmutableSandboxedEnvironment(keep_trailing_newline=True, autoescape=False)


class PromptTemplate:
    """A compiled chat template: a built-in name or Jinja source with `messages`."""

    def __init__(self, name_or_source: str) -> None:
        source = BUILTIN_TEMPLATES.get(name_or_source, name_or_source)
        self._template: Template = _ENV.from_string(source)

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt for these messages, ending where the assistant's answer begins."""
        return self._template.render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=True,
        )


def template_problem(name_or_source: str) -> str | None:
    """Why a configured template cannot be used, or None when it compiles."""
    try:
        PromptTemplate(name_or_source)
    except TemplateError as exc:
        return f"prompt_template does not compile: {exc}"
    return None
