"""Chat prompt templates: turn messages into the single prompt a Triton LLM model takes."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Any, NoReturn

from jinja2 import Template, TemplateError, TemplateSyntaxError
from jinja2.exceptions import SecurityError
from jinja2.ext import loopcontrols
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
# Steps a model's own template may take in one render: the `range`s it counts through,
# together (a chat template walks the messages and tools, which the request bounds).
# Nested `range(100000)` loops passed a compile and froze the server for every model
# (issue 42's hostile review).
RANGE_STEPS = 100_000
# The longest string or list one `*` may make, and the largest exponent of `**`.
MAX_REPEAT = 1 << 20
MAX_EXPONENT = 64
_steps_left: ContextVar[list[int]] = ContextVar("template_steps")


class _BudgetedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with what it lets a template compute bounded: `range`'s steps per
    render, `*` repetition and `**`, and no `lipsum` (paragraphs of text on demand)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and abs(right) > MAX_EXPONENT:
            raise SecurityError(f"an exponent over {MAX_EXPONENT}")
        if operator == "*":
            for items, times in ((left, right), (right, left)):
                repeats = isinstance(items, str | list | tuple) and isinstance(times, int)
                if repeats and len(items) * times > MAX_REPEAT:
                    raise SecurityError(f"a repetition over {MAX_REPEAT} items")
        return super().call_binop(context, operator, left, right)


def _budgeted_range(*args: int) -> Iterator[int]:
    # Each step is taken from the render's budget, so that loops inside loops add up.
    budget = _steps_left.get()
    for value in range(*args):
        budget[0] -= 1
        if budget[0] < 0:
            raise SecurityError(f"the template counted past {RANGE_STEPS} steps")
        yield value


# A model's own chat template (its tokenizer_config.json) is rendered as Hugging Face's
# `apply_chat_template` renders it, which is what vLLM does too: blocks trimmed, `break`
# and `continue`, and the functions such templates call.
_HF_ENV = _BudgetedSandbox(
    trim_blocks=True, lstrip_blocks=True, autoescape=False, extensions=[loopcontrols]
)
_HF_ENV.globals["range"] = _budgeted_range
del _HF_ENV.globals["lipsum"]
# The special tokens a tokenizer config names, which its template may use.
_SPECIAL_TOKENS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip
# A tokenizer config is JSON of some KB (Qwen's 7 KB, Mistral's 130 KB with its token
# map); a file larger than this is not one.
MAX_TOKENIZER_CONFIG_BYTES = 16 * 1024 * 1024
MAX_TEMPLATE_CHARS = 256 * 1024
# The longest prompt a template may make for a model with no `context_length`: 8 M
# characters (about 2 M tokens, above any model's window). A model's own is 16 characters
# a token of its context (`prompt_limit`).
DEFAULT_MAX_PROMPT_CHARS = 8 * 1024 * 1024


class PromptRefused(Exception):
    """A model's chat template refused the conversation (its `raise_exception`, as when
    roles do not alternate): the client's request is at fault, a 400."""

    def __init__(self, message: str, model: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.model = model


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


def _hf_tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Hugging Face's own `tojson`: the arguments templates pass (Llama 3.1's `indent=4`).
    if type(value) is _TemplateTool and (indent, separators, sort_keys, ensure_ascii) == (
        None, None, False, False,
    ):  # fmt: skip
        return value.json
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
        sort_keys=sort_keys,
    )  # fmt: skip


def _raise_exception(message: str) -> NoReturn:
    raise PromptRefused(str(message))


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


_HF_ENV.filters["tojson"] = _hf_tojson
_HF_ENV.globals["raise_exception"] = _raise_exception
_HF_ENV.globals["strftime_now"] = _strftime_now


# The tools of a shared tool list, made once for every render that uses that list.
def _for_templates(tools: tuple[Tool, ...]) -> list[_TemplateTool]:
    return [_TemplateTool(tool) for tool in tools]


