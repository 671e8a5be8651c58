"""The typed shape of `gateway.yaml` and `tenants.yaml`.

Every model forbids unknown keys, so a typo in a config file is an error with a
line number rather than a silently ignored setting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    HttpUrl,
    IPvAnyNetwork,
    PlainValidator,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic import Strict as StrictMode

from gateway.config.ledger_config import LedgerConfig
from gateway.config.source import EnvText


def _from_env(number: Callable[[str], Any]) -> Callable[[Any], Any]:
    """A validator: the number a `${VAR}` substitution spelled; anything else is left to
    refuse."""

    def parse(value: Any) -> Any:
        if isinstance(value, EnvText):
            try:
                return number(value)
            except ValueError:
                return value
        return value

    return parse


# Strict numbers: `true` is not 1 and "12" is not 12 (pydantic's lax mode takes both).
# Only a value substituted from the environment may be a text that spells a number.
Int = Annotated[int, StrictMode(), BeforeValidator(_from_env(int))]
Float = Annotated[float, StrictMode(), BeforeValidator(_from_env(float))]  # ints are accepted
NonNegativeInt = Annotated[Int, Field(ge=0)]
PositiveInt = Annotated[Int, Field(gt=0)]
PositiveFloat = Annotated[Float, Field(gt=0)]


def _existing_file(path: str) -> str:
    if not os.path.isfile(os.path.expanduser(path)):
        raise ValueError(f"no such file: {path}")
    return path


# What the Kubernetes API accepts as the names the gateway reads (checked here, so that
# `check-config` says it, not the API at run time): a namespace or a Service is a DNS
# label; a Deployment or a Lease a DNS subdomain; a Service's port name an IANA service
# name; a kubeconfig a file that is there.
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _kubernetes_name(kind: str, most: int, dots: bool) -> Callable[[str], str]:
    def check(name: str) -> str:
        parts = name.split(".") if dots else [name]
        if len(name) > most or not all(_LABEL.fullmatch(part) for part in parts):
            raise ValueError(
                f"not a Kubernetes {kind}: lowercase letters, digits and '-'"
                f"{', dot-separated' if dots else ''}, starting and ending with a letter or"
                f" digit, at most {most} characters"
            )
        return name

    return check


KubernetesLabel = Annotated[str, AfterValidator(_kubernetes_name("name (a DNS label)", 63, False))]
KubernetesSubdomain = Annotated[
    str, AfterValidator(_kubernetes_name("name (a DNS subdomain)", 253, True))
]
_port_name = _kubernetes_name("port name", 15, False)


def _port(value: object) -> str | int:
    """A Service's port: its number, or its name."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536:
        return value
    if isinstance(value, str):
        return int(value) if value.isdecimal() and 0 < int(value) < 65536 else _port_name(value)
    raise ValueError("a port number (1 to 65535) or a port name")


KubernetesPort = Annotated[str | int, PlainValidator(_port)]
Kubeconfig = Annotated[str, AfterValidator(_existing_file)]


class Strict(BaseModel):
    """Base for config sections: unknown keys are errors, objects are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class BackendKind(StrEnum):
    """How the gateway talks to a model's replicas."""

    TRITON_HTTP = "triton_http"  # Triton generate / generate_stream
    TRITON_GRPC = "triton_grpc"  # Triton ModelStreamInfer
    OPENAI = "openai"  # any OpenAI-compatible server (vLLM, TGI, Triton's frontend)


class TritonInterface(StrEnum):
    """The inputs a Triton LLM model takes, which its Triton backend decides."""

    # text_input, max_tokens and stream as inputs, sampling as request parameters (the
    # simulated models and a Python model written to that convention).
    GENERIC = "generic"
    # Triton's vLLM backend: sampling in the `sampling_parameters` input (JSON text, so
    # that `stop` stays a list), the prompt left out of the answer, token counts asked for.
    VLLM = "vllm"
    # TensorRT-LLM's in-flight batcher (its `ensemble` or `tensorrt_llm_bls` model):
    # every setting an input of its own (`seed`, `stop_words`), token counts asked for.
    TENSORRTLLM = "tensorrtllm"


class OpsOnApiPort(StrEnum):
    """What `/metrics` and `/admin/*` do on the API port."""

    ADMIN_KEY = "admin_key"  # served to requests with an admin tenant's key
    OFF = "off"  # 404, as an unknown path: only the ops listener serves them


def _unquoted_off(value: Any) -> Any:
    """YAML 1.1 reads an unquoted `off` as false: take it as the `off` that was meant."""
    return "off" if value is False else value


class OpsConfig(Strict):
    """The ops listener: `/metrics`, `/admin/*` and the probes on their own host:port,
    which a network policy or a firewall can keep apart from the API's clients."""

    host: str = "127.0.0.1"
    # None: no ops listener (then only the API port serves them, per `on_api_port`).
    port: Annotated[Int, Field(ge=1, le=65535)] | None = None
    on_api_port: Annotated[OpsOnApiPort, BeforeValidator(_unquoted_off)] = OpsOnApiPort.ADMIN_KEY


class JsonSchemaConfig(Strict):
    """Caps on a client's JSON Schemas (tool parameters, `response_format`): each is
    refused with a 400 naming the cap it passes (see `gateway.inference.schemas`)."""

    # The schema's size as compact JSON.
    max_bytes: PositiveInt = 65_536
    # Levels of JSON objects and arrays, the schema itself being level 1.
    max_depth: Annotated[Int, Field(ge=2, le=256)] = 32
    # Entries of `properties` and `patternProperties`, all levels together.
    max_properties: PositiveInt = 1_024


