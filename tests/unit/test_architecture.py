"""The shape of the three programs: the server (`gateway/`), the control plane
(`gateway_control/`) and the offline tools (`gateway_tools/`).

Within each, imports run one way, from the top (the app, the CLI, the commands) down to
the shared types. Between them, only downward: the tools may use the control plane and
the server, the control plane the server, and the server neither (it finds the control
plane by entry point, `gateway.config.extensions`). The import graph is built from the
source (ast), function-level and TYPE_CHECKING imports included: a cycle or an upward
import hidden in a function is still one. `docs/architecture.md` draws the layers below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "gateway"
# The programs, lowest first: each may import the ones before it, never those after.
PROGRAMS = ("gateway", "gateway_control", "gateway_tools")
ROOTS = tuple(REPO / name for name in PROGRAMS)

# Each top-level module or package of a program and its layer: a module may import its
# own package and the packages of lower layers of its program, never those of its own
# layer or above.
LAYERS = {
    "gateway.inference": 0,  # the request and result types, prompts, token estimates, ids
    "gateway.privacy": 0,  # what sensitive data looks like: log redaction, outbound masking
    "gateway.config": 1,
    "gateway.observability": 1,
    "gateway.storage": 2,
    "gateway.backends": 2,
    "gateway.admission": 2,
    "gateway.transport": 2,  # HTTP below every API: the protocol, listeners, stream relay
    "gateway.ledger": 2,  # the usage ledger: one record per request, to PostgreSQL or SQLite
    "gateway.ratelimit": 3,
    "gateway.apikeys": 3,  # managed API keys: records and store in Redis, each gateway's directory
    "gateway.upstream": 3,
    "gateway.batches": 4,  # batch work (issue 44, in progress): input files read and checked
    "gateway.mcp": 4,  # the MCP gateway (issue 45): upstream servers, reach, sessions
    "gateway.serving": 5,
    "gateway.api": 6,
    "gateway.app": 7,
    "gateway.cli": 8,
}
CONTROL_LAYERS = {
    "gateway_control.scheduler": 0,  # the offline laboratory: a library of placement policies
    "gateway_control.cluster_config": 1,  # cluster.yaml: nodes and deployments
    "gateway_control.cluster_check": 2,  # cluster.yaml against the gateway.yaml naming it
    "gateway_control.placement": 2,  # placement, leadership, the closed loop
    "gateway_control.attach": 3,  # placement attached to a server (its entry point)
    "gateway_control.control_cli": 3,  # `gateway place`, `gateway simulate`
}
TOOLS_LAYERS = {
    "gateway_tools.clients": 0,  # the coding tools as clients: what points each at a gateway
    "gateway_tools.usage_cli": 0,  # `gateway usage report`
    "gateway_tools.eval": 1,  # `gateway eval`: task suites, the sandbox, runs and reports
    "gateway_tools.dev": 2,  # the demo, simulated Triton models, processes for tests
    "gateway_tools.tools_cli": 3,  # `gateway demo`, `triton-sim`, `usage`, `eval`, `tools`
}
ALL_LAYERS = {**LAYERS, **CONTROL_LAYERS, **TOOLS_LAYERS}
# Who may import the HTTP layer (the rule, stated on its own).
API = "gateway.api"
API_USERS = ("gateway.api", "gateway.app", "gateway.cli")


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name to file, for every module under `root` (a package directory)."""
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names an import statement names (for `from X import y`: X.y and X)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = module if is_package else module.rpartition(".")[0]
        if node.level:
            base = ".".join(base.split(".")[: len(base.split(".")) - node.level + 1])
            target = f"{base}.{node.module}" if node.module else base
        else:
            target = node.module or ""
        yield target
        yield from (f"{target}.{alias.name}" for alias in node.names)


def import_graph(roots: tuple[Path, ...] = ROOTS) -> dict[str, set[str]]:
    """Module to the modules of the programs under `roots` it imports."""
    files: dict[str, Path] = {}
    for root in roots:
        files |= modules(root)
    names = tuple(root.name for root in roots)

    def owner(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = set()
        for node in ast.walk(tree):
            for name in _imported(node, module, path.name == "__init__.py"):
                found = owner(name) if name.split(".")[0] in names else None
                if found is not None and found != module:
                    targets.add(found)
        graph[module] = targets
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def top_level(module: str) -> str:
    """`gateway.serving.runtime` -> `gateway.serving`."""
    return ".".join(module.split(".")[:2])


def program(module: str) -> str:
    """`gateway_control.placement.controller` -> `gateway_control`."""
    return module.split(".")[0]


def upward_imports(
    graph: Mapping[str, set[str]], layers: Mapping[str, int] = ALL_LAYERS
) -> list[tuple[str, str]]:
    """(importer, imported) for every import of a package of the importer's layer or
    above in its own program, and of a program after its own (PROGRAMS' order)."""
    order = {name: i for i, name in enumerate(PROGRAMS)}
    return sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if top_level(module) != top_level(target)
        and top_level(module) in layers
        and (
            order[program(target)] > order[program(module)]
            or (
                program(target) == program(module)
                and layers[top_level(target)] >= layers[top_level(module)]
            )
        )
    )


