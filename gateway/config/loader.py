"""Loading `gateway.yaml` and `tenants.yaml` into `Config`, reporting every problem.

Each file is read into plain data with line numbers (`source.py`), checked
across entries (fallback chains, tenant models, API keys), then validated by
the pydantic models in `schema.py`. Problems from all stages are collected so
one run of `gateway check-config` shows everything that is wrong.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from typing import TypeVar

from pydantic import BaseModel

from gateway.config.extensions import NOT_INSTALLED, cluster_part
from gateway.config.keys import HASH_PREFIX, InvalidKey, parse_key_entry
from gateway.config.schema import (
    AdmissionConfig,
    BackendKind,
    Config,
    GatewayConfig,
    ServerConfig,
    TenantsConfig,
)
from gateway.config.source import ConfigError, Loc, Problem, Source, read_source
from gateway.config.validation import as_dict, as_list, at, validate_source
from gateway.inference.prompt import names_tokenizer_config, template_problem

REDIS_URL_ENV = "GATEWAY_REDIS_URL"

M = TypeVar("M", bound=BaseModel)


def load_config(gateway_path: str) -> Config:
    """Load, validate and cross-check gateway.yaml and the tenants file it names.

    Raises `ConfigError` listing every problem found in both files.
    """
    return _load_config(read_source(gateway_path))


def load_tenants(
    tenants_path: str,
    models: set[str] | None,
    classes: Sequence[str] | None = None,
    mcp_servers: set[str] | None = None,
) -> TenantsConfig:
    """Load a tenants file alone, e.g. to reload it while running.

    `models` are the configured model names that tenants may list, `mcp_servers` the
    MCP servers their `mcp` section may name; None skips that check. API keys are
    returned in `sha256:<hex>` form; `key_index` gives the lookup table. Raises
    `ConfigError`.
    """
    source = read_source(tenants_path)
    tenants, problems = _check_tenants(source, models, classes, mcp_servers)
    if tenants is None:
        raise ConfigError(problems)
    return tenants


def check_config(path: str) -> list[str]:
    """Every problem in a config file as a `file:line: message` line; empty if valid.

    A file with a top-level `tenants` key and no `models` is checked as a bare
    tenants file: its priorities against the classes, and its models against the
    models, of the `gateway.yaml` next to it when that one names it as its tenants
    file (else the default classes, and models are not checked). Anything else is
    checked as gateway.yaml together with its tenants file and cluster file.
    """
    source = read_source(path)
    data = source.data
    try:
        if is_tenants_file(data):
            models, classes, servers = _sibling_gateway(path)
            _, problems = _check_tenants(source, models, classes, servers)
            return [str(p) for p in problems]
        _load_config(source)
    except ConfigError as e:
        return [str(p) for p in e.problems]
    return []


def is_tenants_file(data: object) -> bool:
    """Whether a config file's data is a bare tenants file: `tenants`, no `models`."""
    return isinstance(data, dict) and "tenants" in data and "models" not in data


def key_index(tenants: TenantsConfig) -> dict[str, str]:
    """Tenant name by hex digest of each API key (keys are hashed on load)."""
    return {
        key.removeprefix(HASH_PREFIX): name
        for name, tenant in tenants.tenants.items()
        for key in tenant.api_keys
    }


def _load_config(source: Source) -> Config:
    gateway, problems = _check_gateway(source)
    problems = _sorted(problems + _cluster_problems(source))
    tenants_path = _tenants_path(source)
    tenants = None
    if tenants_path is not None:
        classes = _classes(source)
        tenant_source = read_source(tenants_path)
        tenants, tenant_problems = _check_tenants(
            tenant_source, _model_names(source), classes, _mcp_server_names(source)
        )
        problems += tenant_problems
    if problems or gateway is None or tenants is None or tenants_path is None:
        raise ConfigError(problems)
    return Config(
        gateway=_with_env_overrides(gateway),
        tenants=tenants,
        tenant_by_key_hash=key_index(tenants),
        gateway_path=source.file,
        tenants_path=tenants_path,
    )