class ServerConfig(Strict):
    host: str = "127.0.0.1"
    port: Annotated[Int, Field(ge=1, le=65535)] = 8080
    max_body_bytes: PositiveInt = 1_048_576
    # Seconds a graceful shutdown waits for in-flight requests.
    shutdown_grace_s: PositiveFloat = 10.0
    # A streaming client that takes no event for this long is cut off (the upstream
    # request is cancelled); until then flow control pauses the relay.
    stream_stall_timeout_s: PositiveFloat = 30.0
    # A Messages API stream that has sent nothing for this long sends a `ping` event (as
    # Anthropic does), so that proxies and clients do not take a slow model for a dead
    # connection.
    stream_ping_interval_s: PositiveFloat = 10.0
    # Log prompts in clear text (off: they are never logged).
    log_prompts: bool = False
    # Reload the tenants file when it changes (SIGHUP and the admin API always work).
    watch_tenants_file: bool = True
    # Connection limits (per worker process), against clients that never finish:
    # a request's head (request line and headers) must arrive within this time of its
    # first byte (or of the connection opening); else 408 and the connection is closed.
    head_timeout_s: PositiveFloat = 10.0
    # The longest pause while a request's body arrives; then the connection is closed.
    body_gap_timeout_s: PositiveFloat = 30.0
    # A request head larger than this is refused with 431 (nginx's default is 32 KiB).
    max_head_bytes: PositiveInt = 32_768
    # Open connections per worker; a new one beyond it gets a 503 at once and is closed.
    # Kept below the process's descriptor limit (RLIMIT_NOFILE) less 256 for upstreams.
    max_connections: PositiveInt = 4096
    # A connection whose request head is still not complete this long after it opened
    # (or after the request's first byte) is slow. A fast client, however many at once,
    # never is: only slow ones count against max_slow_connections_per_address.
    slow_head_grace_s: PositiveFloat = 2.0
    # Slow connections from one client address (an IPv6 one: its /64) at once; past it a
    # connection turning slow gets a 429 + Retry-After and is closed (readable: what the
    # client still sends is read and dropped first). A slow-loris from one address holds
    # this many slots past the grace, each until head_timeout_s. 0: no cap.
    max_slow_connections_per_address: NonNegativeInt = 32
    # Open connections from one client address (IPv6: its /64), keyed or not; beyond it
    # a new one gets a 429 + Retry-After, so that one tenant's address cannot hold every
    # slot of max_connections with keep-alive requests. 0: no cap.
    max_connections_per_address: NonNegativeInt = 1024
    # Load balancers and proxies in front of the gateway (addresses or CIDR networks).
    # Their connections are not counted per address (theirs is not a client's); the
    # client's address comes from the PROXY protocol header (proxy_protocol, L4 load
    # balancers: the caps then apply to it) or from X-Forwarded-For (L7 proxies, which
    # buffer a request's head themselves: the slow cap is theirs). Empty: trust none,
    # and X-Forwarded-For is ignored.
    trusted_proxies: list[IPvAnyNetwork] = []
    # Connections from trusted_proxies start with a PROXY protocol header (v1 or v2:
    # HAProxy, AWS NLB, Envoy, nginx's proxy_protocol on); one without is refused.
    proxy_protocol: bool = False
    # A keep-alive connection idle this long between requests is closed. Longer than the
    # clients' own idle expiry (httpx 5 s, aiohttp 15 s), so that the client closes first:
    # a server that closes at the moment a client reuses the connection fails that request.
    keepalive_timeout_s: PositiveInt = 20
    ops: OpsConfig = OpsConfig()
    json_schema: JsonSchemaConfig = JsonSchemaConfig()

    # Gone (issue 39): named here only so that a config still setting it is told, at its
    # line, what replaced it.
    max_unauthenticated_connections_per_address: None = None

    @field_validator("max_unauthenticated_connections_per_address", mode="before")
    @classmethod
    def _gone(cls, value: object) -> None:
        raise ValueError(
            "this key is gone: new connections no longer count, only slow ones do "
            "(max_slow_connections_per_address, slow_head_grace_s; behind a load balancer, "
            "trusted_proxies)"
        )

    @field_validator("proxy_protocol")
    @classmethod
    def _proxy_protocol_needs_proxies(cls, on: bool, info: ValidationInfo) -> bool:
        if on and not info.data.get("trusted_proxies"):
            raise ValueError("on, but trusted_proxies names no proxy to expect the header from")
        return on


class RedisSentinel(Strict):
    """Redis Sentinel: the sentinels that name the primary, and the service they watch."""

    # The primary's name in the sentinels' config (`sentinel monitor <service> ...`).
    service: str = "mymaster"
    # `host:port` of each sentinel; any one that answers is enough.
    nodes: Annotated[list[str], Field(min_length=1)]

    @field_validator("nodes")
    @classmethod
    def _host_and_port(cls, nodes: list[str]) -> list[str]:
        for node in nodes:
            _sentinel_address(node)
        return nodes

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each node."""
        return [_sentinel_address(node) for node in self.nodes]


def _sentinel_address(node: str) -> tuple[str, int]:
    host, _, port = node.rpartition(":")
    if not host or not port.isdecimal():
        raise ValueError(f"sentinel node {node!r}: expected host:port")
    return host, int(port)


class RedisConfig(Strict):
    # `embedded://` runs fakeredis with Lua inside the gateway process.
    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "gw"
    socket_timeout_s: PositiveFloat = 0.5
    # A Redis Cluster: `url` names any one of its nodes.
    cluster: bool = False
    # A primary that fails over, found through Redis Sentinel: `url` then gives only the
    # database number and credentials; the primary's address comes from the sentinels.
    sentinel: RedisSentinel | None = None

    @model_validator(mode="after")
    def _one_topology(self) -> RedisConfig:
        if self.cluster and self.sentinel is not None:
            raise ValueError("cluster and sentinel exclude each other: choose one")
        return self


class PlacementConfig(Strict):
    """Who places cluster.yaml's deployments when several gateways run."""

    # `none`: this gateway places them (one gateway). `redis`: the gateways elect one
    # leader through a lease in Redis, which places and publishes the placement; the
    # others serve from what it published (gateway_control/placement/leadership.py).
    # `kubernetes`: the same through a Kubernetes Lease object (coordination.k8s.io/v1).
    leader_election: Literal["none", "redis", "kubernetes"] = "none"
    # The lease expires this long after its holder last renewed it (every third of it):
    # a dead leader is replaced within about this long.
    lease_ttl_s: PositiveFloat = 10.0
    # With `kubernetes`: the Lease's name and namespace (default: $POD_NAMESPACE, else
    # the pod's service-account namespace), and a kubeconfig file (default: the pod's
    # service account in a cluster, else $KUBECONFIG or ~/.kube/config).
    lease_name: KubernetesSubdomain = "gateway-placement"
    lease_namespace: KubernetesLabel | None = None
    kubeconfig: Kubeconfig | None = None


