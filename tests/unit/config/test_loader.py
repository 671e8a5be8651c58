"""Loading gateway.yaml / tenants.yaml: typed values, env substitution, `file:line:` errors."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import pytest

from gateway.config import (
    BackendKind,
    ConfigError,
    check_config,
    digest,
    hash_key,
    key_index,
    load_config,
    load_tenants,
)
from tests.unit.config.sample_keys import ACME_KEY, BETA_KEY

GATEWAY = """\
models:
  llm-large:
    backend: triton_http
    replicas:
      - url: http://127.0.0.1:8000
  llm-small:
    backend: openai
    replicas:
      - url: http://127.0.0.1:9000
"""

TENANTS = f"""\
tenants:
  acme:
    api_keys:
      - {hash_key(ACME_KEY)}
"""

PLAIN_KEY_MESSAGE = (
    "plain API key in file; store the output of `gateway hash-key` "
    "or reference an environment variable"
)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Relative paths keep expected messages short; a stray override must not leak in.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)


def write(name: str, text: str) -> str:
    path = Path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return name


def problems(gateway: str = GATEWAY, tenants: str = TENANTS) -> list[str]:
    write("tenants.yaml", tenants)
    return check_config(write("gateway.yaml", gateway))


# --- valid configs -----------------------------------------------------------


def test_valid_config_loads_typed_values() -> None:
    write(
        "gateway.yaml",
        """\
        server:
          port: 9000
        models:
          llm-large:
            backend: triton_grpc
            replicas:
              - url: 127.0.0.1:8001
            timeouts:
              first_token_s: 12.5
            fallback: [llm-small]
          llm-small:
            backend: openai
            replicas: [{url: "http://127.0.0.1:9000"}]
        """,
    )
    write(
        "tenants.yaml",
        f"""\
        tenants:
          acme:
            api_keys: ["{hash_key(ACME_KEY)}"]
            priority: batch
            models: [llm-small]
            limits:
              requests_per_minute: 600
        """,
    )

    config = load_config("gateway.yaml")

    large = config.gateway.models["llm-large"]
    assert config.gateway.server.port == 9000
    assert large.backend is BackendKind.TRITON_GRPC
    assert large.timeouts.first_token_s == 12.5
    assert large.fallback == ["llm-small"]
    acme = config.tenants.tenants["acme"]
    assert acme.priority == "batch"
    assert acme.limits.requests_per_minute == 600
    assert acme.limits.tokens_per_minute is None
    # The per-request lookup: digest of the presented key finds the tenant.
    assert config.tenant_by_key_hash == {digest(ACME_KEY): "acme"}
    assert (config.gateway_path, config.tenants_path) == ("gateway.yaml", "tenants.yaml")
    assert check_config("gateway.yaml") == []


def test_tenants_file_is_relative_to_gateway_yaml_and_errors_show_that_path() -> None:
    write("conf/gateway.yaml", GATEWAY + "tenants_file: t/tenants.yaml\n")
    write("conf/t/tenants.yaml", TENANTS + "    shadow: maybe\n")

    assert check_config("conf/gateway.yaml") == [
        "conf/t/tenants.yaml:5: tenants.acme.shadow: Input should be a valid boolean, "
        "unable to interpret input"
    ]


def test_missing_tenants_file_is_reported() -> None:
    write("gateway.yaml", GATEWAY)

    assert check_config("gateway.yaml") == [
        "tenants.yaml: cannot read file: No such file or directory"
    ]


# --- environment variables ---------------------------------------------------


def test_env_substitution_with_and_without_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_PORT", "9090")
    monkeypatch.setenv("GW_EMPTY", "")
    monkeypatch.delenv("GW_HOST", raising=False)
    monkeypatch.setenv("GW_REPLICA", "10.0.0.7:8000")
    gateway = """\
    server:
      port: ${GW_PORT}
      host: ${GW_HOST:-0.0.0.0}
    redis:
      key_prefix: "${GW_EMPTY:-gw}-$${literal}"
    models:
      m:
        backend: triton_http
        upstream_model: "${GW_HOST:-}"
        replicas:
          - url: http://${GW_REPLICA}
    """
    write("tenants.yaml", TENANTS)

    config = load_config(write("gateway.yaml", gateway))

    assert config.gateway.server.port == 9090
    assert config.gateway.server.host == "0.0.0.0"
    # As in the shell, `:-` also replaces an empty value; `$${` is a literal `${`.
    assert config.gateway.redis.key_prefix == "gw-${literal}"
    assert config.gateway.models["m"].upstream_model == ""
    assert config.gateway.models["m"].replicas[0].url == "http://10.0.0.7:8000"


def test_unset_env_var_is_an_error_at_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GW_REPLICA", raising=False)
    gateway = GATEWAY.replace("http://127.0.0.1:9000", "http://${GW_REPLICA}")

    assert problems(gateway) == ["gateway.yaml:9: environment variable GW_REPLICA is not set"]


def test_malformed_env_reference_is_an_error() -> None:
    gateway = GATEWAY.replace("http://127.0.0.1:9000", "http://${GW_REPLICA")

    assert problems(gateway) == [
        "gateway.yaml:9: invalid environment reference; write ${NAME} or ${NAME:-default}"
    ]


def test_api_key_from_env_is_hashed_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BETA_KEY", BETA_KEY)
    write("gateway.yaml", GATEWAY)
    write("tenants.yaml", TENANTS + "  beta:\n    api_keys:\n      - ${BETA_KEY}\n")

    config = load_config("gateway.yaml")

    assert config.tenant_by_key_hash[digest(BETA_KEY)] == "beta"
    assert config.tenants.tenants["beta"].api_keys == [hash_key(BETA_KEY)]
    assert BETA_KEY not in repr(config)


def test_redis_url_env_overrides_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_REDIS_URL", "embedded://")
    write("tenants.yaml", TENANTS)
    write("gateway.yaml", "redis:\n  url: redis://file:6379/0\n" + GATEWAY)

    assert load_config("gateway.yaml").gateway.redis.url == "embedded://"

    monkeypatch.delenv("GATEWAY_REDIS_URL")
    assert load_config("gateway.yaml").gateway.redis.url == "redis://file:6379/0"


# --- schema errors -----------------------------------------------------------


def test_unknown_key_points_at_the_key() -> None:
    gateway = GATEWAY.replace("    replicas:\n", "    replicaz: 2\n    replicas:\n", 1)

    assert problems(gateway) == ["gateway.yaml:4: models.llm-large: unknown key 'replicaz'"]


def test_wrong_type_points_at_the_value() -> None:
    gateway = "server:\n  port:\n    eighty\n" + GATEWAY

    assert problems(gateway) == ["gateway.yaml:3: server.port: Input should be a valid integer"]


def test_ops_listener_on_the_api_port_is_refused() -> None:
    on_default_port = "server:\n  ops:\n    port: 8080\n" + GATEWAY
    on_chosen_port = "server:\n  port: 9000\n  ops:\n    port: 9000\n" + GATEWAY

    assert problems(on_default_port) == [
        "gateway.yaml:3: server.ops.port: 8080 is the API port (server.port)"
    ]
    assert problems(on_chosen_port) == [
        "gateway.yaml:4: server.ops.port: 9000 is the API port (server.port)"
    ]
    assert problems("server:\n  ops:\n    port: 8081\n" + GATEWAY) == []


def test_the_removed_connection_cap_is_named_at_its_line_with_what_replaced_it() -> None:
    gateway = "server:\n  port: 8080\n  max_unauthenticated_connections_per_address: 128\n"

    assert problems(gateway + GATEWAY) == [
        "gateway.yaml:3: server.max_unauthenticated_connections_per_address: this key is gone: "
        "new connections no longer count, only slow ones do (max_slow_connections_per_address, "
        "slow_head_grace_s; behind a load balancer, trusted_proxies)"
    ]


def test_the_proxy_protocol_needs_trusted_proxies() -> None:
    alone = "server:\n  port: 8080\n  proxy_protocol: true\n"
    trusted = "server:\n  trusted_proxies: [10.0.0.0/8, 'fd00::1']\n  proxy_protocol: true\n"
    not_a_network = "server:\n  trusted_proxies: [10.0.0.300]\n"

    assert problems(alone + GATEWAY) == [
        "gateway.yaml:3: server.proxy_protocol: on, but trusted_proxies names no proxy to "
        "expect the header from"
    ]
    assert problems(trusted + GATEWAY) == []
    assert problems(not_a_network + GATEWAY)[0].startswith("gateway.yaml:2: server.trusted_proxies")


def test_missing_required_key_points_at_the_parent() -> None:
    gateway = GATEWAY.replace("    backend: openai\n", "")

    assert problems(gateway) == ["gateway.yaml:6: models.llm-small: missing required key 'backend'"]


def test_negative_limit_and_non_positive_timeout() -> None:
    gateway = GATEWAY + "    timeouts:\n      first_token_s: 0\n"
    tenants = TENANTS + "    limits:\n      requests_per_minute: -5\n"

    assert problems(gateway, tenants) == [
        "gateway.yaml:11: models.llm-small.timeouts.first_token_s: Input should be greater than 0",
        "tenants.yaml:6: tenants.acme.limits.requests_per_minute: Input should be greater than 0",
    ]


def test_empty_and_non_mapping_files() -> None:
    assert problems("") == ["gateway.yaml:1: file is empty"]
    assert problems("- models\n") == ["gateway.yaml:1: expected a mapping"]


# --- cross checks ------------------------------------------------------------


def test_undefined_model_in_fallback_chain() -> None:
    gateway = GATEWAY + "    fallback:\n      - llm-large\n      - llm-tiny\n"

    assert problems(gateway) == [
        "gateway.yaml:12: models.llm-small.fallback[1]: model 'llm-tiny' is not defined"
    ]


def test_fallback_to_itself_and_loops() -> None:
    gateway = GATEWAY.replace("    replicas:\n", "    fallback: [llm-small]\n    replicas:\n", 1)
    gateway += "    fallback:\n      - llm-small\n      - llm-large\n"

    assert problems(gateway) == [
        "gateway.yaml:12: models.llm-small.fallback[0]: model 'llm-small' falls back to itself",
        "gateway.yaml:13: models.llm-small.fallback[1]: "
        "fallback chain loops: llm-large -> llm-small -> llm-large",
    ]


def test_undefined_model_in_tenant_models() -> None:
    tenants = TENANTS + "    models:\n      - llm-small\n      - llm-huge\n"

    assert problems(tenants=tenants) == [
        "tenants.yaml:7: tenants.acme.models[1]: model 'llm-huge' is not defined"
    ]


def test_outbound_policies_are_checked() -> None:
    tenants = TENANTS + "    outbound:\n      policy: scrub\n      models:\n        llm-huge: off\n"
    gateway = GATEWAY.replace(
        "    backend: openai\n", "    backend: openai\n    outbound: redact\n"
    )

    assert problems(tenants=tenants) == [
        "tenants.yaml:6: tenants.acme.outbound.policy: Input should be 'mask', 'block' or 'off'",
        "tenants.yaml:8: tenants.acme.outbound.models.llm-huge: outbound policy for model "
        "'llm-huge', which is not defined",
    ]
    assert problems(gateway) == [
        "gateway.yaml:8: models.llm-small.outbound: Input should be 'mask', 'block' or 'off'"
    ]


def test_a_triton_model_with_tools_needs_a_tool_parser() -> None:
    def with_capabilities(backend: str, capabilities: str) -> str:
        return GATEWAY.replace(
            f"    backend: {backend}\n",
            f"    backend: {backend}\n    capabilities: {capabilities}\n",
        )

    assert problems(with_capabilities("triton_http", "{tools: true}")) == [
        "gateway.yaml:4: models.llm-large.capabilities.tools: a Triton model needs a "
        "`tool_parser` to read its calls"
    ]
    assert problems(with_capabilities("triton_http", "{tools: true, tool_parser: mistral}")) == [
        "gateway.yaml:4: models.llm-large.capabilities.tool_parser: Input should be 'hermes' "
        "or 'llama3_json'"
    ]
    assert problems(with_capabilities("openai", "{tools: true, tool_parser: hermes}")) == [
        "gateway.yaml:8: models.llm-small.capabilities.tool_parser: an `openai` backend "
        "returns its calls parsed"
    ]
    assert problems(with_capabilities("triton_http", "{tools: true, tool_parser: hermes}")) == []
    assert problems(with_capabilities("openai", "{tools: true}")) == []


def test_a_fallback_without_a_capability_of_its_model_is_reported() -> None:
    gateway = """\