def _check_gateway(source: Source) -> tuple[GatewayConfig | None, list[Problem]]:
    problems = list(source.problems)
    if not source.parsed:
        return None, problems
    problems += _fallback_problems(source)
    problems += _upstream_key_problems(source)
    problems += _template_problems(source)
    problems += _replica_problems(source)
    problems += _ops_port_problems(source)
    problems += _capability_problems(source)
    problems += _alias_problems(source)
    problems += _price_problems(source)
    gateway, invalid = validate_source(GatewayConfig, source)
    problems += invalid
    return (None if problems else gateway), _sorted(problems)


def _check_tenants(
    source: Source,
    models: set[str] | None,
    classes: Sequence[str] | None = None,
    mcp_servers: set[str] | None = None,
) -> tuple[TenantsConfig | None, list[Problem]]:
    problems = list(source.problems)
    if not source.parsed:
        return None, problems
    # Before validation: this replaces env-held plain keys by their hashes.
    problems += _key_problems(source)
    problems += _tenant_model_problems(source, models)
    problems += _priority_problems(source, classes)
    problems += _tenant_alias_problems(source, models)
    problems += _tenant_mcp_problems(source, mcp_servers)
    tenants, invalid = validate_source(TenantsConfig, source)
    problems += invalid
    return (None if problems else tenants), _sorted(problems)


def _tenants_path(source: Source) -> str | None:
    """The tenants file, relative to gateway.yaml; None if gateway.yaml does not say."""
    if not source.parsed:
        return None  # unreadable or not YAML: the tenants file is unknown
    data = source.data if isinstance(source.data, dict) else {}
    name = data.get("tenants_file", GatewayConfig.model_fields["tenants_file"].default)
    if not isinstance(name, str) or ("tenants_file",) in source.unresolved:
        return None
    return os.path.join(os.path.dirname(source.file), name)


def _cluster_path(source: Source) -> str | None:
    """The cluster file, relative to gateway.yaml; None if gateway.yaml names none."""
    name = as_dict(source.data).get("cluster_file") if source.parsed else None
    if not isinstance(name, str) or ("cluster_file",) in source.unresolved:
        return None
    return os.path.join(os.path.dirname(source.file), name)


def _sibling_gateway(
    tenants_path: str,
) -> tuple[set[str] | None, list[str], set[str] | None]:
    """Models, priority classes and MCP servers for checking a bare tenants file.

    From the `gateway.yaml` in the same directory when it names this tenants file;
    otherwise no models and servers (not checked) and the default classes.
    """
    default: list[str] = AdmissionConfig.model_fields["classes"].default
    sibling = os.path.join(os.path.dirname(tenants_path), "gateway.yaml")
    if not os.path.isfile(sibling):
        return None, default, None
    source = read_source(sibling)
    named = _tenants_path(source)
    if named is None or os.path.realpath(named) != os.path.realpath(tenants_path):
        return None, default, None
    return _model_names(source), _classes(source), _mcp_server_names(source)


def _mcp_server_names(source: Source) -> set[str]:
    servers = as_dict(as_dict(as_dict(source.data).get("mcp")).get("servers"))
    return set(servers)


def _tenant_mcp_problems(source: Source, servers: set[str] | None) -> list[Problem]:
    """A tenant's `mcp` section names servers gateway.yaml has: a typo in a tool's rate
    would otherwise leave the tool unlimited, in its reach a server out of it."""
    if servers is None:
        return []
    problems = []
    for name, tenant in as_dict(as_dict(source.data).get("tenants")).items():
        section = as_dict(as_dict(tenant).get("mcp"))
        for i, pattern in enumerate(as_list(section.get("tools"))):
            server = pattern.partition("/")[0] if isinstance(pattern, str) else ""
            known = server in servers or "__" in server  # the latter refused as no pattern
            if server and not is_pattern(server) and "[" not in server and not known:
                loc: Loc = ("tenants", name, "mcp", "tools", i)
                message = f"no MCP server '{server}' in gateway.yaml (mcp.servers)"
                problems.append(source.problem(loc, at(loc, message)))
        for tool in as_dict(section.get("limits")):
            server = tool.partition("/")[0] if isinstance(tool, str) else ""
            if server and server not in servers:
                loc = ("tenants", name, "mcp", "limits", tool)
                message = f"a rate for a tool of '{server}', which is no MCP server in gateway.yaml"
                problems.append(source.problem(loc, at(loc, message), at_key=True))
    return problems