class RedisFailureMode(StrEnum):
    """What the rate limiter does while Redis cannot be reached."""

    LOCAL = "local"  # in-process buckets at limit / gateway_replicas
    OPEN = "open"  # admit everything
    CLOSED = "closed"  # refuse with 503 and Retry-After


class RateLimitConfig(Strict):
    on_redis_error: RedisFailureMode = RedisFailureMode.LOCAL
    # How many gateway replicas share the limits: `local` mode enforces limit / this.
    gateway_replicas: PositiveInt = 1
    # Completion tokens reserved for a request that gives no max_tokens; more is charged
    # as the response streams.
    completion_tokens_estimate: PositiveInt = 256
    # While streaming, tokens beyond the reservation are charged in batches of this size.
    charge_batch_tokens: PositiveInt = 64
    # While Redis is down, how often to try it again.
    redis_retry_s: PositiveFloat = 1.0


class Replica(Strict):
    # http(s)://host:port for triton_http and openai; host:port for triton_grpc.
    url: str
    # Triton's metrics endpoint; default: the HTTP port + 2 (the gRPC port + 1).
    metrics_url: HttpUrl | None = None


class KubernetesEndpoints(Strict):
    """A Service's ready endpoints, from its EndpointSlices in the Kubernetes API."""

    service: KubernetesLabel
    # The Service's port by name (`http`, `grpc`) or number.
    port: KubernetesPort
    # Default: $POD_NAMESPACE, else the pod's service-account namespace.
    namespace: KubernetesLabel | None = None
    # Default: the pod's service account inside a cluster, else $KUBECONFIG.
    kubeconfig: Kubeconfig | None = None


class Discovery(Strict):
    """A model's replicas, looked up again every `interval_s`: from DNS (the A records of
    a name, a Kubernetes headless Service's: one per ready pod, with `port`; or SRV
    records, each naming a host and its port), or from a Service's EndpointSlices in the
    Kubernetes API (`kubernetes`)."""

    dns: str | None = None
    kubernetes: KubernetesEndpoints | None = None
    record: Literal["A", "SRV"] = "A"
    port: PositiveInt | None = None  # with A records; SRV records carry their own
    scheme: Literal["http", "https"] = "http"  # for triton_http and openai backends
    interval_s: PositiveFloat = 5.0
    timeout_s: PositiveFloat = 2.0
    # `host` or `host:port` of the DNS servers to ask; empty: the system's resolver.
    nameservers: list[str] = []

    @model_validator(mode="after")
    def _port_for_a_records(self) -> Discovery:
        if (self.dns is None) == (self.kubernetes is None):
            raise ValueError("give one of dns and kubernetes")
        if self.kubernetes is not None:
            return self
        if self.record == "A" and self.port is None:
            raise ValueError("A records carry no port: set port (or use record: SRV)")
        if self.record == "SRV" and self.port is not None:
            raise ValueError("SRV records carry their own port: leave port out")
        return self


class Timeouts(Strict):
    connect_s: PositiveFloat = 2.0
    # Time allowed until the first token arrives, for a prompt of no tokens...
    first_token_s: PositiveFloat = 30.0
    # ...and this much more per prompt token: a long prompt takes longer to prefill (a
    # coding agent's first request carries 20 to 40 KB of instructions), and a fixed
    # budget would send every such request to the fallback. About the replica's prefill
    # time per token, with room for a queue; 0: a fixed budget. The prompt's tokens are
    # the gateway's estimate (`estimate_tokens`: four ASCII characters a token, more for
    # other text). A late first token of a long prompt counts against a replica only if
    # it is failing already (`gateway.upstream.failover`).
    first_token_per_prompt_token_s: Annotated[Float, Field(ge=0)] = 0.0
    # Time allowed for the whole request.
    total_s: PositiveFloat = 300.0

    def first_token_budget(self, prompt_tokens: int) -> float:
        """Seconds a request with `prompt_tokens` may wait for its first token."""
        return self.first_token_s + self.first_token_per_prompt_token_s * prompt_tokens


class QueueLimits(Strict):
    max_queued: NonNegativeInt = 256
    max_in_flight_per_replica: PositiveInt = 64


class HealthCheck(Strict):
    interval_s: PositiveFloat = 2.0
    timeout_s: PositiveFloat = 1.0
    # Failed checks in a row before a replica that was healthy is taken out (one check
    # can time out while its Triton loads another model). A replica never seen healthy
    # is out at its first failure; requests that fail eject a replica sooner (outlier).
    unhealthy_after: PositiveInt = 2


class FallbackReason(StrEnum):
    """Why a request moves to the next model of its fallback chain."""

    TTFT_TIMEOUT = "ttft_timeout"  # no first token within timeouts.first_token_s
    PREDICTED_WAIT = "predicted_wait"  # queue wait + usual latency would miss the deadline
    QUEUE_FULL = "queue_full"  # the model's queue is full
    REPLICA_ERROR = "replica_error"  # every replica tried failed


