"""Prompt templates."""

from __future__ import annotations

import pytest
from jinja2.exceptions import SecurityError

from gateway.inference.prompt import PromptTemplate, template_problem
from gateway.inference.types import ChatMessage

MESSAGES = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]


def test_chatml_template_ends_where_the_assistant_answers() -> None:
    assert PromptTemplate("chatml").render(MESSAGES) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_custom_jinja_template_and_sandbox() -> None:
    template = PromptTemplate("{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}>")
    assert template.render(MESSAGES) == "[system] Be brief. [user] Hi >"
    with pytest.raises(SecurityError):
        PromptTemplate("{{ messages[0].__class__.__mro__ }}").render(MESSAGES)


def test_broken_template_is_reported() -> None:
    assert template_problem("chatml") is None
    problem = template_problem("{% for m in messages %}")
    assert problem is not None and problem.startswith("prompt_template does not compile")
