"""Tracing's settings: gateway.yaml's `tracing:` section over the standard `OTEL_*`
environment, as every OpenTelemetry program reads it (docs/observability.md, "Traces").

Apart from `tracing` (which traces requests) and `trace_export` (which sends spans), so
that each reads them without importing the other.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

HTTP_PROTOBUF = "http/protobuf"
GRPC = "grpc"
PROTOCOLS = (HTTP_PROTOBUF, GRPC)
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
DEFAULT_SERVICE_NAME = "inference-gateway"


class TracingError(ValueError):
    """The tracing settings cannot be used: names the setting and why."""


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """Where spans go and which requests make them (see `settings`)."""

    endpoint: str
    protocol: str = HTTP_PROTOBUF
    # The sampler's ratio for a request without a parent to follow (1.0: every one).
    ratio: float = 1.0
    # Whether a client's sampled flag counts (the `parentbased_*` samplers).
    parent_based: bool = True
    # Client-sampled traces a second (per process) past the ratio; then the ratio decides.
    client_sampled_per_second: float = 10.0
    # None: the exporter's own (OTEL_EXPORTER_OTLP_HEADERS).
    headers: Mapping[str, str] | None = None
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    max_queue_size: int = 2048
    max_export_batch_size: int = 512
    schedule_delay_s: float = 1.0
    export_timeout_s: float = 10.0


def settings(explicit: Mapping[str, Any], environ: Mapping[str, str]) -> TracingSettings | None:
    """The tracing settings from gateway.yaml's `tracing:` section (`explicit`: only the
    keys it sets) over the standard OpenTelemetry environment; None when tracing is off.

    On when `explicit` says `enabled: true` or names an endpoint, or when it says
    nothing of either and the environment names an OTLP endpoint
    (`OTEL_EXPORTER_OTLP_ENDPOINT` or its `_TRACES_` form) without
    `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. Raises
    `TracingError` for an environment value that cannot be used."""
    enabled = explicit.get("enabled")
    if enabled is False:
        return None
    traces_endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base_endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if enabled is None and not explicit.get("endpoint"):
        disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
        no_exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
        if disabled or no_exporter or not (traces_endpoint or base_endpoint):
            return None
    named, protocol = _first(
        environ, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    protocol = str(explicit.get("protocol") or protocol or HTTP_PROTOBUF)
    if protocol not in PROTOCOLS:
        raise TracingError(f"{named}: {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    endpoint = str(explicit.get("endpoint") or "") or traces_endpoint
    if not endpoint:
        base = base_endpoint or (
            "http://localhost:4317" if protocol == GRPC else "http://localhost:4318"
        )
        # The base endpoint's signal path is added for HTTP, as the specification says.
        endpoint = base if protocol == GRPC else base.rstrip("/") + "/v1/traces"
    if not _URL.fullmatch(endpoint):
        raise TracingError(f"OTEL_EXPORTER_OTLP_ENDPOINT: {endpoint!r} is not an http(s) URL")
    _check_exporter_environment(environ)
    sampler = str(
        explicit.get("sampler")
        or environ.get("OTEL_TRACES_SAMPLER", "").strip()
        or "parentbased_always_on"
    )
    if sampler not in SAMPLERS:
        raise TracingError(f"OTEL_TRACES_SAMPLER: {sampler!r} is not one of {', '.join(SAMPLERS)}")
    ratio = _ratio(sampler, explicit.get("sampler_arg"), environ.get("OTEL_TRACES_SAMPLER_ARG"))
    resource = _resource_attributes(environ.get("OTEL_RESOURCE_ATTRIBUTES", ""))
    service = explicit.get("service_name") or environ.get("OTEL_SERVICE_NAME", "").strip()
    resource["service.name"] = str(service or resource.get("service.name") or DEFAULT_SERVICE_NAME)
    resource.update(
        {str(k): str(v) for k, v in (explicit.get("resource_attributes") or {}).items()}
    )
    headers = explicit.get("headers")
    given = _batching(environ)
    given.update(
        {
            key: explicit[key]
            for key in (
                "client_sampled_per_second",
                "max_queue_size",
                "max_export_batch_size",
                "schedule_delay_s",
                "export_timeout_s",
            )
            if explicit.get(key) is not None
        }
    )
    return TracingSettings(
        endpoint=endpoint,
        protocol=protocol,
        ratio=ratio,
        parent_based=sampler.startswith("parentbased_"),
        headers=None if headers is None else {str(k): str(v) for k, v in headers.items()},
        resource_attributes=resource,
        **given,
    )


# The batch span processor's standard variables: (setting, scale to its unit).
_BATCHING = {
    "OTEL_BSP_MAX_QUEUE_SIZE": ("max_queue_size", None),
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": ("max_export_batch_size", None),
    "OTEL_BSP_SCHEDULE_DELAY": ("schedule_delay_s", 1000.0),  # milliseconds
    "OTEL_BSP_EXPORT_TIMEOUT": ("export_timeout_s", 1000.0),
    "OTEL_EXPORTER_OTLP_TIMEOUT": ("export_timeout_s", 1000.0),
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": ("export_timeout_s", 1000.0),
}
_URL = re.compile(r"https?://[^\s/?#]+(/[^\s]*)?")


# The most each may be (as gateway.yaml's `tracing:` bounds them): an hour's delay, ten
# minutes' timeout; a larger one overflows the export thread's timers.
_BATCHING_MOST = {
    "max_queue_size": 1_000_000,
    "max_export_batch_size": 100_000,
    "schedule_delay_s": 3600,
    "export_timeout_s": 600,
}
# An OTLP exporter's headers variable, as OpenTelemetry's own parser takes it: a member
# it cannot read it logs, secret and all, so one is refused here first.
_HEADER = re.compile(
    r"[ \t]*[\x21\x23-\x27\x2a\x2b\x2d\x2e\x30-\x39\x41-\x5a\x5e-\x7a\x7c\x7e]+[ \t]*="
    r"[ \t]*[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*"
)
_FILES = (
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
)


def _first(environ: Mapping[str, str], *variables: str) -> tuple[str, str]:
    """The first of `variables` set (its name and value), else the last's name and ''."""
    for variable in variables:
        value = environ.get(variable, "").strip()
        if value:
            return variable, value
    return variables[-1], ""


def _batching(environ: Mapping[str, str]) -> dict[str, Any]:
    """The export queue's settings the environment gives (positive whole numbers)."""
    given: dict[str, Any] = {}
    for variable, (setting, per_unit) in _BATCHING.items():
        text = environ.get(variable, "").strip()
        if not text:
            continue
        if not text.isdecimal() or int(text) < 1:
            raise TracingError(f"{variable}: {text!r} is not a positive whole number")
        value = int(text) if per_unit is None else int(text) / per_unit
        if value > _BATCHING_MOST[setting]:
            most = _BATCHING_MOST[setting] * (per_unit or 1)
            raise TracingError(f"{variable}: {text} is more than {most:g}")
        given[setting] = value
    return given


def _check_exporter_environment(environ: Mapping[str, str]) -> None:
    """The variables the OTLP exporter reads itself: headers it can parse (a member it
    cannot, it would log: the secret in it with it, so its text is not shown here
    either), certificate files that are there."""
    for variable in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        members = [m for m in re.split(r"[ \t]*,[ \t]*", environ.get(variable, "")) if m]
        for number, member in enumerate(members, start=1):
            if not _HEADER.fullmatch(member.strip()):
                raise TracingError(
                    f"{variable}: member {number} is not name=value (its text is not shown: "
                    "it may hold a secret)"
                )
    for variable in _FILES:
        path = environ.get(variable, "").strip()
        if path and not os.path.isfile(path):
            raise TracingError(f"{variable}: {path!r} is not a file")


def _ratio(sampler: str, explicit: object, environ: str | None) -> float:
    if sampler.endswith("always_on"):
        return 1.0
    if sampler.endswith("always_off"):
        return 0.0
    if explicit is not None:
        return float(explicit)  # type: ignore[arg-type]  # checked by the config schema
    if environ is None or not environ.strip():
        return 1.0
    try:
        ratio = float(environ)
    except ValueError:
        raise TracingError(f"OTEL_TRACES_SAMPLER_ARG: {environ!r} is not a number") from None
    if not 0.0 <= ratio <= 1.0:
        raise TracingError(f"OTEL_TRACES_SAMPLER_ARG: {ratio} is not between 0 and 1")
    return ratio


def _resource_attributes(text: str) -> dict[str, str]:
    """`OTEL_RESOURCE_ATTRIBUTES` (`key=value,...`, values percent-encoded)."""
    from urllib.parse import unquote

    attributes: dict[str, str] = {}
    for member in text.split(","):
        key, sep, value = member.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = unquote(value.strip())
    return attributes