class RetryPolicy(Strict):
    """Retries of transient upstream failures, on another replica, before any output."""

    backoff_base_s: PositiveFloat = 0.05
    backoff_cap_s: PositiveFloat = 1.0
    # At most this fraction of recent requests may be retries (at least min_per_s).
    budget_ratio: Annotated[Float, Field(ge=0, le=10)] = 0.2
    budget_min_per_s: Annotated[Float, Field(ge=0)] = 1.0
    budget_window_s: PositiveFloat = 10.0


class OutlierPolicy(Strict):
    """Passive ejection: a replica that keeps failing is left out for a cool-down."""

    consecutive_failures: PositiveInt = 3
    base_ejection_s: PositiveFloat = 5.0
    max_ejection_s: PositiveFloat = 60.0


class ToolParserName(StrEnum):
    """How a Triton model writes its tool calls (gateway/inference/tool_parsers.py)."""

    HERMES = "hermes"  # <tool_call>{"name": ..., "arguments": ...}</tool_call>
    LLAMA3_JSON = "llama3_json"  # {"name": ..., "parameters": ...}


class Embeddings(Strict):
    """An embedding model (`/v1/embeddings`): text in, a vector of `dimensions` out.

    A Triton model is called through the standard `infer` API (KServe v2): a BYTES
    tensor of texts in, an FP32 tensor of one vector per text out (and, if the model
    reports them, an INT32 `num_input_tokens` per text).
    """

    dimensions: PositiveInt
    # Whether a client may ask for shorter vectors (`dimensions`): for a Triton model the
    # gateway keeps the leading coordinates and normalizes them again (Matryoshka
    # models); an `openai` upstream is sent the field.
    shortenable: bool = False
    # Texts per upstream request: a longer list is split into several, sent at once.
    max_batch: PositiveInt = 32
    # Texts per client request, and tokens (the gateway's estimate) per text.
    max_inputs: PositiveInt = 2048
    max_input_tokens: PositiveInt = 8192
    # The Triton model's tensors.
    input_tensor: str = "text_input"
    output_tensor: str = "embedding"


class Capabilities(Strict):
    """What a model can do beyond plain text; a request that needs more is a 400."""

    # Function calling (`tools`, `tool_choice`, tool calls and results in the history):
    # an `openai` upstream takes them as they are; a Triton model gets them rendered by
    # its prompt template, and its calls are read from its text by `tool_parser`.
    tools: bool = False
    tool_parser: ToolParserName | None = None
    # Structured outputs (`response_format` json_object / json_schema): an `openai`
    # upstream takes it as it is; a Triton model gets it as guided decoding parameters.
    structured_outputs: bool = False
    # Log probabilities (`logprobs`) as the upstream returns them: an `openai` upstream
    # with `top_logprobs` alternatives; a Triton model the chosen tokens' only, as
    # TensorRT-LLM's `output_log_probs` (asked with `return_log_probs`).
    logprobs: bool = False
    # An embedding model, for `/v1/embeddings` only.
    embeddings: Embeddings | None = None


class OutboundPolicy(StrEnum):
    """What happens to sensitive data in a request to an external model."""

    MASK = "mask"  # each finding replaced by a typed placeholder ([EMAIL_1])
    BLOCK = "block"  # the request is refused (400) naming the categories found
    OFF = "off"  # sent as it is


Policy = Annotated[OutboundPolicy, BeforeValidator(_unquoted_off)]


class OutboundConfig(Strict):
    """Outbound sanitization (docs/outbound.md): what counts as an internal host."""

    # Host names under these domain suffixes are internal (`corp.example.com` finds
    # `db1.corp.example.com`); masked or blocked like secrets and personal data.
    internal_domains: list[str] = []


class RoutingPolicy(StrEnum):
    """How a request's replica is chosen (gateway/upstream/affinity.py, docs/routing.md)."""

    LEAST_LOAD = "least_load"  # the replica with the fewest requests in flight
    # The replica whose prefix cache most likely holds the prompt's start: the owner of
    # its session or leading blocks on a consistent-hash ring, within a load bound.
    CACHE_AWARE = "cache_aware"


class Routing(Strict):
    """Replica choice of one model."""

    policy: RoutingPolicy = RoutingPolicy.LEAST_LOAD
    # Tokens in one KV-cache block of the replicas (vLLM's default: 16); the gateway
    # counts 4 bytes a token, as its token estimates do.
    block_tokens: PositiveInt = 16
    # Leading full blocks that place a prompt with no session key: 16 blocks are 256
    # tokens, the prefix OpenAI's prompt caching routes on. Longer shares more replicas
    # between prompts that differ late; shorter sends more prompts to one owner.
    prefix_blocks: PositiveInt = 16
    # Bounded loads: a replica takes a request while its load stays within this factor
    # of the mean (rounded up); over it, the request goes on to the next on the ring.
    load_factor: Annotated[float, Field(gt=1.0, le=10.0)] = 1.25
    # Points per replica on the ring: more spread prefixes more evenly.
    ring_points: Annotated[int, Field(ge=1, le=1024)] = 100
    # A request header naming the client's session; before `prompt_cache_key`, `user`
    # and the Responses API's conversation.
    session_header: str | None = "x-session-id"


