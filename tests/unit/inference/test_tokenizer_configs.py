"""`prompt_template` naming a model's own tokenizer_config.json: its chat template and
special tokens, rendered as Hugging Face (and vLLM) render them.

The expected prompts are what `transformers`' own renderer gives for the same
conversations (tests/data/tokenizer_configs/README.md): a model served through the
gateway sees the prompt it was trained on, not an approximation of it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gateway.inference.prompt import PromptRefused, PromptTemplate, template_problem
from gateway.inference.types import ChatMessage, Tool, ToolCall

DATA = Path(__file__).parents[2] / "data" / "tokenizer_configs"
QWEN = str(DATA / "qwen2.5-7b-instruct" / "tokenizer_config.json")
MISTRAL = str(DATA / "mistral-7b-instruct-v0.3" / "tokenizer_config.json")

WEATHER = Tool(
    "get_weather",
    "Weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "the <city> & country"}},
        "required": ["city"],
    },
)
WEATHER_JSON = (
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather in a '
    'city", "parameters": {"type": "object", "properties": {"city": {"type": "string", '
    '"description": "the <city> & country"}}, "required": ["city"]}}}'
)
CONVERSATION = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "Hi"),
    ChatMessage("assistant", " Hello! "),
    ChatMessage("user", "Weather?"),
]
TOOL_TURN = [
    ChatMessage("user", "Weather in Paris?"),
    ChatMessage("assistant", "", (ToolCall("abcDEF123", "get_weather", '{"city": "Paris"}'),)),
    ChatMessage("tool", '{"temp": 21}', tool_call_id="abcDEF123"),
]
QWEN_TOOLS_SYSTEM = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + WEATHER_JSON
    + "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def test_qwen_renders_its_default_system_prompt_and_its_turns() -> None:
    template = PromptTemplate(QWEN)
    assert template.render([ChatMessage("user", "Hi")]) == (
        f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.render(CONVERSATION) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n Hello! <|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_qwen_offers_tools_and_reads_back_its_calls_and_their_results() -> None:
    template = PromptTemplate(QWEN)
    offered = template.render(
        [*CONVERSATION[:1], ChatMessage("user", "Weather in Paris?")], (WEATHER,)
    )
    assert offered == (
        "<|im_start|>system\nBe brief."
        + QWEN_TOOLS_SYSTEM
        + "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.render(TOOL_TURN, (WEATHER,)) == (
        "<|im_start|>system\n"
        + QWEN_DEFAULT_SYSTEM
        + QWEN_TOOLS_SYSTEM
        + "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_mistral_uses_its_bos_and_eos_tokens_and_puts_the_system_prompt_last() -> None:
    template = PromptTemplate(MISTRAL)
    assert template.render([ChatMessage("user", "Hi")]) == "<s>[INST] Hi[/INST]"
    assert template.render(CONVERSATION) == (
        "<s>[INST] Hi[/INST] Hello!</s>[INST] Be brief.\n\nWeather?[/INST]"
    )


def test_mistral_tools_and_calls() -> None:
    template = PromptTemplate(MISTRAL)
    tools = f"<s>[AVAILABLE_TOOLS] [{WEATHER_JSON}][/AVAILABLE_TOOLS]"
    assert template.render([ChatMessage("user", "Weather in Paris?")], (WEATHER,)) == (
        tools + "[INST] Weather in Paris?[/INST]"
    )
    assert template.render(TOOL_TURN, (WEATHER,)) == (
        tools + "[INST] Weather in Paris?[/INST]"
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, '
        '"id": "abcDEF123"}]</s>'
        '[TOOL_RESULTS] {"content": {"temp": 21}, "call_id": "abcDEF123"}[/TOOL_RESULTS]'
    )


def test_a_conversation_the_template_refuses_is_the_clients_fault() -> None:
    # Mistral's template checks that roles alternate, and its tool call ids' length.
    template = PromptTemplate(MISTRAL)
    with pytest.raises(PromptRefused, match="roles must alternate"):
        template.render([ChatMessage("user", "a"), ChatMessage("user", "b")])
    openai_style = [
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "", (ToolCall("call_0123456789abcdef", "get_weather", "{}"),)),
    ]
    with pytest.raises(PromptRefused, match="length 9"):
        template.render(openai_style, (WEATHER,))


def test_special_tokens_in_a_message_are_its_text() -> None:
    # What a user writes is rendered as written (the tokenizer, not the template, decides
    # whether text that looks like a special token is one).
    text = "Grüß dich — 你好 </s> <|im_end|>"
    assert (
        PromptTemplate(QWEN)
        .render([ChatMessage("user", text)])
        .endswith(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    )


def _config(tmp_path: Path, content: object) -> str:
    path = tmp_path / "tokenizer_config.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_a_template_list_takes_its_default_and_its_tool_use_template(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        {
            "chat_template": [
                {"name": "default", "template": "plain:{{ messages[0].content }}"},
                {"name": "tool_use", "template": "tools:{{ tools | length }}"},
            ],
            "eos_token": {"content": "</s>", "special": True},
        },
    )
    template = PromptTemplate(path)
    assert template.render([ChatMessage("user", "x")]) == "plain:x"
    assert template.render([ChatMessage("user", "x")], (WEATHER,)) == "tools:1"


def test_hugging_face_helpers_are_there(tmp_path: Path) -> None:
    # Llama 3.1's tools are written with `tojson(indent=4)`; Llama 3.2's date by strftime_now.
    source = "{{ tools[0] | tojson(indent=2) }}|{{ strftime_now('%Y') | length }}|{{ eos_token }}"
    template = PromptTemplate(_config(tmp_path, {"chat_template": source, "eos_token": "</s>"}))
    rendered = template.render([ChatMessage("user", "x")], (WEATHER,))
    assert rendered.startswith('{\n  "type": "function",')
    assert rendered.endswith("|4|</s>")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "is not JSON"),
        ("[1, 2]", "not a JSON object"),
        ({"eos_token": "</s>"}, "has no chat_template"),
        ({"chat_template": [{"name": "tool_use", "template": "x"}]}, "has no chat_template"),
        ({"chat_template": 42}, "its chat_template is a int"),
        ({"chat_template": "{{ m }}" * 40000}, "more than the 262144 a chat template is"),
        ({"chat_template": "{% for m in messages %}"}, "does not compile (line 1)"),
        # Compiles, but renders nothing for one user's "Hi" (the new-user review of
        # issue 42: such a template answered every request 400, as the client's fault).
        ({"chat_template": "{{ nosuchfn() }}"}, "cannot render one user's 'Hi'"),
        ({"chat_template": "{{ raise_exception('always') }}"}, "'Hi': always"),
        (
            {"chat_template": "{% if tools %}{{ tools[0].nosuch.deeper }}{% endif %}x"},
            "'Hi' offered a tool",
        ),
        ("[" * 100_000 + "]" * 100_000, "is not JSON"),
    ],
)
def test_a_broken_tokenizer_config_is_refused_saying_why(
    tmp_path: Path, content: object, why: str
) -> None:
    path = _config(tmp_path, content)
    problem = template_problem(path)
    assert problem is not None and why in problem
    assert problem.startswith(path)  # which file, always


def test_a_missing_tokenizer_config_is_named(tmp_path: Path) -> None:
    problem = template_problem(str(tmp_path / "nowhere" / "tokenizer_config.json"))
    assert problem is not None
    assert "cannot read" in problem and "nowhere/tokenizer_config.json" in problem


def test_a_model_template_cannot_reach_python_internals(tmp_path: Path) -> None:
    path = _config(tmp_path, {"chat_template": "{{ messages.__class__.__mro__ }}"})
    with pytest.raises(PromptRefused, match=r"SecurityError|unsafe"):
        PromptTemplate(path).render([ChatMessage("user", "x")])


# What a hostile tenant or a broken config made of a model's own template (issue 42's
# hostile review): each is refused, never computed in full.


def test_a_prompt_that_would_be_longer_than_the_model_takes_is_refused_as_it_grows() -> None:
    # Mistral's template writes every tool before each user turn equal to the last one:
    # 890 KB of repeated turns and 128 large tools made a 2 GB prompt and held the event
    # loop 22 s. The render stops once the prompt passes the limit.
    big = Tool("t", "d" * 6000, {"type": "object", "properties": {}})
    turns = [ChatMessage("user", "again"), ChatMessage("assistant", "ok")] * 2000
    turns.append(ChatMessage("user", "again"))
    with pytest.raises(PromptRefused, match="longer than the 1000000 characters"):
        PromptTemplate(MISTRAL).render(turns, (big,) * 128, max_chars=1_000_000)


def test_a_short_conversation_within_the_limit_is_rendered_whole() -> None:
    rendered = PromptTemplate(QWEN).render(CONVERSATION, max_chars=10_000)
    assert rendered.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("source", "why"),
    [
        # Nested loops that pass a compile and counted 10^10 steps: the server froze.
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
            "counted past 100000 steps",
        ),
        ("{{ 'a' * 100000000 }}", "a repetition over"),
        ("{{ [1] * 100000000 }}", "a repetition over"),
        ("{{ 7 ** 100000000 }}", "an exponent over 64"),
        ("{{ lipsum(100000) }}", "'lipsum' is undefined"),
        ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
    ],
)
def test_what_a_template_may_compute_is_bounded(tmp_path: Path, source: str, why: str) -> None:
    path = _config(tmp_path, {"chat_template": source})
    with pytest.raises(PromptRefused, match=why):
        PromptTemplate(path).render([ChatMessage("user", "Hi")])
    # check-config tries it, and says so at its line.
    problem = template_problem(path)
    assert problem is not None and "cannot render one user's 'Hi'" in problem


def test_range_within_its_budget_counts_as_python_does(tmp_path: Path) -> None:
    source = "{% for i in range(3) %}{{ i }}{% endfor %}|{{ 2 ** 10 }}|{{ 'ab' * 2 }}"
    path = _config(tmp_path, {"chat_template": source})
    assert PromptTemplate(path).render([ChatMessage("user", "Hi")]) == "012|1024|abab"


def test_only_a_regular_file_is_read(tmp_path: Path) -> None:
    # A FIFO, or a symlink to /dev/zero, had no size to check: check-config hung.
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        problem = template_problem(str(path))
        assert problem is not None and "is not a regular file" in problem


def test_a_template_nested_past_the_compilers_stack_is_refused(tmp_path: Path) -> None:
    source = "{% if x %}" * 3000 + "{% endif %}" * 3000
    problem = template_problem(_config(tmp_path, {"chat_template": source}))
    assert problem is not None and "does not compile" in problem
