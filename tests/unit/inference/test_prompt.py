"""Prompt templates."""

from __future__ import annotations

import pytest
from jinja2.exceptions import SecurityError

from gateway.inference.prompt import PromptTemplate, template_problem
from gateway.inference.types import ChatMessage, Tool

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


MID = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "Hi"),
    ChatMessage("system", "Agents: Explore."),
]


def test_a_later_system_message_is_rendered_where_it_stands() -> None:
    # Claude Code's mid-conversation system messages: each built-in template gives them
    # their own system turn at their place, after what they speak of.
    assert (
        PromptTemplate("chatml")
        .render(MID)
        .endswith(
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>system\nAgents: Explore.<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
    )
    assert (
        PromptTemplate("llama3")
        .render(MID)
        .endswith(
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>system<|end_header_id|>\n\nAgents: Explore.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
        )
    )


def test_with_tools_only_the_first_system_message_joins_the_tools_turn() -> None:
    tools = [Tool("f", None, {"type": "object"})]
    prompt = PromptTemplate("chatml").render(MID, tools)
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert prompt.count("Be brief.") == 1
    assert "<|im_start|>user\nHi<|im_end|>\n<|im_start|>system\nAgents: Explore.<|im_end|>\n" in (
        prompt
    )
    llama = PromptTemplate("llama3").render(MID, tools)
    assert "<|start_header_id|>system<|end_header_id|>\n\nAgents: Explore.<|eot_id|>" in llama


def test_tools_render_as_json_dumps_writes_them_however_often_the_list_is_used() -> None:
    # A shared tool list's JSON is made once (an agent sends the same list every turn):
    # the prompt must be what `json.dumps` gives (HF templates' spacing, unicode as is).
    import json

    tools = (
        Tool("write", "Écrit un fichier <ici>", {"type": "object", "properties": {}}),
        Tool("run", None, None),
    )
    template = PromptTemplate("chatml")
    messages = [ChatMessage("user", "hi")]
    first = template.render(messages, tools)
    assert template.render(messages, tools) == first
    for tool in tools:
        function = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
        written = json.dumps({"type": "function", "function": function}, ensure_ascii=False)
        assert written in first
    # A custom template sees the tools as objects, and cannot change them for the next.
    custom = PromptTemplate("{% for t in tools %}{{ t.function.name }};{% endfor %}")
    assert custom.render(messages, tools) == "write;run;"
    with pytest.raises(SecurityError):
        PromptTemplate("{{ tools[0].update({'type': 'x'}) }}").render(messages, tools)
    assert template.render(messages, tools) == first