class ModelConfig(Strict):
    backend: BackendKind
    # The model's name at the backend; defaults to the gateway's name for it.
    upstream_model: str | None = None
    # Other names clients may send for it (the default model names of coding tools, so
    # that they reach a local model); answers name the model itself. `*` and `?` are
    # wildcards (`claude-*`), anything else is literal (docs/configuration.md, "Aliases").
    aliases: list[str] = []
    # Empty only for a model placed by the cluster file (`cluster_file`) or found in DNS.
    replicas: list[Replica] = Field(default_factory=list)
    # Replicas from DNS instead, kept up to date (gateway/upstream/discovery.py).
    discovery: Discovery | None = None

    @model_validator(mode="after")
    def _one_source_of_replicas(self) -> ModelConfig:
        if self.replicas and self.discovery is not None:
            raise ValueError("replicas and discovery exclude each other: choose one")
        return self

    @model_validator(mode="after")
    def _interface_of_a_triton_http_model(self) -> ModelConfig:
        interface = self.triton_interface
        if interface is TritonInterface.GENERIC:
            return self
        if self.backend is not BackendKind.TRITON_HTTP:
            raise ValueError(f"triton_interface {interface.value} is spoken over triton_http only")
        if interface is TritonInterface.VLLM and self.capabilities.logprobs:
            # vLLM's backend returns them as JSON of its own, which is not read yet.
            raise ValueError("capabilities.logprobs is not served with triton_interface vllm")
        return self

    # A built-in template name (see gateway/inference/prompt.py), a Jinja template, or
    # the path of the model's own tokenizer_config.json (from this file's directory).
    prompt_template: str = "chatml"
    # For a Triton LLM (`triton_http`): the inputs its Triton backend takes.
    triton_interface: TritonInterface = TritonInterface.GENERIC
    max_tokens_default: PositiveInt = 256
    max_tokens_limit: PositiveInt = 4096
    # A request asking for more: `clamp` serves it with the limit (an answer that reaches
    # it ends as cut at max_tokens); `refuse` answers 400 naming the field.
    max_tokens_policy: Literal["clamp", "refuse"] = "clamp"
    # Tokens of prompt and completion together the model takes; a longer request is
    # refused up front (context_length_exceeded), before it is charged or queued.
    context_length: PositiveInt | None = None
    capabilities: Capabilities = Capabilities()
    timeouts: Timeouts = Timeouts()
    fallback: list[str] = []
    # When to move to the fallback chain.
    fallback_on: list[FallbackReason] = [
        FallbackReason.TTFT_TIMEOUT,
        FallbackReason.PREDICTED_WAIT,
    ]
    queue: QueueLimits = QueueLimits()
    health: HealthCheck = HealthCheck()
    # Attempts on other replicas when a replica cannot be reached before any output.
    max_attempts: PositiveInt = 3
    retry: RetryPolicy = RetryPolicy()
    outlier: OutlierPolicy = OutlierPolicy()
    routing: Routing = Routing()
    # Bearer key for an `openai` upstream; must be an environment reference `${VAR}`.
    api_key: SecretStr | None = None
    # The model runs outside the cluster (a hosted API): requests to it are sanitized.
    external: bool = False
    # Its policy for sensitive data, unless the tenant's `outbound` says otherwise.
    outbound: Policy = OutboundPolicy.MASK


class AdmissionConfig(Strict):
    # Priority classes, highest first; tenants name one, requests may ask for a lower one.
    # The Batch APIs' lines run in a class of their own below all of these, `batch-api`.
    classes: Annotated[list[str], Field(min_length=1)] = ["online", "batch"]

    @field_validator("classes")
    @classmethod
    def _not_the_batch_class(cls, classes: list[str]) -> list[str]:
        if "batch-api" in classes:
            raise ValueError("`batch-api` is the Batch APIs' own class, below all of these")
        return classes


class IdempotencyConfig(Strict):
    # How long a stored response answers repeats of its Idempotency-Key.
    ttl_s: PositiveInt = 86400


class ResponsesConfig(Strict):
    """The Responses API's stored responses (`store: true`, `previous_response_id`)."""

    # How long a stored response (with its whole conversation) stays in Redis.
    ttl_s: PositiveInt = 86400


NonNegativeFloat = Annotated[Float, Field(ge=0)]

# Prices are kept in pico-units of the currency a token (a price per million tokens
# times a million): integers, so that what a request costs adds up exactly.
_PICO_PER_UNIT_PER_MILLION = 1_000_000