def _classes(source: Source) -> list[str]:
    """The priority classes gateway.yaml defines (or the default), even if it is invalid."""
    admission = as_dict(as_dict(source.data).get("admission"))
    classes = admission.get("classes")
    if isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes):
        return classes
    default: list[str] = AdmissionConfig.model_fields["classes"].default
    return default


def _model_names(source: Source) -> set[str] | None:
    models = as_dict(source.data).get("models")
    return set(models) if isinstance(models, dict) else None


def _with_env_overrides(gateway: GatewayConfig) -> GatewayConfig:
    url = os.environ.get(REDIS_URL_ENV)
    if not url:  # unset or empty: keep the file's value
        return gateway
    redis = gateway.redis.model_copy(update={"url": url})
    return gateway.model_copy(update={"redis": redis})


def _sorted(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.file, p.line or 0))


# --- cross checks ----------------------------------------------------------


def _fallbacks(source: Source) -> Iterator[tuple[str, Loc, str]]:
    """(model, loc of the entry, fallback model) for each fallback entry."""
    for name, model in as_dict(as_dict(source.data).get("models")).items():
        for i, target in enumerate(as_list(as_dict(model).get("fallback"))):
            if isinstance(target, str):
                yield name, ("models", name, "fallback", i), target


def _price_problems(source: Source) -> list[Problem]:
    """A price for a model that is not defined (a typo would leave the model unpriced)."""
    data = source.data
    prices = data.get("prices") if isinstance(data, dict) else None
    priced = prices.get("models") if isinstance(prices, dict) else None
    if not isinstance(priced, dict):
        return []
    models = _model_names(source) or set()
    problems = []
    for name in priced:
        if name not in models:
            loc: Loc = ("prices", "models", name)
            message = f"model '{name}' is not defined"
            problems.append(source.problem(loc, at(loc, message), at_key=True))
    return problems


def _fallback_problems(source: Source) -> list[Problem]:
    models = _model_names(source) or set()
    edges: dict[str, list[tuple[Loc, str]]] = {}
    problems = []
    for name, loc, target in _fallbacks(source):
        if target == name:
            problems.append(source.problem(loc, at(loc, f"model '{name}' falls back to itself")))
        elif target not in models:
            problems.append(source.problem(loc, at(loc, f"model '{target}' is not defined")))
        else:
            edges.setdefault(name, []).append((loc, target))
            # A fallback of another kind is wrong whatever it can do: said once.
            problems += _other_vectors(source, loc, name, target) or _dropped_capabilities(
                source, loc, name, target
            )
    return problems + [
        source.problem(loc, at(loc, "fallback chain loops: " + " -> ".join(cycle)))
        for loc, cycle in _cycles(edges)
    ]


# Capabilities a request may use, by their key under `capabilities:`.
_CAPABILITIES = ("tools", "structured_outputs", "logprobs")


def _dropped_capabilities(source: Source, loc: Loc, model: str, target: str) -> list[Problem]:
    """A fallback without a capability its model has: a request that uses it would never
    fall back there (the gateway leaves such a fallback out of the chain)."""
    models = as_dict(as_dict(source.data).get("models"))
    have = as_dict(as_dict(models.get(model)).get("capabilities"))
    other = as_dict(as_dict(models.get(target)).get("capabilities"))
    missing = [c for c in _CAPABILITIES if have.get(c) is True and other.get(c) is not True]
    if not missing:
        return []
    message = (
        f"model '{target}' lacks {', '.join(missing)}, which '{model}' has: requests that "
        "use them would not fall back to it"
    )
    return [source.problem(loc, at(loc, message))]


def _embedding_dimensions(source: Source, model: str) -> int | None:
    """The vector length of an embedding model; None for any other model."""
    models = as_dict(as_dict(source.data).get("models"))
    capabilities = as_dict(as_dict(models.get(model)).get("capabilities"))
    embeddings = capabilities.get("embeddings")
    if not isinstance(embeddings, dict):
        return None
    dimensions = embeddings.get("dimensions")
    return dimensions if isinstance(dimensions, int) else 0


