"""Chat prompt templates: turn messages into the single prompt a Triton LLM model takes."""

from __future__ import annotations

import json
from collections.abc import Sequence

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gateway.inference.memo import ObjectMemo
from gateway.inference.types import ChatMessage, Tool

# Hermes / Qwen 2.5 function calling: the tools in the system turn between <tools>
# tags, the assistant's calls as <tool_call> blocks, results as <tool_response> in a
# user turn (as Qwen 2.5's own chat template writes them).
_CHATML_TOOLS = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    "{% if required %}\n\nYou must call {{ required }}.{% endif %}<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if tools and loop.first and m.role == 'system' %}"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}"
    "\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for call in m.tool_calls %}{% if m.content or not loop.first %}\n{% endif %}"
    '<tool_call>\n{"name": {{ call.function.name | tojson }}, '
    '"arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "<|im_start|>assistant\n"
)

# Llama 3.1 JSON function calling: the tools and the instruction in the first user turn,
# calls as `{"name": ..., "parameters": ...}`, results in `ipython` turns.
_LLAMA3_TOOLS = (
    "<|begin_of_text|>{% set ns = namespace(told=false) %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ m.content }}<|eot_id|>"
    "{% elif m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% for call in m.tool_calls %}{% if not loop.first %}; {% endif %}"
    '{"name": {{ call.function.name | tojson }}, '
    '"parameters": {{ call.function.arguments | tojson }}}{% endfor %}<|eot_id|>'
    "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{% if tools and m.role == 'user' and not ns.told %}{% set ns.told = true %}"
    "Given the following functions, please respond with a JSON for a function call with "
    "its proper arguments that best answers the given prompt.\n\nRespond in the format "
    '{"name": function name, "parameters": dictionary of argument name and its value}. '
    "Do not use variables.{% if required %} You must call {{ required }}.{% endif %}\n\n"
    "{% for tool in tools %}{{ tool | tojson }}\n\n{% endfor %}"
    "{% endif %}{{ m.content }}<|eot_id|>"
    "{% endif %}{% endfor %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% if tools %}" + _CHATML_TOOLS + "{% else %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n{% endif %}"
    ),
    "llama3": (
        "{% if tools %}" + _LLAMA3_TOOLS + "{% else %}"
        "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m.role }}"
        "<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "plain": "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:",
}

# Templates come from ops' config; the sandbox keeps one from reaching Python internals.
_ENV = ImmutableSandboxedEnvironment(keep_trailing_newline=True, autoescape=False)


class _TemplateTool(dict[str, object]):
    """A tool as templates see it, its `tojson` made once: a coding agent's 20 tools
    took 190 µs of `json.dumps` on every request, and its tool list is one shared object
    from turn to turn (`gateway.api.tool_lists`). The sandbox is immutable: no template
    can change what another request's render will see."""

    __slots__ = ("json",)

    def __init__(self, tool: Tool) -> None:
        super().__init__(_tool(tool))
        self.json = json.dumps(self, ensure_ascii=False)


def _tojson(value: object) -> str:
    # JSON as Hugging Face's chat templates write it: no HTML escaping (Jinja's own
    # `tojson` writes `<` as `\u003c`), `json.dumps`'s spacing (what models were trained on).
    if type(value) is _TemplateTool:
        return value.json
    return json.dumps(value, ensure_ascii=False)


_ENV.filters["tojson"] = _tojson


# The tools of a shared tool list, made once for every render that uses that list.
def _for_templates(tools: tuple[Tool, ...]) -> list[_TemplateTool]:
    return [_TemplateTool(tool) for tool in tools]


_template_tools = ObjectMemo("template", _for_templates)


class PromptTemplate:
    """A compiled chat template: a built-in name, or Jinja source that gets what Hugging
    Face chat templates get: `messages` (with `tool_calls` and `tool_call_id`), `tools`
    and `add_generation_prompt`; and `required`, the function the model must call."""

    def __init__(self, name_or_source: str) -> None:
        source = BUILTIN_TEMPLATES.get(name_or_source, name_or_source)
        self._template: Template = _ENV.from_string(source)

    def render(
        self,
        messages: Sequence[ChatMessage],
        tools: tuple[Tool, ...] = (),
        required: str | None = None,
    ) -> str:
        """The prompt for these messages (and tools), ending where the assistant's answer
        begins. `required`: the function the model must call, or "a function"."""
        return self._template.render(
            messages=[_message(m) for m in messages],
            tools=_template_tools(tools) or None,
            required=required,
            add_generation_prompt=True,
        )


def _message(message: ChatMessage) -> dict[str, object]:
    out: dict[str, object] = {"role": message.role, "content": message.content}
    out["tool_calls"] = [
        {"type": "function", "id": c.id,
         "function": {"name": c.name, "arguments": _json_or_text(c.arguments)}}
        for c in message.tool_calls
    ]  # fmt: skip
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _json_or_text(arguments: str) -> object:
    """A call's arguments as the object they encode (what templates expect), else text."""
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):  # nested past the stack: text as well
        return arguments


def _tool(tool: Tool) -> dict[str, object]:
    function: dict[str, object] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def template_problem(name_or_source: str) -> str | None:
    """Why a configured template cannot be used, or None when it compiles."""
    try:
        PromptTemplate(name_or_source)
    except TemplateError as exc:
        return f"prompt_template does not compile: {exc}"
    return None