class Price(Strict):
    """One model's price, in the table's currency a million tokens."""

    input_per_million: NonNegativeFloat
    # Prompt tokens the replica's prefix cache held; the input price when not given.
    cached_input_per_million: NonNegativeFloat | None = None
    output_per_million: NonNegativeFloat

    def cost_micros(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> int:
        """What a request that used these tokens costs, in micro-units of the currency,
        rounded up (a request is never charged less than it used)."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        cached_price = self.cached_input_per_million
        if cached_price is None:
            cached_price = self.input_per_million
        pico = (
            (prompt_tokens - cached) * _pico(self.input_per_million)
            + cached * _pico(cached_price)
            + completion_tokens * _pico(self.output_per_million)
        )
        return -(-pico // 1_000_000)


def _pico(per_million: float) -> int:
    """A price a million tokens as pico-units a token (six decimals of the price kept)."""
    return round(per_million * _PICO_PER_UNIT_PER_MILLION)


class Prices(Strict):
    """`prices:`: what each model costs (the same shape as `gateway eval`'s prices file,
    which may point here). A model without a price costs nothing."""

    # An ISO 4217 code or any name; every price and budget is in it.
    currency: Annotated[str, Field(min_length=1, max_length=16)] = "USD"
    models: dict[str, Price] = {}
    # What a Batch API line pays of the price (both vendors sell batches at half).
    batch_discount: Annotated[Float, Field(ge=0, le=1)] = 0.5


class S3Store(Strict):
    """An S3-compatible bucket for batch files (AWS S3, MinIO, Ceph...), through aiobotocore
    (the `s3` extra). Credentials come from the standard AWS environment
    (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, a role), never from this file."""

    bucket: Annotated[str, Field(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]+$")]
    # The service's URL; None: AWS's for `region`.
    endpoint_url: Annotated[str, Field(pattern=r"^https?://[^\s/?#]+/?$")] | None = None
    region: str = "us-east-1"
    # Objects are named `{prefix}{tenant}/{file id}`.
    prefix: Annotated[str, Field(max_length=256)] = "gateway-batches/"

    @model_validator(mode="after")
    def _library_installed(self) -> S3Store:
        import importlib.util

        if importlib.util.find_spec("aiobotocore") is None:
            raise ValueError(
                "an S3 bucket needs aiobotocore: install the `s3` extra "
                "(pip install 'inference-gateway[s3]')"
            )
        return self


class BatchesConfig(Strict):
    """The Batch APIs (`/v1/files`, `/v1/batches`, `/v1/messages/batches`): their records
    in a database, their files in an object store, their lines run on idle capacity by
    every gateway (docs/batches.md)."""

    # Where files, batches and lines are recorded; None: the ledger's database.
    database_url: str | None = None
    # The gateway's URL as clients reach it (`https://llm.example.com`): Anthropic's
    # `results_url` is made of it. None: a path (`/v1/messages/batches/{id}/results`),
    # which the SDK joins to its own base URL; never the request's Host header, which a
    # client chooses (and the SDK would send its key there).
    public_url: Annotated[str, Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")] | None = None
    # Where file bytes go: a directory (relative to where the gateway runs), or a bucket.
    files_dir: str = "gateway-batch-files"
    s3: S3Store | None = None
    # How long a gateway holds a line before another may take it (it renews it while it
    # runs it): a gateway that dies leaves its lines for this long.
    lease_s: Annotated[Float, Field(ge=1, le=3600)] = 60.0
    # How often a gateway looks for idle slots to fill, and for batches to finish.
    poll_interval_s: Annotated[Float, Field(ge=0.01, le=10)] = 0.1
    housekeeping_interval_s: Annotated[Float, Field(ge=0.05, le=60)] = 1.0
    # Lines one gateway runs at once, at most.
    max_lines_per_gateway: Annotated[Int, Field(ge=1, le=100_000)] = 256
    # Slots of each model that batch lines leave free, so that an online request that
    # arrives finds one at once instead of waiting up to one line's service time (0:
    # lines fill every free slot; docs/benchmarks.md, "Batches", measures the trade).
    reserve_slots: Annotated[Int, Field(ge=0, le=10_000)] = 0
    # A whole batch's window, `24h` only (as OpenAI's); in seconds for tests and demos.
    window_s: Annotated[Float, Field(ge=1, le=86_400)] = 86_400.0
    # Batches a tenant may have in progress at once (a create past it is a 429).
    max_batches_per_tenant: Annotated[Int, Field(ge=1, le=100_000)] = 100
    # What a tenant's files (uploads and outputs) may hold at once; an upload past it
    # is a 429. Files past their expiry are deleted by the gateways' housekeeping.
    max_file_bytes_per_tenant: Annotated[Int, Field(ge=1)] = 10 * 1024**3
    # An Anthropic batch's create body, at most: it is parsed whole (a pathological body
    # costs 30 times its size in memory), one at a time per process. Anthropic's own
    # limit, 256 MB, is the most it may be set to.
    max_message_batch_bytes: Annotated[Int, Field(ge=1024, le=256 * 1024**2)] = 32 * 1024**2


class TracingConfig(Strict):
    """OpenTelemetry traces (docs/observability.md, "Traces"). Each key left out is taken
    from the standard `OTEL_*` environment, as every OpenTelemetry program takes it; with
    neither, tracing is off (and costs nothing)."""

    # On or off whatever the environment says; None: on when `endpoint` is set here or
    # the environment names an OTLP endpoint.
    enabled: bool | None = None
    # The collector: `http://host:4318/v1/traces` (HTTP), `http://host:4317` (gRPC).
    endpoint: Annotated[str, Field(pattern=r"^https?://[^\s/?#]+(/\S*)?$")] | None = None
    protocol: Literal["http/protobuf", "grpc"] | None = None
    sampler: (
        Literal[
            "always_on",
            "always_off",
            "traceidratio",
            "parentbased_always_on",
            "parentbased_always_off",
            "parentbased_traceidratio",
        ]
        | None
    ) = None
    # The ratio of the `*traceidratio` samplers.
    sampler_arg: Annotated[Float, Field(ge=0, le=1)] | None = None
    # Requests a second (per worker) traced because their client's `traceparent` said
    # so, past the ratio: a client cannot make the gateway trace all it sends.
    client_sampled_per_second: Annotated[Float, Field(ge=0)] | None = None
    service_name: str | None = None
    resource_attributes: dict[str, str] | None = None
    # Sent with each export (a vendor's API key: write it as `${VAR}`).
    headers: dict[str, str] | None = None
    # Finished spans waiting for export; past it, spans are dropped (and counted).
    max_queue_size: Annotated[Int, Field(ge=1, le=1_000_000)] | None = None
    max_export_batch_size: Annotated[Int, Field(ge=1, le=100_000)] | None = None
    schedule_delay_s: Annotated[Float, Field(gt=0, le=3600)] | None = None
    export_timeout_s: Annotated[Float, Field(gt=0, le=600)] | None = None


# An upstream MCP server's name: its tools reach clients as `{server}__{tool}`, so it
# holds no underscore (the separator stays unambiguous) and is short.
McpServerName = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9-]{0,39}$")]
# An environment variable's name (an upstream's secret is read from it at start).
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
_HEADER_NAME = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$"


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{path[:60]!r} is not an absolute path")
    return path


AbsolutePath = Annotated[str, AfterValidator(_absolute)]


class McpSandbox(Strict):
    """The bubblewrap sandbox a stdio server runs in (gateway/mcp/stdio_sandbox.py):
    nothing of the host but the system's programs and these paths."""

    # Reach the network (its own namespace without: no interface but its own loopback).
    network: bool = False
    # Host paths it may read (its program, when that is not under /usr), and write.
    read_only: list[AbsolutePath] = []
    writable: list[AbsolutePath] = []
    # Each process's address space (None: not bounded; a JavaScript runtime reserves far
    # more than it uses), its processes and open files.
    address_space_bytes: Annotated[Int, Field(ge=64 * 1024**2)] | None = None
    # Processes and threads; when the gateway runs as root, every stdio server runs as
    # uid 65534 and the kernel counts theirs together.
    processes: Annotated[Int, Field(ge=1, le=65536)] = 1024
    open_files: Annotated[Int, Field(ge=16, le=65536)] = 1024


class McpServer(Strict):
    """One MCP server behind the gateway: remote (`url`, Streamable HTTP) or local
    (`command`, over stdio, in a sandbox). Its credentials are read from the environment
    (`bearer_token_env`, `env_headers`, `env_from`) when the gateway starts: never in
    this file, never on a developer's machine."""

    url: Annotated[str, Field(pattern=r"^https?://[^\s/?#]+(/\S*)?$")] | None = None
    headers: dict[Annotated[str, Field(pattern=_HEADER_NAME)], str] = {}
    env_headers: dict[Annotated[str, Field(pattern=_HEADER_NAME)], EnvName] = {}
    bearer_token_env: EnvName | None = None
    command: Annotated[list[str], Field(min_length=1)] | None = None
    cwd: str | None = None
    env: dict[EnvName, str] = {}
    env_from: dict[EnvName, EnvName] = {}
    sandbox: McpSandbox = McpSandbox()
    # Outside the cluster: calls' arguments pass the outbound scan (`outbound`), and
    # with `scan_results` its results too, before they reach the client.
    external: bool = False
    outbound: Policy = OutboundPolicy.MASK
    scan_results: bool = False
    timeout_s: Annotated[Float, Field(gt=0, le=3600)] = 60.0
    # A larger result is an error to the client; its bytes past the cap are never kept.
    max_result_bytes: Annotated[Int, Field(ge=1024, le=256 * 1024**2)] = 1024**2
    # A connection (a stdio process) unused this long is closed.
    idle_timeout_s: Annotated[Float, Field(gt=0, le=86_400)] = 300.0
    start_timeout_s: Annotated[Float, Field(gt=0, le=600)] = 30.0

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.url is None) == (self.command is None):
            raise ValueError(
                "an MCP server has either `url` (Streamable HTTP) or `command` (stdio)"
            )
        remote_only = self.headers or self.env_headers or self.bearer_token_env
        if self.command is not None and remote_only:
            raise ValueError("headers are for a server with `url`; a stdio server takes `env`")
        if self.url is not None and (self.env or self.env_from or self.cwd):
            raise ValueError("`env`, `env_from` and `cwd` are for a stdio server (`command`)")
        return self