def _other_vectors(source: Source, loc: Loc, model: str, target: str) -> list[Problem]:
    """A fallback that answers in another kind: an embedding model's fallback must give
    vectors of the same length (vectors of another space would be stored next to the
    model's own), and a text model cannot fall back to an embedding model or back."""
    own, other = _embedding_dimensions(source, model), _embedding_dimensions(source, target)
    if own == other:
        return []
    if own is None or other is None:
        kind = "an embedding model" if own is None else "not an embedding model"
        message = f"model '{target}' is {kind}, unlike '{model}'"
    else:
        message = (
            f"model '{target}' gives vectors of {other} dimensions, '{model}' of {own}: "
            "an embedding model may only fall back to one of the same vectors"
        )
    return [source.problem(loc, at(loc, message))]


def _cycles(edges: dict[str, list[tuple[Loc, str]]]) -> list[tuple[Loc, list[str]]]:
    """Each fallback loop once, with the loc of the entry that closes it."""
    found: dict[frozenset[str], tuple[Loc, list[str]]] = {}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        for loc, target in edges.get(name, []):
            if target in path:
                cycle = [*path[path.index(target) :], target]
                found.setdefault(frozenset(cycle), (loc, cycle))
            elif target not in done:
                visit(target, [*path, target])
        done.add(name)

    for start in edges:
        if start not in done:
            visit(start, [start])
    return list(found.values())


def _key_problems(source: Source) -> list[Problem]:
    """Refuse plain keys and repeated keys; replace env-held keys by their hash."""
    owners: dict[str, tuple[str, int]] = {}
    problems = []
    for name, tenant in as_dict(as_dict(source.data).get("tenants")).items():
        keys = as_list(as_dict(tenant).get("api_keys"))
        for i, entry in enumerate(keys):
            loc = ("tenants", name, "api_keys", i)
            if not isinstance(entry, str) or loc in source.unresolved:
                continue
            try:
                hex_digest = parse_key_entry(entry, source.env_vars.get(loc))
            except InvalidKey as e:
                problems.append(source.problem(loc, at(loc, str(e))))
                continue
            keys[i] = HASH_PREFIX + hex_digest  # no plain key is kept in memory
            if hex_digest in owners:
                owner, line = owners[hex_digest]
                if owner == name:
                    message = f"API key is listed twice for tenant '{name}' (first at line {line})"
                else:
                    message = f"API key is already used by tenant '{owner}' (line {line})"
                problems.append(source.problem(loc, at(loc, message)))
            else:
                owners[hex_digest] = (name, source.line(loc))
    return problems


def _cluster_problems(source: Source) -> list[Problem]:
    """The cluster file's problems, as the control plane that reads it checks them."""
    if _cluster_path(source) is None:
        return []
    check = cluster_part("check")
    if check is None:
        return [source.problem(("cluster_file",), at(("cluster_file",), NOT_INSTALLED))]
    problems: list[Problem] = check(source, _cluster_path(source))
    return problems


def _capability_problems(source: Source) -> list[Problem]:
    """Capabilities a model's backend cannot provide."""
    problems = []
    for name, model in as_dict(as_dict(source.data).get("models")).items():
        model = as_dict(model)
        capabilities = as_dict(model.get("capabilities"))
        openai = model.get("backend") == BackendKind.OPENAI.value
        loc: Loc = ("models", name, "capabilities", "tools")
        if capabilities.get("tools") is True and not openai and not capabilities.get("tool_parser"):
            message = "a Triton model needs a `tool_parser` to read its calls"
            problems.append(source.problem(loc, at(loc, message)))
        if capabilities.get("tool_parser") and (openai or capabilities.get("tools") is not True):
            loc = ("models", name, "capabilities", "tool_parser")
            message = (
                "an `openai` backend returns its calls parsed" if openai else "needs `tools: true`"
            )
            problems.append(source.problem(loc, at(loc, message)))
        if isinstance(capabilities.get("embeddings"), dict):
            chat = [c for c in _CAPABILITIES if capabilities.get(c) is True]
            if chat:
                loc = ("models", name, "capabilities", "embeddings")
                message = f"an embedding model cannot have {', '.join(chat)}"
                problems.append(source.problem(loc, at(loc, message)))
    return problems