_template_tools = ObjectMemo("template", _for_templates)


class PromptTemplate:
    """A compiled chat template: a built-in name, Jinja source, or the path of a model's
    `tokenizer_config.json` (its `chat_template` and special tokens, rendered as Hugging
    Face renders them).

    Templates get what Hugging Face chat templates get: `messages` (with `tool_calls` and
    `tool_call_id`), `tools` and `add_generation_prompt`; the built-in and pasted ones
    also `required`, the function the model must call.
    """

    def __init__(self, name_or_source: str) -> None:
        self._tokens: dict[str, object] = {}
        self._tool_template: Template | None = None
        self._own = names_tokenizer_config(name_or_source)
        if self._own:
            config = read_tokenizer_config(name_or_source)
            self._tokens = _special_tokens(config)
            try:
                default, tool_use = _chat_templates(config)
                self._template: Template = _HF_ENV.from_string(default)
                if tool_use is not None:
                    self._tool_template = _HF_ENV.from_string(tool_use)
            except ValueError as exc:
                raise ValueError(f"{name_or_source}: {exc}") from None
            except (TemplateError, RecursionError) as exc:
                where = f" (line {exc.lineno})" if isinstance(exc, TemplateSyntaxError) else ""
                raise ValueError(
                    f"{name_or_source}: its chat_template does not compile{where}: "
                    f"{exc or type(exc).__name__}"
                ) from None
        else:
            source = BUILTIN_TEMPLATES.get(name_or_source, name_or_source)
            self._template = _ENV.from_string(source)

    def render(
        self,
        messages: Sequence[ChatMessage],
        tools: tuple[Tool, ...] = (),
        required: str | None = None,
        max_chars: int = DEFAULT_MAX_PROMPT_CHARS,
    ) -> str:
        """The prompt for these messages (and tools), ending where the assistant's answer
        begins. `required`: the function the model must call, or "a function".

        Raises `PromptRefused` when a model's own template refuses the conversation, or
        the prompt would be longer than `max_chars`."""
        if not self._own:
            return _bounded(
                self._template.generate(
                    messages=[_message(m) for m in messages],
                    tools=_template_tools(tools) or None,
                    required=required,
                    add_generation_prompt=True,
                ),
                max_chars,
            )
        template = self._tool_template if tools and self._tool_template else self._template
        token = _steps_left.set([RANGE_STEPS])
        try:
            return _bounded(
                template.generate(
                    messages=[_hf_message(m) for m in messages],
                    tools=_template_tools(tools) or None,
                    add_generation_prompt=True,
                    **self._tokens,
                ),
                max_chars,
            )
        except PromptRefused:
            raise
        except (
            TemplateError, TypeError, ValueError, LookupError, ArithmeticError, RecursionError,
        ) as exc:  # fmt: skip
            # A model's template written for other inputs (content as a list, say): the
            # conversation is what it cannot take, never the gateway.
            raise PromptRefused(f"{type(exc).__name__}: {exc}") from None
        finally:
            _steps_left.reset(token)


def _bounded(pieces: Iterator[str], max_chars: int) -> str:
    """The rendered prompt, stopped as soon as it is longer than `max_chars`: Mistral's
    template writes the whole tool list before every user turn that equals the last, so
    a 890 KB request made a 2 GB prompt and held the event loop 22 s (issue 42's hostile
    review)."""
    out: list[str] = []
    size = 0
    for piece in pieces:
        size += len(piece)
        if size > max_chars:
            raise PromptRefused(
                f"the prompt it makes of them is longer than the {max_chars} characters "
                "the model takes"
            )
        out.append(piece)
    return "".join(out)


def names_tokenizer_config(value: str) -> bool:
    """Whether a `prompt_template` value is the path of a tokenizer config (`.json`)."""
    return value.endswith(".json") and "{" not in value and "\n" not in value


