"""The tools a Responses answer echoes, and a stored response keeps: each tool with the
fields OpenAI's API gives its type and nothing else, and the fields the gateway does not
check bounded in size (issue 40: a `web_search` tool with an extra 500 KB field was
echoed, and kept for a day with every stored response).

The fields are those of the `openai` SDK's `types/responses/tool.py` (3.63.0), by tool
type. A field of no type there is dropped, as is every field of a type the gateway does
not know (only its `type` is echoed). An MCP tool's `authorization` and `headers` are
credentials for a server the gateway never calls: never echoed nor stored. What is left
of a tool besides the fields the gateway checks itself (a function's name, description,
parameters, strict; a custom tool's name, description and format) must fit in
`MAX_SETTINGS_BYTES` as JSON, else the request is a 400 naming the tool.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.api.errors import bad_request

# What a tool may hold, as compact JSON, in the fields the gateway does not check: far
# more than any hosted tool's settings (an MCP tool's allowed tools, a file search's
# filters), far less than a body.
MAX_SETTINGS_BYTES = 16 * 1024

_FUNCTION = frozenset(
    {
        *("type", "name", "description", "parameters", "strict"),
        *("defer_loading", "allowed_callers", "async", "output_schema"),
    }
)
_CUSTOM = frozenset(
    {"type", "name", "description", "format", "defer_loading", "allowed_callers", "async"}
)
_WEB_SEARCH = frozenset(
    {"type", "external_web_access", "filters", "search_context_size", "user_location"}
)
_WEB_SEARCH_PREVIEW = frozenset(
    {"type", "search_content_types", "search_context_size", "user_location"}
)
# By tool type: the fields OpenAI's API has for it.
KNOWN_FIELDS: dict[str, frozenset[str]] = {
    "function": _FUNCTION,
    "custom": _CUSTOM,
    "namespace": frozenset({"type", "name", "description", "tools"}),
    "file_search": frozenset(
        {"type", "filters", "max_num_results", "ranking_options", "vector_store_ids"}
    ),
    "computer": frozenset({"type"}),
    "computer_use_preview": frozenset({"type", "display_height", "display_width", "environment"}),
    "web_search": _WEB_SEARCH,
    "web_search_2025_08_26": _WEB_SEARCH,
    "web_search_preview": _WEB_SEARCH_PREVIEW,
    "web_search_preview_2025_03_11": _WEB_SEARCH_PREVIEW,
    # Without `authorization` and `headers`: credentials, never kept.
    "mcp": frozenset(
        {
            *("type", "allowed_callers", "allowed_tools", "connector_id", "defer_loading"),
            *("require_approval", "server_description", "server_label", "server_url"),
            "tunnel_id",
        }
    ),
    "code_interpreter": frozenset({"type", "allowed_callers", "container"}),
    "programmatic_tool_calling": frozenset({"type"}),
    "image_generation": frozenset(
        {
            *("type", "action", "background", "complexity", "frame_count"),
            *("frame_duration_ms", "input_fidelity", "input_image_mask", "model"),
            *("moderation", "output_compression", "output_format", "partial_images"),
            *("quality", "size", "svg"),
        }
    ),
    "local_shell": frozenset({"type"}),
    "shell": frozenset({"type", "allowed_callers", "environment"}),
    "tool_search": frozenset({"type", "description", "execution", "parameters"}),
    "apply_patch": frozenset({"type", "allowed_callers"}),
}
# What the gateway checks of the tools it offers the model (`responses_requests`): not
# counted against `MAX_SETTINGS_BYTES` (their own caps bound them).
_CHECKED = {
    "function": frozenset({"type", "name", "description", "parameters", "strict"}),
    "custom": frozenset({"type", "name", "description", "format"}),
    "namespace": frozenset({"type", "name", "description", "tools"}),
}
# A custom tool's `format`, as OpenAI's API has it (`text`, or a `grammar`).
_FORMAT_FIELDS = ("type", "syntax", "definition")


def echoed_tool(tool: dict[str, Any], kind: str, where: str) -> dict[str, Any]:
    """`tool` (of type `kind`, at `where` in the request, already checked as the model
    is offered it) as the answer echoes it."""
    known = KNOWN_FIELDS.get(kind, frozenset({"type"}))
    kept = {name: value for name, value in tool.items() if name in known}
    checked = _CHECKED.get(kind, frozenset({"type"}))
    rest = {name: value for name, value in kept.items() if name not in checked}
    if rest and len(orjson.dumps(rest)) > MAX_SETTINGS_BYTES:
        raise bad_request(
            f"`{where}` holds more than {MAX_SETTINGS_BYTES} bytes (as JSON) in its "
            f"settings {', '.join(f'`{name}`' for name in sorted(rest))} "
            "(fields the gateway does not know are dropped first).",
            where,
        )
    if kind == "custom" and isinstance(kept.get("format"), dict):
        text_format = kept["format"]
        kept["format"] = {k: text_format[k] for k in _FORMAT_FIELDS if k in text_format}
    if kind == "namespace":
        members = kept.get("tools")
        kept["tools"] = [
            echoed_tool(member, str(member.get("type")), f"{where}.tools[{number}]")
            for number, member in enumerate(members if isinstance(members, list) else [])
            if isinstance(member, dict)
        ]
    return kept