# --- aliases ---------------------------------------------------------------

# A configured alias is at most this long: names clients send are short, and the
# overlap checks below take time in the product of two patterns' lengths.
MAX_ALIAS_CHARS = 256

_WILDCARDS = frozenset("*?")


def is_pattern(alias: str) -> bool:
    """True if `alias` has a wildcard (`*` or `?`); brackets are literal characters."""
    return not _WILDCARDS.isdisjoint(alias)


def compile_pattern(alias: str) -> re.Pattern[str]:
    """`alias` as a regex matching whole names: `*` any text, `?` one character.

    `[` and `]` are escaped as one-character classes first, so a client's
    `claude-opus-4-8[1m]` is matched as written, never read as a set. fnmatch's
    translation keeps `*` runs in atomic groups: no catastrophic backtracking on
    a long name.
    """
    escaped = "".join("[[]" if c == "[" else "[]]" if c == "]" else c for c in alias)
    return re.compile(fnmatch.translate(escaped))


def pattern_rank(alias: str) -> tuple[int, int]:
    """How specific a pattern is, highest first: its literal prefix (the text before
    the first wildcard), then its literal characters in all."""
    prefix = len(alias)
    for i, char in enumerate(alias):
        if char in _WILDCARDS:
            prefix = i
            break
    return prefix, sum(char not in _WILDCARDS for char in alias)


def patterns_overlap(a: str, b: str) -> bool:
    """True if some name matches both patterns (or exact names)."""
    # reach[i][j]: a[:i] and b[:j] can produce one same text.
    reach = [[False] * (len(b) + 1) for _ in range(len(a) + 1)]
    reach[0][0] = True
    for i in range(len(a) + 1):
        for j in range(len(b) + 1):
            if not reach[i][j]:
                continue
            if i < len(a) and a[i] == "*":
                reach[i + 1][j] = True  # the star ends here, empty or not
                if j < len(b):
                    reach[i][j + 1] = True  # ... or takes what b[j] produces
            if j < len(b) and b[j] == "*":
                reach[i][j + 1] = True
                if i < len(a):
                    reach[i + 1][j] = True
            if (
                i < len(a)
                and j < len(b)
                and "*" not in (a[i], b[j])
                and (a[i] == b[j] or "?" in (a[i], b[j]))
            ):
                reach[i + 1][j + 1] = True
    return reach[len(a)][len(b)]


def pattern_covers(wide: str, narrow: str) -> bool:
    """True if every name `narrow` matches, `wide` matches too.

    Sufficient, not complete: `wide` must match `narrow`'s text with its `*` taken
    only by `*` of `wide`, and its `?` only by `?` or `*`.
    """
    reach = [[False] * (len(narrow) + 1) for _ in range(len(wide) + 1)]
    reach[0][0] = True
    for i in range(len(wide) + 1):
        for j in range(len(narrow) + 1):
            if not reach[i][j]:
                continue
            if i < len(wide) and wide[i] == "*":
                reach[i + 1][j] = True
                if j < len(narrow):
                    reach[i][j + 1] = True
            elif (
                i < len(wide)
                and j < len(narrow)
                and narrow[j] != "*"
                and wide[i] in (narrow[j], "?")
            ):
                reach[i + 1][j + 1] = True
    return reach[len(wide)][len(narrow)]