class ToolChangePolicy(StrEnum):
    """What the gateway does with a tool whose description or schema changed since it
    was first listed, or whose description reads as instructions to the model."""

    HIDE = "hide"  # not listed, not callable, until an operator accepts it
    FLAG = "flag"  # listed, logged and counted


class McpConfig(Strict):
    """The MCP gateway (docs/mcp.md): `/mcp` on the API port, these servers behind it."""

    servers: dict[McpServerName, McpServer] = {}
    # `Origin` values a request may carry (a browser page); one without is always let in.
    allowed_origins: list[str] = []
    # A client session (the 2025-11-25 handshake) idle this long is forgotten.
    session_idle_s: Annotated[Float, Field(ge=60, le=30 * 86_400)] = 86_400.0
    # The last events of a tenant kept for a client to resume its stream from.
    events_kept: Annotated[Int, Field(ge=1, le=100_000)] = 256
    # Live sessions (the handshake era's) one tenant may hold, across every gateway.
    max_sessions_per_tenant: Annotated[Int, Field(ge=1, le=1_000_000)] = 1000
    on_tool_change: ToolChangePolicy = ToolChangePolicy.HIDE
    # What one server may list: more tools are left out (and logged).
    max_tools_per_server: Annotated[Int, Field(ge=1, le=10_000)] = 512
    max_description_chars: Annotated[Int, Field(ge=64, le=1_000_000)] = 8192


class GatewayConfig(Strict):
    """`gateway.yaml`."""

    server: ServerConfig = ServerConfig()
    admission: AdmissionConfig = AdmissionConfig()
    idempotency: IdempotencyConfig = IdempotencyConfig()
    responses: ResponsesConfig = ResponsesConfig()
    outbound: OutboundConfig = OutboundConfig()
    redis: RedisConfig = RedisConfig()
    ratelimit: RateLimitConfig = RateLimitConfig()
    # Path of the tenants file, relative to gateway.yaml.
    tenants_file: str = "tenants.yaml"
    # A cluster file (relative to gateway.yaml): models deployed there are served where
    # the scheduler places them, and `replicas` may be left out for them.
    cluster_file: str | None = None
    # Seconds between probes of the cluster's nodes, and failed probes in a row after
    # which a node is down and its replicas are placed elsewhere.
    node_probe_interval_s: PositiveFloat = 2.0
    node_down_after: PositiveInt = 3
    placement: PlacementConfig = PlacementConfig()
    prices: Prices = Prices()
    # Where a usage record of every request goes (issue 27's ledger); None: nowhere.
    ledger: LedgerConfig | None = None
    # The Batch APIs; None: not served.
    batches: BatchesConfig | None = None
    tracing: TracingConfig = TracingConfig()
    # The MCP gateway's servers (issue 45); none: `/mcp` serves no tools.
    mcp: McpConfig = McpConfig()
    models: Annotated[dict[str, ModelConfig], Field(min_length=1)]

    @model_validator(mode="after")
    def _batches_have_a_database(self) -> GatewayConfig:
        if self.batches is not None and self.batches.database_url is None and self.ledger is None:
            raise ValueError(
                "`batches` needs a database: set `batches.database_url`, or a `ledger` "
                "(whose database it then shares)"
            )
        return self


class RateLimits(Strict):
    """Request and token buckets; absent means unlimited."""

    requests_per_minute: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None
    # Bucket sizes; default to one minute's worth of the rate.
    burst_requests: PositiveInt | None = None
    burst_tokens: PositiveInt | None = None


class Limits(RateLimits):
    """Per-tenant limits; absent means unlimited."""

    max_concurrent: PositiveInt | None = None
    # Extra buckets for one model, on top of the tenant's own.
    models: dict[str, RateLimits] = {}


BudgetPeriod = Literal["day", "month", "total"]