def read_tokenizer_config(path: str) -> dict[str, Any]:
    """A Hugging Face `tokenizer_config.json`. Raises ValueError saying what is wrong."""
    try:
        # A regular file only, asked before opening it (opening a FIFO waits for a
        # writer): /dev/zero or a FIFO hung check-config (issue 42's hostile review).
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError(f"{path} is not a regular file")
        with open(path, "rb") as file:
            text = file.read(MAX_TOKENIZER_CONFIG_BYTES + 1)  # at most the limit
        if len(text) > MAX_TOKENIZER_CONFIG_BYTES:
            raise ValueError(
                f"{path} is over {MAX_TOKENIZER_CONFIG_BYTES} bytes: not a tokenizer config"
            )
        config = json.loads(text)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a tokenizer config (not a JSON object)")
    return config


def _chat_templates(config: dict[str, Any]) -> tuple[str, str | None]:
    """The config's default chat template and its `tool_use` one, if named apart.

    `chat_template` is one string, or a list of `{"name", "template"}` (a template for
    tools beside the default one, as Hugging Face keeps several)."""
    value = config.get("chat_template")
    if isinstance(value, str) and value:
        return _not_too_long(value), None
    if value is not None and not isinstance(value, list | str):
        raise ValueError(
            f"its chat_template is a {type(value).__name__}: a string, or a list of "
            "{name, template} with one named 'default', is what it can be"
        )
    if isinstance(value, list):
        named = {
            item.get("name"): item.get("template")
            for item in value
            if isinstance(item, dict) and isinstance(item.get("template"), str)
        }
        default = named.get("default")
        if isinstance(default, str):
            tool_use = named.get("tool_use")
            tool_use = _not_too_long(tool_use) if isinstance(tool_use, str) else None
            return _not_too_long(default), tool_use
    raise ValueError(
        "it has no chat_template (a string, or a list with one named 'default'): name a "
        "built-in template or paste one instead"
    )


def _not_too_long(template: str) -> str:
    # Real chat templates are some KB (Qwen's 2.5, Mistral's 4); compiling megabytes of
    # one took check-config over 20 s (issue 42's hostile review).
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ValueError(
            f"its chat_template is {len(template)} characters, more than the "
            f"{MAX_TEMPLATE_CHARS} a chat template is"
        )
    return template


def _special_tokens(config: dict[str, Any]) -> dict[str, object]:
    """The special tokens by name (`bos_token`...): a string, or an AddedToken's content."""
    tokens: dict[str, object] = {}
    for name in _SPECIAL_TOKENS:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        contents = [t.get("content") if isinstance(t, dict) else t for t in extra]
        tokens["additional_special_tokens"] = [t for t in contents if isinstance(t, str)]
    return tokens


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


def _hf_message(message: ChatMessage) -> dict[str, object]:
    """A message as a model's own template expects it: `tool_calls` only when there are
    some (Llama 3.1's template takes any `tool_calls` key for calls)."""
    out = _message(message)
    if not message.tool_calls:
        del out["tool_calls"]
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


# What a model's own template is tried on when the config is checked: a template that
# cannot render one user's "Hi" would refuse every request, each as the client's fault.
_TRIAL = (ChatMessage("user", "Hi"),)
_TRIAL_TOOLS = (Tool("get_time", "The time now", {"type": "object", "properties": {}}),)


def template_problem(name_or_source: str) -> str | None:
    """Why a configured template cannot be used, or None when it compiles (and, for a
    model's own, renders a one-message chat, with a tool and without)."""
    try:
        template = PromptTemplate(name_or_source)
    except TemplateError as exc:
        return f"prompt_template does not compile: {exc}"
    except ValueError as exc:
        return str(exc)
    if not template._own:
        return None
    for tools in ((), _TRIAL_TOOLS):
        try:
            template.render(_TRIAL, tools)
        except PromptRefused as exc:
            offered = " offered a tool" if tools else ""
            return (
                f"{name_or_source}: its chat_template cannot render one user's 'Hi'"
                f"{offered}: {exc.message}"
            )
    return None
