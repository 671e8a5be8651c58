"""No field of a request reaches an external model unscanned (gateway.serving.outbound).

A request is built with a different secret in every one of its string fields, found
from the types themselves: a field added to `InferenceRequest` (or to anything it
holds) tomorrow gets a secret here too. Masked for an external model, nothing of the
request keeps a secret but the two fields no backend sends (`NOT_SENT`), and neither
the call a backend is given nor the body an OpenAI upstream or a Triton server is sent
holds one: a backend that starts to send one of those two fails here.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
import typing
from collections.abc import Iterator, Mapping
from enum import Enum
from typing import Any

import pytest

from gateway.backends import openai_compatible, triton_http
from gateway.config import ModelConfig
from gateway.inference.types import InferenceRequest, RequestKind
from gateway.serving.runtime import _route
from tests.unit.serving.test_outbound import config, model, prepare

# Fields the guard leaves alone, because no backend sends them (the test proves it).
NOT_SENT = {"model", "session"}


class Secrets:
    """A distinct AWS access key id for each field, and which field got which."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)
        self.by_field: dict[str, str] = {}

    def new(self, where: str) -> str:
        secret = f"AKIA{next(self._numbers):016d}"
        self.by_field[where] = secret
        return secret


def filled(kind: type, secrets: Secrets, where: str) -> Any:
    """An instance of the dataclass `kind` with every field filled: a secret in each
    string, JSON with secrets in each mapping, one element in each tuple."""
    hints = typing.get_type_hints(kind)
    return kind(
        **{
            f.name: value(hints[f.name], secrets, f"{where}.{f.name}")
            for f in dataclasses.fields(kind)
        }
    )


def value(hint: Any, secrets: Secrets, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is str:
        return secrets.new(where)
    if origin in (typing.Union, types.UnionType):
        return value(next(a for a in args if a is not type(None)), secrets, where)
    if origin is tuple:
        return (value(args[0], secrets, f"{where}[0]"),)
    if origin in (Mapping, dict) or hint is object or hint is Any:
        # A JSON Schema, or an API's own state (`wire_state`): any JSON.
        return {
            "description": secrets.new(f"{where}.description"),
            "enum": [secrets.new(f"{where}.enum")],
            "properties": {"x": {"default": secrets.new(f"{where}.default")}},
        }
    if origin is list:
        return [secrets.new(f"{where}[0]")]
    if isinstance(hint, type) and issubclass(hint, Enum):
        return next(iter(hint))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return filled(hint, secrets, where)
    if hint is bool:
        return False
    if hint in (int, float):
        return hint(1)
    raise AssertionError(f"no value for {where}: {hint!r}; teach this test the type")


def all_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, child in value.items():
            yield from all_strings(key)
            yield from all_strings(child)
    elif isinstance(value, list | tuple):
        for child in value:
            yield from all_strings(child)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from all_strings(getattr(value, f.name))


def request_of(kind: RequestKind) -> tuple[InferenceRequest, Secrets]:
    secrets = Secrets()
    request = dataclasses.replace(filled(InferenceRequest, secrets, "request"), kind=kind)
    return request, secrets


def test_every_string_field_of_a_request_is_filled() -> None:
    # The filler reaches every field the request path reads: messages, tools and their
    # schemas, stop sequences, ids, `user`, the API's own state.
    _, secrets = request_of(RequestKind.CHAT)
    assert {
        "request.messages[0].content",
        "request.messages[0].tool_calls[0].arguments",
        "request.messages[0].tool_calls[0].id",
        "request.messages[0].tool_call_id",
        "request.options.tools[0].description",
        "request.options.tools[0].parameters.enum",
        "request.options.response_format.schema.default",
        "request.params.stop[0]",
        "request.user",
        "request.wire_state.description",
    } <= set(secrets.by_field)


@pytest.mark.parametrize("kind", list(RequestKind))
def test_masking_leaves_no_secret_in_any_field(kind: RequestKind) -> None:
    request, secrets = request_of(kind)
    masked = prepare(config({"hosted": model(external=True)}), ["hosted"], request).requests[0]
    left = " ".join(all_strings(masked))
    kept = {where for where, secret in secrets.by_field.items() if secret in left}
    # Only what is never sent stays as it was.
    assert kept == {f"request.{name}" for name in NOT_SENT}


@pytest.mark.parametrize("kind", list(RequestKind))
@pytest.mark.parametrize("backend", ["openai", "triton_http"])
def test_nothing_a_backend_is_given_or_sends_holds_a_secret(
    kind: RequestKind, backend: str
) -> None:
    request, secrets = request_of(kind)
    masked = prepare(config({"hosted": model(external=True)}), ["hosted"], request).requests[0]
    spec: dict[str, Any] = {"backend": backend, "replicas": [{"url": "http://x"}]}
    if kind is RequestKind.EMBEDDING:
        spec["capabilities"] = {"embeddings": {"dimensions": 4}}
    route = _route("hosted", ModelConfig.model_validate(spec))
    call = route.upstream_call(masked)
    # The call a backend is given: its session key only places it on a replica.
    given = " ".join(all_strings(dataclasses.replace(call, session=None)))
    sent = []
    if kind is not RequestKind.EMBEDDING:
        # Every body a backend makes of it: OpenAI's, or each Triton interface's.
        bodies = (
            [openai_compatible._payload]
            if backend == "openai"
            else list(triton_http.generate_body.values())
        )
        sent = [body(call, stream).decode() for body in bodies for stream in (False, True)]
    for where, secret in secrets.by_field.items():
        assert secret not in given, where
        assert all(secret not in body for body in sent), where
    # Unmasked, they would have been there: the check is not vacuous.
    unmasked = " ".join(all_strings(route.upstream_call(request)))
    assert (
        secrets.by_field[
            "request.inputs[0]" if kind is RequestKind.EMBEDDING else "request.params.stop[0]"
        ]
        in unmasked
    )