class Budget(Strict):
    """A cap on spend, in the price table's currency, for a period: a UTC day, a UTC
    month, or for ever (`total`); on every model, or on one (`model`). Past `soft` (a
    share of `amount`) an alert fires; at `amount` requests are refused (HTTP 429,
    `insufficient_quota`). Without a `period`, a month."""

    # At least one micro-unit (what spend is counted in), at most a trillion.
    amount: Annotated[Float, Field(ge=0.000001, le=1e12)]
    period: BudgetPeriod = "month"
    model: str | None = None
    soft: Annotated[float, Field(gt=0, le=1)] = 0.8

    @property
    def amount_micros(self) -> int:
        """`amount` in integer micro-units of the currency."""
        return round(self.amount * 1_000_000)


class TenantBatchLimits(Strict):
    """What one tenant's batches may take of the idle capacity at once: lines running
    across every gateway (counted exactly in the batch database). Its lines also take
    its rate limits and budgets, as any request does."""

    max_concurrent_lines: PositiveInt | None = 64


class StoredResponsesQuota(Strict):
    """What a tenant's stored Responses API answers (`store: true`) may hold in Redis at
    once, counted atomically in Redis across every gateway (`lua/responses_store.lua`);
    a response that expires or is deleted gives its room back. Past either cap a request
    that asks to store is refused (429, `stored_responses_quota_exceeded`)."""

    # The stored bytes (each response's record, its id and a fixed 256 for Redis's own
    # bookkeeping), default 64 MiB.
    max_bytes: PositiveInt = 64 * 1024 * 1024
    # The stored responses.
    max_count: PositiveInt = 10_000


class TenantOutbound(Strict):
    """A tenant's own outbound policy: for every external model, or per model."""

    policy: Policy | None = None
    models: dict[str, Policy] = {}


# An MCP tools pattern: `server/tool`, `server/*`, `server` or `*`, fnmatch wildcards
# (`*`, `?`, `[...]`) anywhere. A server part holds what a server's name may (letters,
# digits, `-`) and wildcards; a tool part anything but `/`, spaces and control
# characters (MCP's tool names are 1 to 128 characters, letters, digits, `_-.` as advised).
MCP_TOOLS_PATTERN = re.compile(r"[A-Za-z0-9*?\[\]!-]+(?:/[^/\s\x00-\x1f\x7f]+)?")
MCP_PATTERN_CHARS = 200


def mcp_tools_pattern(pattern: str) -> str:
    """`pattern` if it is an MCP tools pattern; else a ValueError that says what one is."""
    if not 0 < len(pattern) <= MCP_PATTERN_CHARS or MCP_TOOLS_PATTERN.fullmatch(pattern) is None:
        hint = (
            " (the server and tool apart: `notes/echo`, not `notes__echo`)"
            if "__" in pattern
            else ""
        )
        raise ValueError(
            f"{pattern[:60]!r} is not an MCP tools pattern: `server/tool`, `server/*`, "
            f"`server` or `*` (`*`, `?` and `[...]` match as in file names){hint}"
        )
    return pattern


def _one_tool(name: str) -> str:
    if "/" not in name or any(c in name for c in "*?[") or "__" in name.split("/")[0]:
        raise ValueError(f"{name[:60]!r}: a tool's rate names one tool, `server/tool`")
    return mcp_tools_pattern(name)


class ToolRate(Strict):
    """A rate on one MCP tool's calls (each call is one request): on top of its
    tenant's and its key's."""

    requests_per_minute: PositiveInt
    burst_requests: PositiveInt | None = None
    # A tool call has no tokens: these stay unset (the limiter's buckets read them).
    tokens_per_minute: None = None
    burst_tokens: None = None


class TenantMcp(Strict):
    """What a tenant may reach of the MCP servers behind the gateway: `tools` patterns
    `server/tool` (`*` anywhere: `github/*`, `*`), and a rate per tool on top of its own."""

    tools: list[Annotated[str, AfterValidator(mcp_tools_pattern)]] = ["*"]
    limits: dict[Annotated[str, AfterValidator(_one_tool)], ToolRate] = {}


class Tenant(Strict):
    # Each entry is `sha256:<64 hex>` or a `${ENV_VAR}` holding the plain key.
    api_keys: Annotated[list[str], Field(min_length=1)]
    # One of admission.classes in gateway.yaml.
    priority: str = "online"
    share: PositiveFloat = 1.0
    # Model names this tenant may call; ["*"] allows every configured model.
    models: list[str] = ["*"]
    limits: Limits = Limits()
    # Evaluate limits and report them, but do not enforce.
    shadow: bool = False
    # May call the admin endpoints (config reload).
    admin: bool = False
    # Replaces the external models' own `outbound` policies for this tenant.
    outbound: TenantOutbound = TenantOutbound()
    # Names (or `*`/`?` patterns) this tenant's requests may send, to the model serving
    # them; they win over the models' own `aliases` for this tenant.
    aliases: dict[str, str] = {}
    # Caps on what the tenant spends (each is enforced; the tightest refuses first).
    budgets: list[Budget] = []
    # What its stored responses may hold in Redis at once (bytes, count).
    stored_responses: StoredResponsesQuota = StoredResponsesQuota()
    # Its Batch API work: lines running at once across every gateway.
    batch: TenantBatchLimits = TenantBatchLimits()
    # The MCP servers' tools it may see and call, and their rates.
    mcp: TenantMcp = TenantMcp()


class TenantsConfig(Strict):
    """`tenants.yaml`."""

    tenants: Annotated[dict[str, Tenant], Field(min_length=1)]


class Config(Strict):
    """Both files, validated and cross-checked."""

    gateway: GatewayConfig
    tenants: TenantsConfig
    # Tenant name by sha256 hex digest of each API key.
    tenant_by_key_hash: dict[str, str]
    gateway_path: str
    tenants_path: str


ConfigKind = Literal["gateway", "tenants"]