def _pattern_problems(
    source: Source, entries: list[tuple[Loc, str, str]], scope: str, *, at_key: bool = False
) -> list[Problem]:
    """Patterns that make a config ambiguous, or that can never serve a name.

    `entries` are (loc, pattern, model) of one scope (all models' aliases, or one
    tenant's map) in file order, the order that also breaks ties at run time. Two
    patterns of the same rank that some name matches, for different models, are
    ambiguous; a pattern every name of which an earlier or more specific one takes
    can never win. Overlaps of different rank are how exceptions are written
    (`claude-haiku-*` before `claude-*`): they are resolved by rank, not reported.
    """
    problems = []
    for index, (loc, pattern, model) in enumerate(entries):
        rank = pattern_rank(pattern)
        for other_index, (other_loc, other, other_model) in enumerate(entries):
            if other_index == index:
                continue
            other_rank = pattern_rank(other)
            # Any name both match starts with both literal prefixes: most pairs differ
            # there, which spares them the checks below (quadratic in their lengths).
            shared = min(rank[0], other_rank[0])
            if pattern[:shared] != other[:shared]:
                continue
            before = other_rank > rank or (other_rank == rank and other_index < index)
            line = source.line(other_loc, at_key=at_key)
            if (
                other_index < index
                and other_rank == rank
                and other_model != model
                and patterns_overlap(pattern, other)
            ):
                message = (
                    f"pattern '{pattern}' (model '{model}') and '{other}' (model "
                    f"'{other_model}', line {line}) can match the same name and are as "
                    "specific: which one serves it is ambiguous"
                )
            elif before and pattern_covers(other, pattern):
                message = (
                    f"pattern '{pattern}' can never win: '{other}' ({scope} line {line}) "
                    "takes every name it matches"
                )
            else:
                continue
            problems.append(source.problem(loc, at(loc, message), at_key=at_key))
            break
    return problems


def _alias_problems(source: Source) -> list[Problem]:
    """An alias must name one model only: not a model, nor another model's alias; and
    patterns among them must not be ambiguous (`_pattern_problems`)."""
    models = as_dict(as_dict(source.data).get("models"))
    owner: dict[str, str] = {}
    patterns: list[tuple[Loc, str, str]] = []
    problems = []
    for name, model in models.items():
        for index, alias in enumerate(as_list(as_dict(model).get("aliases"))):
            if not isinstance(alias, str):
                continue  # pydantic reports it
            loc: Loc = ("models", name, "aliases", index)
            other = owner.get(alias)
            if len(alias) > MAX_ALIAS_CHARS:
                message = f"an alias is at most {MAX_ALIAS_CHARS} characters"
            elif alias in models and alias != name:
                message = f"'{alias}' is the name of a model"
            elif other is not None and alias != name:
                message = f"'{alias}' is already an alias of '{other}'"
            else:
                owner[alias] = name
                if is_pattern(alias):
                    patterns.append((loc, alias, name))
                continue
            problems.append(source.problem(loc, at(loc, message)))
    return problems + _pattern_problems(source, patterns, "models' aliases,")


def _tenant_alias_problems(source: Source, models: set[str] | None) -> list[Problem]:
    """A tenant's aliases name a defined model it may use, are no model's name, and
    its patterns are not ambiguous."""
    problems = []
    for name, tenant in as_dict(as_dict(source.data).get("tenants")).items():
        allowed = as_list(as_dict(tenant).get("models", ["*"]))
        patterns: list[tuple[Loc, str, str]] = []
        for alias, model in as_dict(as_dict(tenant).get("aliases")).items():
            if not isinstance(model, str):
                continue  # pydantic reports it
            loc: Loc = ("tenants", name, "aliases", alias)
            if len(alias) > MAX_ALIAS_CHARS:
                message = f"an alias is at most {MAX_ALIAS_CHARS} characters"
            elif models is not None and alias in models:
                message = f"'{alias}' is the name of a model, which is served as itself"
            elif models is not None and model not in models:
                message = f"model '{model}' is not defined"
            elif "*" not in allowed and model not in allowed:
                message = f"tenant '{name}' may not use model '{model}' (its `models`)"
            else:
                if is_pattern(alias):
                    patterns.append((loc, alias, model))
                continue
            problems.append(source.problem(loc, at(loc, message), at_key=True))
        problems += _pattern_problems(source, patterns, f"tenants.{name}.aliases,", at_key=True)
    return problems