def api_imports(graph: Mapping[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every import of `gateway.api` from outside the app and CLI."""
    return sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if top_level(target) == API and top_level(module) not in API_USERS
    )


def test_gateway_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_only_the_app_and_the_cli_import_the_http_layer() -> None:
    assert api_imports(import_graph()) == []


def test_packages_import_only_lower_layers() -> None:
    assert upward_imports(import_graph()) == []


def test_the_server_imports_neither_the_control_plane_nor_the_tools() -> None:
    """Stated on its own: what `gateway serve` may load is `gateway/` and nothing else."""
    graph = import_graph()
    assert [
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if program(module) == "gateway" and program(target) != "gateway"
    ] == []


def test_every_top_level_module_has_a_layer() -> None:
    """A new package must be placed in a program's layers (and in docs/architecture.md)."""
    assert {top_level(m) for m in import_graph() if m not in PROGRAMS} == set(ALL_LAYERS)


def test_gateway_top_level_holds_only_the_app_the_cli_and_packages() -> None:
    loose = {p.name for p in ROOT.glob("*.py")} - {"__init__.py", "app.py", "cli.py"}
    assert loose == set()


def test_no_two_modules_share_a_name() -> None:
    """One name, one meaning: `errors` (each package's own errors) is the only module name
    used twice, and no module is named like a package."""
    seen: dict[str, list[str]] = {}
    for module in import_graph():  # packages too, by their __init__.py
        name = module.rpartition(".")[2]
        if name != "errors":
            seen.setdefault(name, []).append(module)
    assert {name: found for name, found in seen.items() if len(found) > 1} == {}


def test_the_checks_find_a_cycle_and_an_upward_import() -> None:
    """The rules above fail when they should: on a small graph with both faults."""
    graph = {
        "gateway.config.a": {"gateway.config.b"},
        "gateway.config.b": {"gateway.config.a", "gateway.serving.runtime"},
        "gateway.serving.runtime": {"gateway.api.errors", "gateway_control.attach"},
        "gateway.api.errors": set(),
        # Down a program: allowed, whatever the layer.
        "gateway_control.attach": {"gateway.serving.runtime"},
        "gateway_tools.dev.demo": {"gateway_control.attach", "gateway.cli"},
    }
    assert sorted(cycles(graph)) == [
        ["gateway.config.a", "gateway.config.b"],
        ["gateway.serving.runtime", "gateway_control.attach"],
    ]
    assert upward_imports(graph) == [
        ("gateway.config.b", "gateway.serving.runtime"),
        ("gateway.serving.runtime", "gateway.api.errors"),
        ("gateway.serving.runtime", "gateway_control.attach"),
    ]
    assert api_imports(graph) == [("gateway.serving.runtime", "gateway.api.errors")]


def _package_rows() -> dict[str, str]:
    """docs/architecture.md's tables: each package's row, by its path (`gateway/api`)."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    rows = {}
    for line in doc.splitlines():
        if line.startswith("| `") and "/` |" in line:
            rows[line.split("`")[1].rstrip("/")] = line
    return rows


def test_the_architecture_document_names_every_module() -> None:
    """The map stays true: each module of a package is named (`name.py`) in its package's
    row of docs/architecture.md, each module at a program's top in the program's row,
    and each package has a row."""
    rows = _package_rows()
    missing = []
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(REPO)
            if path.name == "__init__.py" or relative.parts[:2] == ("gateway", path.name):
                continue  # a package's own __init__, or the server's app.py and cli.py
            package = "/".join(relative.parts[: 2 if len(relative.parts) > 2 else 1])
            if f"`{path.name}`" not in rows.get(package, ""):
                missing.append(str(relative))
        packages = {f"{root.name}/{p.name}" for p in root.iterdir() if (p / "__init__.py").exists()}
        assert set(rows) >= packages
    assert missing == []