models:
  big:
    backend: openai
    replicas: [{url: http://a}]
    capabilities: {tools: true, logprobs: true}
    fallback: [small, same]
  small:
    backend: openai
    replicas: [{url: http://b}]
  same:
    backend: openai
    replicas: [{url: http://c}]
    capabilities: {tools: true, logprobs: true}
"""
    assert problems(gateway) == [
        "gateway.yaml:6: models.big.fallback[0]: model 'small' lacks tools, logprobs, which "
        "'big' has: requests that use them would not fall back to it"
    ]


def test_an_embedding_model_falls_back_only_to_vectors_of_its_length() -> None:
    gateway = """\
models:
  embed:
    backend: triton_http
    replicas: [{url: http://a}]
    capabilities: {embeddings: {dimensions: 384}}
    fallback: [embed-copy, embed-wide, chat]
  embed-copy:
    backend: triton_grpc
    replicas: [{url: b:1}]
    capabilities: {embeddings: {dimensions: 384}}
  embed-wide:
    backend: openai
    replicas: [{url: http://c}]
    capabilities: {embeddings: {dimensions: 1024}}
  chat:
    backend: openai
    replicas: [{url: http://d}]
    fallback: [embed-copy]
    capabilities: {tools: true}
  mixed:
    backend: openai
    replicas: [{url: http://e}]
    capabilities: {tools: true, embeddings: {dimensions: 8}}
"""
    assert problems(gateway) == [
        "gateway.yaml:6: models.embed.fallback[1]: model 'embed-wide' gives vectors of 1024 "
        "dimensions, 'embed' of 384: an embedding model may only fall back to one of the "
        "same vectors",
        "gateway.yaml:6: models.embed.fallback[2]: model 'chat' is not an embedding model, "
        "unlike 'embed'",
        "gateway.yaml:18: models.chat.fallback[0]: model 'embed-copy' is an embedding model, "
        "unlike 'chat'",
        "gateway.yaml:23: models.mixed.capabilities.embeddings: an embedding model cannot "
        "have tools",
    ]


def test_an_alias_names_one_model_only() -> None:
    gateway = """\
models:
  local:
    backend: openai
    replicas: [{url: http://a}]
    aliases: [claude-sonnet-5-5, gpt-5-codex, other]
  other:
    backend: openai
    replicas: [{url: http://b}]
    aliases: [gpt-5-codex]
"""
    assert problems(gateway) == [
        "gateway.yaml:5: models.local.aliases[2]: 'other' is the name of a model",
        "gateway.yaml:9: models.other.aliases[0]: 'gpt-5-codex' is already an alias of 'local'",
    ]


def test_duplicate_key_hash_across_and_within_tenants() -> None:
    tenants = TENANTS + (
        f"  beta:\n    api_keys:\n      - {hash_key(BETA_KEY)}\n      - {hash_key(BETA_KEY)}\n"
        f"  gamma:\n    api_keys:\n      - {hash_key(ACME_KEY)}\n"
    )

    assert problems(tenants=tenants) == [
        "tenants.yaml:8: tenants.beta.api_keys[1]: "
        "API key is listed twice for tenant 'beta' (first at line 7)",
        "tenants.yaml:11: tenants.gamma.api_keys[0]: "
        "API key is already used by tenant 'acme' (line 4)",
    ]


def test_same_env_key_in_two_tenants_is_a_duplicate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACME_KEY", ACME_KEY)
    tenants = """\
    tenants:
      a:
        api_keys: ["${ACME_KEY}"]
      b:
        api_keys:
          - ${ACME_KEY}
    """

    assert problems(tenants=tenants) == [
        "tenants.yaml:6: tenants.b.api_keys[0]: API key is already used by tenant 'a' (line 3)"
    ]


def test_unquoted_env_reference_in_flow_list_gets_a_hint() -> None:
    tenants = "tenants:\n  a:\n    api_keys: [${ACME_KEY}]\n"

    assert problems(tenants=tenants) == [
        "tenants.yaml:3: invalid YAML: expected ',' or ']', but got '{' "
        "(while parsing a flow sequence at line 3); "
        'quote "${...}" values inside [ ] or { }'
    ]


@pytest.mark.parametrize(
    "entry",
    [
        "sk-live-SECRET-4242",
        # A default is written in the file, so it is not a secret from the environment.
        "${UNSET_KEY_VAR:-sk-live-SECRET-4242}",
    ],
)
def test_plain_key_in_file_is_refused_without_echoing_it(entry: str) -> None:
    tenants = TENANTS + f"      - {entry}\n"

    found = problems(tenants=tenants)

    assert found == [f"tenants.yaml:5: tenants.acme.api_keys[1]: {PLAIN_KEY_MESSAGE}"]
    assert "SECRET" not in found[0]
    with pytest.raises(ConfigError) as raised:
        load_config("gateway.yaml")
    assert "SECRET" not in str(raised.value)


def test_malformed_key_hash_is_refused() -> None:
    tenants = TENANTS + f"      - {hash_key(BETA_KEY).upper().replace('SHA256', 'sha256')}\n"

    assert problems(tenants=tenants) == [
        "tenants.yaml:5: tenants.acme.api_keys[1]: "
        "malformed key hash; expected 'sha256:' and 64 lowercase hex digits"
    ]


# --- YAML errors ---------------------------------------------------------------


def test_yaml_syntax_error_has_a_line() -> None:
    # A key indented one space short of its siblings.
    gateway = GATEWAY.replace("    backend: openai\n", "    backend: openai\n   oops: 1\n")

    assert problems(gateway) == [
        "gateway.yaml:8: invalid YAML: expected <block end>, but found '<block mapping start>' "
        "(while parsing a block mapping at line 2)"
    ]


def test_duplicate_yaml_key_is_an_error() -> None:
    gateway = GATEWAY + "    backend: triton_http\n"

    assert problems(gateway) == ["gateway.yaml:10: duplicate key 'backend' (first at line 7)"]


# --- reporting everything ------------------------------------------------------


def test_all_problems_in_both_files_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE", raising=False)
    gateway = """\
    server:
      port: 0
      colour: blue
    models:
      m:
        backend: triton_http
        replicas: []
        fallback: [ghost]
    """
    tenants = """\
    tenants:
      acme:
        api_keys: [sk-plain-key, "${NOPE}"]
        priority: urgent
    """

    assert problems(gateway, tenants) == [
        "gateway.yaml:2: server.port: Input should be greater than or equal to 1",
        "gateway.yaml:3: server: unknown key 'colour'",
        "gateway.yaml:7: models.m.replicas: at least one is needed (or `discovery`, or a "
        "cluster_file that places the model)",
        "gateway.yaml:8: models.m.fallback[0]: model 'ghost' is not defined",
        "tenants.yaml:3: environment variable NOPE is not set",
        f"tenants.yaml:3: tenants.acme.api_keys[0]: {PLAIN_KEY_MESSAGE}",
        "tenants.yaml:4: tenants.acme.priority: priority 'urgent' is not a class (online, batch)",
    ]
    with pytest.raises(ConfigError) as raised:
        load_config("gateway.yaml")
    assert [str(p) for p in raised.value.problems] == check_config("gateway.yaml")


# --- tenants file alone ----------------------------------------------------------


def test_check_config_on_a_bare_tenants_file() -> None:
    write("tenants.yaml", TENANTS + "    models: [anything]\n")
    # Without gateway.yaml the model names cannot be checked, but the rest is.
    assert check_config("tenants.yaml") == []

    write("tenants.yaml", TENANTS + "    share: -1\n")
    assert check_config("tenants.yaml") == [
        "tenants.yaml:5: tenants.acme.share: Input should be greater than 0"
    ]


def test_load_tenants_for_reload() -> None:
    write("tenants.yaml", TENANTS + "    models: [llm-small]\n")

    tenants = load_tenants("tenants.yaml", {"llm-small"})

    assert key_index(tenants) == {digest(ACME_KEY): "acme"}
    with pytest.raises(ConfigError) as raised:
        load_tenants("tenants.yaml", {"llm-large"})
    assert [str(p) for p in raised.value.problems] == [
        "tenants.yaml:5: tenants.acme.models[0]: model 'llm-small' is not defined"
    ]


def test_prompt_template_that_does_not_compile_is_an_error_at_its_line() -> None:
    gateway = GATEWAY.replace(
        "    backend: triton_http\n",
        "    backend: triton_http\n    prompt_template: '{% for m in messages %}'\n",
    )
    (problem,) = problems(gateway)
    assert problem.startswith(
        "gateway.yaml:4: models.llm-large.prompt_template: prompt_template does not compile"
    )


def test_prompt_template_names_a_tokenizer_config_beside_the_config(tmp_path: Path) -> None:
    # Named relative to gateway.yaml's directory, as the tenants file is, wherever the
    # server was started from.
    qwen = Path(__file__).parents[2] / "data/tokenizer_configs/qwen2.5-7b-instruct"
    Path("models/qwen").mkdir(parents=True)
    shutil.copy(qwen / "tokenizer_config.json", "models/qwen/tokenizer_config.json")
    gateway = GATEWAY.replace(
        "    backend: triton_http\n",
        "    backend: triton_http\n    prompt_template: models/qwen/tokenizer_config.json\n",
    )
    assert problems(gateway) == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)
    config = load_config(str(tmp_path / "gateway.yaml"))
    named = config.gateway.models["llm-large"].prompt_template
    assert named == str(tmp_path / "models/qwen/tokenizer_config.json")


def test_a_tokenizer_config_that_cannot_be_used_is_an_error_at_its_line() -> None:
    gateway = GATEWAY.replace(
        "    backend: triton_http\n",
        "    backend: triton_http\n    prompt_template: models/none/tokenizer_config.json\n",
    )
    (problem,) = problems(gateway)
    assert problem.startswith("gateway.yaml:4: models.llm-large.prompt_template: cannot read ")
    assert problem.endswith("models/none/tokenizer_config.json: No such file or directory")
    write("models/none/tokenizer_config.json", '{"bos_token": "<s>"}')
    (problem,) = problems(gateway)
    assert "has no chat_template" in problem


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        (
            "    backend: triton_grpc\n    triton_interface: vllm\n",
            "triton_interface vllm is spoken over triton_http only",
        ),
        (
            "    backend: triton_http\n    triton_interface: vllm\n"
            "    capabilities: {logprobs: true}\n",
            "capabilities.logprobs is not served with triton_interface vllm",
        ),
        (
            "    backend: triton_http\n    triton_interface: sglang\n",
            "Input should be 'generic', 'vllm' or 'tensorrtllm'",
        ),
    ],
)
def test_a_triton_interface_the_model_cannot_speak_is_refused(settings: str, why: str) -> None:
    gateway = GATEWAY.replace("    backend: triton_http\n", settings)
    (problem,) = problems(gateway)
    assert problem.startswith("gateway.yaml:") and problem.endswith(why)


def test_upstream_api_key_must_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    literal = GATEWAY.replace(
        "    backend: openai\n", "    backend: openai\n    api_key: sk-upstream-secret\n"
    )
    (problem,) = problems(literal)
    assert problem == (
        "gateway.yaml:8: models.llm-small.api_key: upstream API key in file; "
        "reference an environment variable as ${VAR}"
    )
    assert "sk-upstream-secret" not in problem
    monkeypatch.setenv("UPSTREAM_KEY", "sk-upstream-secret")
    write("gateway.yaml", literal.replace("sk-upstream-secret", "${UPSTREAM_KEY}"))
    config = load_config("gateway.yaml")
    api_key = config.gateway.models["llm-small"].api_key
    assert api_key is not None and api_key.get_secret_value() == "sk-upstream-secret"
    assert "sk-upstream-secret" not in repr(config)


def test_per_model_limits_must_name_a_defined_model() -> None:
    tenants = (
        TENANTS + "    limits:\n      models:\n        llm-huge:\n          tokens_per_minute: 5\n"
    )
    assert problems(tenants=tenants) == [
        "tenants.yaml:7: tenants.acme.limits.models.llm-huge: "
        "limits for model 'llm-huge', which is not defined"
    ]


def test_tenant_priority_must_be_a_configured_class() -> None:
    tenants = TENANTS + "    priority: gold\n"
    assert problems(tenants=tenants) == [
        "tenants.yaml:5: tenants.acme.priority: priority 'gold' is not a class (online, batch)"
    ]


# --- strict numbers --------------------------------------------------------------


def test_booleans_and_strings_are_not_numbers() -> None:
    tenants = TENANTS + (
        "    share: true\n"
        "    limits:\n"
        "      requests_per_minute: true\n"
        '      tokens_per_minute: "12"\n'
        "      max_concurrent: 2.0\n"
    )
    gateway = GATEWAY + "    timeouts: {connect_s: false}\n"

    assert problems(gateway, tenants) == [
        "gateway.yaml:10: models.llm-small.timeouts.connect_s: Input should be a valid number",
        "tenants.yaml:5: tenants.acme.share: Input should be a valid number",
        "tenants.yaml:7: tenants.acme.limits.requests_per_minute: Input should be a valid integer",
        "tenants.yaml:8: tenants.acme.limits.tokens_per_minute: Input should be a valid integer",
        "tenants.yaml:9: tenants.acme.limits.max_concurrent: Input should be a valid integer",
    ]


def test_float_settings_take_integers_and_env_values_may_spell_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GW_RPM", "60")
    monkeypatch.setenv("GW_WORD", "sixty")
    gateway = GATEWAY + "    timeouts: {connect_s: 3, total_s: '${GW_TOTAL:-90.5}'}\n"
    write("tenants.yaml", TENANTS + "    limits:\n      requests_per_minute: ${GW_RPM}\n")

    config = load_config(write("gateway.yaml", gateway))

    timeouts = config.gateway.models["llm-small"].timeouts
    assert (timeouts.connect_s, timeouts.total_s) == (3.0, 90.5)
    assert config.tenants.tenants["acme"].limits.requests_per_minute == 60
    write("tenants.yaml", TENANTS + "    limits:\n      requests_per_minute: ${GW_WORD}\n")
    assert check_config("gateway.yaml") == [
        "tenants.yaml:6: tenants.acme.limits.requests_per_minute: Input should be a valid integer"
    ]


# --- characters YAML refuses --------------------------------------------------------


def test_control_character_is_a_problem_at_its_line_not_a_crash() -> None:
    tenants = TENANTS + "    priority: on\x07line\n"

    assert problems(tenants=tenants) == [
        "tenants.yaml:5: invalid YAML: character #x07 at column 17: "
        "special characters are not allowed"
    ]
    # The reload path (file watcher, admin API) gets a ConfigError, not a ReaderError.
    with pytest.raises(ConfigError):
        load_tenants("tenants.yaml", {"llm-large"})


def test_deeply_nested_yaml_is_a_problem() -> None:
    assert problems("[" * 20000) == ["gateway.yaml: invalid YAML: nested too deeply"]


# --- the cluster file -----------------------------------------------------------------

CLUSTER = """\
nodes:
  - name: node-a
    url: http://127.0.0.1:8000
    gpus: 2
deployments:
  - model: llm-large
"""

# llm-large has no replicas of its own: the cluster places it.
PLACED = """\
cluster_file: cluster.yaml
models:
  llm-large:
    backend: triton_http
  llm-small:
    backend: openai
    replicas:
      - url: http://127.0.0.1:9000
"""


def cluster_problems(cluster: str | None, gateway: str = PLACED) -> list[str]:
    if cluster is not None:
        write("cluster.yaml", cluster)
    return problems(gateway)


def test_models_placed_by_a_valid_cluster_file_need_no_replicas() -> None:
    assert cluster_problems(CLUSTER) == []
    assert load_config("gateway.yaml").gateway.models["llm-large"].replicas == []


def test_a_missing_cluster_file_is_a_problem() -> None:
    assert cluster_problems(None) == ["cluster.yaml: cannot read file: No such file or directory"]


def test_a_broken_cluster_file_is_reported_at_its_lines() -> None:
    broken = CLUSTER.replace("gpus: 2", "gpus: -2") + "  - model: llm-tiny\n"

    assert cluster_problems(broken) == [
        "cluster.yaml:4: nodes[0].gpus: Input should be greater than 0",
        "cluster.yaml:7: deployments[1].model: model 'llm-tiny' is not defined in gateway.yaml",
    ]
    with pytest.raises(ConfigError):
        load_config("gateway.yaml")


def test_a_model_without_replicas_must_be_deployed() -> None:
    assert cluster_problems(CLUSTER.replace("llm-large", "llm-small")) == [
        "gateway.yaml:3: models.llm-large.replicas: "
        "no replicas, and cluster.yaml has no deployment of 'llm-large'"
    ]


def test_the_loops_batch_classes_must_be_admission_classes() -> None:
    cluster = CLUSTER + "autoscaling:\n  batch_classes: [batch, bulk]\n"
    assert cluster_problems(cluster) == [
        "cluster.yaml:8: autoscaling.batch_classes[1]: "
        "'bulk' is not an admission class of gateway.yaml (online, batch)"
    ]


def test_cluster_file_yaml_error_is_reported() -> None:
    (problem,) = cluster_problems("nodes: [\n")
    assert problem.startswith("cluster.yaml:2: invalid YAML: expected the node content")


# --- a bare tenants file next to its gateway.yaml -------------------------------------


def test_bare_tenants_file_is_checked_against_the_gateway_yaml_beside_it() -> None:
    write("conf/gateway.yaml", GATEWAY + "admission: {classes: [gold, silver]}\n")
    write("conf/tenants.yaml", TENANTS + "    priority: online\n    models: [llm-huge]\n")

    assert check_config("conf/tenants.yaml") == [
        "conf/tenants.yaml:5: tenants.acme.priority: "
        "priority 'online' is not a class (gold, silver)",
        "conf/tenants.yaml:6: tenants.acme.models[0]: model 'llm-huge' is not defined",
    ]


def test_bare_tenants_file_of_another_gateway_yaml_gets_the_default_classes() -> None:
    # gateway.yaml names another tenants file: its models say nothing about this one.
    write("gateway.yaml", GATEWAY + "tenants_file: other.yaml\n")
    write("tenants.yaml", TENANTS + "    priority: gold\n    models: [llm-huge]\n")

    assert check_config("tenants.yaml") == [
        "tenants.yaml:5: tenants.acme.priority: priority 'gold' is not a class (online, batch)"
    ]


# --- the shipped configs ------------------------------------------------------------------

SHIPPED = Path(__file__).resolve().parents[3] / "config"


def test_the_shipped_configs_pass_and_hold_the_demo_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NODE_A_URL", "NODE_B_URL"):
        monkeypatch.delenv(name, raising=False)
    gateway = os.path.join(SHIPPED, "gateway.yaml")

    assert check_config(gateway) == []
    assert check_config(os.path.join(SHIPPED, "tenants.yaml")) == []
    config = load_config(gateway)
    assert config.tenant_by_key_hash[digest("sk-acme-demo")] == "acme"
    assert config.tenant_by_key_hash[digest("sk-globex-demo")] == "globex"
    assert config.tenants.tenants["acme"].priority == "online"
    assert config.tenants.tenants["globex"].priority == "batch"


def test_redis_sentinel_names_its_service_and_sentinels() -> None:
    sentinel = "redis:\n  sentinel:\n    service: gw\n    nodes: [s-0:26379, s-1:26379]\n"
    write("tenants.yaml", TENANTS)
    write("gateway.yaml", GATEWAY + sentinel)
    config = load_config("gateway.yaml")
    assert config.gateway.redis.sentinel is not None
    assert config.gateway.redis.sentinel.nodes == ["s-0:26379", "s-1:26379"]


@pytest.mark.parametrize(
    ("redis", "why"),
    [
        ("  cluster: true\n  sentinel: {nodes: [s-0:26379]}\n", "cluster and sentinel exclude"),
        ("  sentinel: {nodes: [s-0]}\n", "sentinel node 's-0': expected host:port"),
        ("  sentinel: {nodes: []}\n", "nodes"),
    ],
)
def test_a_bad_redis_topology_is_refused_at_its_line(redis: str, why: str) -> None:
    found = problems(GATEWAY + "redis:\n" + redis)
    assert len(found) == 1 and why in found[0], found
    assert found[0].startswith("gateway.yaml:")