def _ops_port_problems(source: Source) -> list[Problem]:
    """The ops listener on the API port would take the API's routes (or the reverse)."""
    server = as_dict(as_dict(source.data).get("server"))
    ops_port = as_dict(server.get("ops")).get("port")
    # As text: either may be a `${VAR}` substitution (text that spells a number).
    if ops_port is None or str(ops_port) != str(server.get("port", ServerConfig().port)):
        return []
    loc: Loc = ("server", "ops", "port")
    return [source.problem(loc, at(loc, f"{ops_port} is the API port (server.port)"))]


def _replica_problems(source: Source) -> list[Problem]:
    """Models without replicas, unless a cluster file may place them."""
    data = as_dict(source.data)
    if data.get("cluster_file"):
        return []  # `_cluster_problems` checks them against the cluster's deployments
    return [
        source.problem(
            ("models", name, "replicas"),
            f"models.{name}.replicas: at least one is needed (or `discovery`, or a "
            "cluster_file that places the model)",
        )
        for name, model in as_dict(data.get("models")).items()
        if isinstance(model, dict) and not model.get("replicas") and not model.get("discovery")
    ]


def _template_problems(source: Source) -> list[Problem]:
    """A prompt template that does not compile would fail every chat request."""
    problems = []
    for name, model in as_dict(as_dict(source.data).get("models")).items():
        template = as_dict(model).get("prompt_template")
        if isinstance(template, str) and names_tokenizer_config(template):
            # A model's tokenizer_config.json, named from the config file's directory as
            # the tenants and cluster files are; kept absolute for the server that reads it.
            template = os.path.join(os.path.dirname(source.file), os.path.expanduser(template))
            model["prompt_template"] = template
        if isinstance(template, str):
            why = template_problem(template)
            if why is not None:
                loc = ("models", name, "prompt_template")
                problems.append(source.problem(loc, at(loc, why)))
    return problems


def _upstream_key_problems(source: Source) -> list[Problem]:
    """An upstream's key is a secret: only an environment reference may hold it."""
    problems = []
    for name in as_dict(as_dict(source.data).get("models")):
        loc = ("models", name, "api_key")
        if (
            loc in source.value_lines
            and loc not in source.env_vars
            and loc not in source.unresolved
        ):
            message = "upstream API key in file; reference an environment variable as ${VAR}"
            problems.append(source.problem(loc, at(loc, message)))
    return problems


def environment_problems(gateway_path: str) -> list[str]:
    """What the environment lacks for gateway.yaml to be served (not a problem of the
    file, so a report or a check of the files alone reads it without the secrets): each
    variable an MCP server's credentials name (found when the gateway starts, not on
    the first call), as `file:line: why`."""
    source = read_source(gateway_path)
    return [str(problem) for problem in _sorted(_mcp_env_problems(source))]


def environment_warnings(gateway_path: str) -> list[str]:
    """What of gateway.yaml cannot run on this machine but does not stop it: a stdio
    MCP server whose program or paths are not here (it is left out of listings, its
    calls refused as unavailable), as `file:line: why`."""
    source = read_source(gateway_path)
    return [str(problem) for problem in _sorted(_mcp_command_problems(source))]


# Where a stdio server's command is looked for in its sandbox (its PATH there).
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


def _mcp_command_problems(source: Source) -> list[Problem]:
    """A stdio server's sandbox sees `/usr` and its configured paths only: its program
    must be found there, and each path it names be an absolute path that exists."""
    problems = []
    servers = as_dict(as_dict(as_dict(source.data).get("mcp")).get("servers"))
    for name, server in servers.items():
        command = as_list(as_dict(server).get("command"))
        sandbox = as_dict(as_dict(server).get("sandbox"))
        seen: list[str] = []
        for part in ("read_only", "writable"):
            for i, path in enumerate(as_list(sandbox.get(part))):
                if not isinstance(path, str):
                    continue
                loc: Loc = ("mcp", "servers", name, "sandbox", part, i)
                # A tenant's own directory is made when its process starts: its parent
                # is what must be here.
                path = path.split("{tenant}")[0] or "/"
                if os.path.isabs(path) and not os.path.exists(path):
                    problems.append(source.problem(loc, at(loc, f"{path} does not exist")))
                seen.append(os.path.normpath(path))
        program = command[0] if command and isinstance(command[0], str) else None
        if program is None:
            continue
        loc = ("mcp", "servers", name, "command", 0)
        if os.path.isabs(program):
            inside = program.startswith("/usr/") or any(
                program == p or program.startswith(p.rstrip("/") + "/") for p in seen
            )
            if not os.path.isfile(program):
                problems.append(source.problem(loc, at(loc, f"{program} does not exist")))
            elif not inside:
                why = f"{program} is outside /usr and the sandbox's paths: it cannot run there"
                problems.append(source.problem(loc, at(loc, why)))
        elif shutil.which(program, path=SANDBOX_PATH) is None:
            why = f"{program!r} is not found in the sandbox's PATH ({SANDBOX_PATH})"
            problems.append(source.problem(loc, at(loc, why)))
    return problems


def _mcp_env_problems(source: Source) -> list[Problem]:
    """An MCP server's credentials come from the environment: each variable it names
    must be set when the gateway starts."""
    problems = []
    servers = as_dict(as_dict(as_dict(source.data).get("mcp")).get("servers"))
    for name, server in servers.items():
        named: list[tuple[Loc, object]] = [
            (("mcp", "servers", name, "bearer_token_env"), as_dict(server).get("bearer_token_env"))
        ]
        for part in ("env_headers", "env_from"):
            for key, var in as_dict(as_dict(server).get(part)).items():
                named.append((("mcp", "servers", name, part, key), var))
        for loc, var in named:
            if isinstance(var, str) and var and not os.environ.get(var):
                message = f"environment variable {var} is not set (the server's credential)"
                problems.append(source.problem(loc, at(loc, message)))
    return problems


def _priority_problems(source: Source, classes: Sequence[str] | None) -> list[Problem]:
    """A tenant's priority must be one of the classes gateway.yaml defines."""
    if classes is None:
        return []
    problems = []
    for name, tenant in as_dict(as_dict(source.data).get("tenants")).items():
        priority = as_dict(tenant).get("priority")
        loc: Loc = ("tenants", name, "priority")
        if isinstance(priority, str) and priority not in classes:
            message = f"priority '{priority}' is not a class ({', '.join(classes)})"
            problems.append(source.problem(loc, at(loc, message)))
    return problems


def _tenant_model_problems(source: Source, models: set[str] | None) -> list[Problem]:
    if models is None:
        return []
    problems = []
    for name, tenant in as_dict(as_dict(source.data).get("tenants")).items():
        for i, model in enumerate(as_list(as_dict(tenant).get("models"))):
            loc = ("tenants", name, "models", i)
            if isinstance(model, str) and model != "*" and model not in models:
                problems.append(source.problem(loc, at(loc, f"model '{model}' is not defined")))
        limits = as_dict(as_dict(tenant).get("limits"))
        for model in as_dict(limits.get("models")):
            limits_loc: Loc = ("tenants", name, "limits", "models", model)
            if model not in models:
                message = f"limits for model '{model}', which is not defined"
                problems.append(source.problem(limits_loc, at(limits_loc, message), at_key=True))
        budgets = as_list(as_dict(tenant).get("budgets"))
        seen: set[tuple[object, object]] = set()
        for i, budget in enumerate(budgets):
            budget_loc: Loc = ("tenants", name, "budgets", i)
            model = as_dict(budget).get("model")
            if isinstance(model, str) and model not in models:
                model_loc: Loc = (*budget_loc, "model")
                message = f"a budget for model '{model}', which is not defined"
                problems.append(source.problem(model_loc, at(model_loc, message)))
            scope = (as_dict(budget).get("period", "month"), model)
            if scope in seen:  # one bucket in Redis: two amounts for it would fight
                message = "a second budget for the same period and model"
                problems.append(source.problem(budget_loc, at(budget_loc, message)))
            seen.add(scope)
        outbound = as_dict(as_dict(tenant).get("outbound"))
        for model in as_dict(outbound.get("models")):
            outbound_loc: Loc = ("tenants", name, "outbound", "models", model)
            if model not in models:
                message = f"outbound policy for model '{model}', which is not defined"
                problems.append(
                    source.problem(outbound_loc, at(outbound_loc, message), at_key=True)
                )
    return problems
