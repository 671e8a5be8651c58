"""`gateway demo`: real Triton replicas (simulated LLMs), Redis and the gateway, on localhost."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

from gateway.storage.redis_client import EMBEDDED_URL
from gateway_tools.dev.processes import (
    Cancelled,
    free_port,
    gateway_command,
    port_is_free,
    redis_server_path,
    spawn,
    start_redis,
    stop,
    wait_gateway_ready,
    wait_http_ok,
)
from gateway_tools.dev.sim.repository import parse_models

# The source tree's root: `config/gateway.yaml` is found there when not in the cwd.
_ROOT = Path(__file__).resolve().parents[2]
# The scripted coding models replay recorded answers to the shipped eval suite (a
# fixture: docs/eval.md); gateway_tools/dev/replay.py writes the files.
REPLAY_DIR = _ROOT / "evals" / "replay"
_REPLAYING = ("coder-large", "coder-small")
# Two Triton servers, the nodes of config/cluster.yaml. Both have every model; the
# gateway loads and unloads them where the scheduler places cluster.yaml's deployments.
_MODELS = ",".join(
    ["llm-large", "llm-small", "embed-small"]
    + [f"{name}=@{REPLAY_DIR / name}.json" for name in _REPLAYING]
)
_SERVERS = (("NODE_A_URL", _MODELS), ("NODE_B_URL", _MODELS))
# A node (triton-sim) that dies is started again after this long, so that a user who
# kills one watches its replicas move to the other node and then back.
NODE_RESTART_ENV = "GATEWAY_DEMO_NODE_RESTART_S"
NODE_RESTART_S = 20.0
# The ops listener's port in config/gateway.yaml, set by `--ops-port`.
OPS_PORT_ENV = "GATEWAY_OPS_PORT"
# Where the demo's usage ledger lives (config/gateway.yaml reads it); a new directory a run.
STATE_DIR_ENV = "GATEWAY_STATE_DIR"
# The checkout, whose docs the demo's MCP server serves.
SOURCE_ENV = "GATEWAY_SOURCE"


def _node_name(variable: str) -> str:
    """`NODE_A_URL` -> `node-a`, the node's name in config/cluster.yaml."""
    return variable.removesuffix("_URL").lower().replace("_", "-")


def resolve_config(path: str) -> str | None:
    """`path` if it exists, else a relative `path` under the source tree; None if neither."""
    if os.path.exists(path):
        return os.path.abspath(path)
    if not os.path.isabs(path) and (_ROOT / path).exists():
        return str(_ROOT / path)
    return None


def _examples(port: int, ops_port: int | None, state_dir: str) -> str:
    base = f"http://127.0.0.1:{port}/v1"
    # The interpreter running the demo has the openai package (and Debian has no `python`).
    python = shlex.quote(sys.executable)
    return f"""
The gateway is ready at {base}   (Ctrl-C stops everything)

  curl -s {base}/chat/completions -H 'Authorization: Bearer sk-acme-demo' \\
    -H 'Content-Type: application/json' \\
    -d '{{"model": "llm-large", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  {python} - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{base}", api_key="sk-acme-demo")
print(client.chat.completions.create(
    model="llm-large", messages=[{{"role": "user", "content": "Hello!"}}]
).choices[0].message.content)
for chunk in client.chat.completions.create(
    model="llm-small", messages=[{{"role": "user", "content": "Stream, please"}}], stream=True
):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
vectors = client.embeddings.create(model="embed-small", input=["a cat", "a dog"])
print([len(item.embedding) for item in vectors.data])
PY

Evaluate the two scripted coding models on the shipped task suite (docs/eval.md):

  {python} -m gateway.cli eval run --endpoint {base} --key sk-acme-demo \\
    --model coder-large --model coder-small --prices evals/prices.yaml --out eval-run
  {python} -m gateway.cli eval report eval-run
{_tools_lines(base, ops_port, python)}
MCP: the gateway's tools at {base.removesuffix("/v1")}/mcp, under the same keys (docs/mcp.md);
the demo serves the project's docs as `docs__search_docs` and `docs__read_doc`:

  npx -y @modelcontextprotocol/inspector@2.12.0 --cli {base.removesuffix("/v1")}/mcp \\
    --transport http --header 'Authorization: Bearer sk-acme-demo' \\
    --method tools/call --tool-name docs__search_docs --tool-arg query=sandbox
  {python} -m gateway.cli tools config claude --url {base} --key sk-acme-demo
                            (Claude Code and Codex CLI: their MCP part too)

Tenants: acme   (key sk-acme-demo, online, models llm-large, llm-small, embed-small,
                 coder-large, coder-small)
         globex (key sk-globex-demo, batch, model llm-small)
         evals  (key sk-evals-demo, batch, models coder-large, coder-small: the coding
                 tools under evaluation get keys of their own of it)
{_ops_line(ops_port, state_dir)}"""


def _tools_lines(base: str, ops_port: int | None, python: str) -> str:
    """How to evaluate the coding tools themselves; their keys come from the admin API,
    on the ops listener."""
    if ops_port is None:
        return ""
    return f"""
And Codex CLI and Claude Code on them, in the sandbox, each run with a key of its own:

  export GATEWAY_TOOLS_BIN=$(scripts/coding-tools.sh codex claude)
  export GATEWAY_EVAL_ADMIN_KEY=sk-ops-demo
  {python} -m gateway.cli eval run --endpoint {base} --tool codex --tool claude \\
    --model coder-large --model coder-small --tenant evals \\
    --admin-url http://127.0.0.1:{ops_port} --prices evals/prices.yaml --out tools-run
"""


def _ops_line(ops_port: int | None, state_dir: str) -> str:
    ledger = (
        f"Ledger:   {STATE_DIR_ENV}={shlex.quote(state_dir)} {shlex.quote(sys.executable)} "
        "-m gateway.cli usage report --config config/gateway.yaml --by tenant,key,model "
        "--since 1h   (this run's records)\n"
    )
    if ops_port is None:
        return ledger
    ops = f"http://127.0.0.1:{ops_port}"
    return (
        f"Metrics:  {ops}/metrics   (the ops listener, no key)\n"
        f"Usage:    curl -s '{ops}/admin/usage?by=tenant,model&since=1h' "
        "-H 'Authorization: Bearer sk-ops-demo'   (ops: the admin tenant)\n"
        f"Keys:     GATEWAY_ADMIN_KEY=sk-ops-demo {shlex.quote(sys.executable)} -m gateway.cli "
        f"keys --url {ops} create --tenant acme --name dev --budget 0.01/day\n"
        f"Batches:  GATEWAY_ADMIN_KEY=sk-ops-demo {shlex.quote(sys.executable)} -m gateway.cli "
        f"batches --url {ops} list   (batches made with the SDKs' client.batches / "
        "client.messages.batches; docs/batches.md)\n" + ledger
    )


def _traces_line(path: str) -> str:
    python = shlex.quote(sys.executable)
    return (
        f"Traces:   {python} -m gateway.cli traces --file {shlex.quote(path)} --last 1   "
        "(the last request's spans, the gateway's and Triton's; docs/observability.md)"
    )


def _check(config_path: str) -> str | None:
    """The config to run (absolute), after printing its problems; None when unusable."""
    from gateway.config import check_config

    resolved = resolve_config(config_path)
    if resolved is None:
        print(f"demo: {config_path}: no such file (nor under {_ROOT})", file=sys.stderr)
        return None
    problems = check_config(resolved)
    for problem in problems:
        print(problem, file=sys.stderr)
    return None if problems else resolved


class _Node:
    """One node of the demo: a triton-sim that is started again after it dies."""

    def __init__(self, name: str, port: int, models: str, trace_url: str) -> None:
        self.name, self.port, self.models = name, port, models
        self.trace_url = trace_url
        # The names only (`coder-large=@FILE` is the model coder-large).
        self.model_names = [profile.name for profile in parse_models(models)]
        self.process: subprocess.Popen[bytes] | None = None
        self._restart_at: float | None = None

    def start(self) -> subprocess.Popen[bytes]:
        command = gateway_command(
            "triton-sim", "--port", str(self.port), "--models", self.models,
            "--trace-url", self.trace_url,
        )  # fmt: skip
        self.process = spawn(command)
        return self.process

    def wait_ready(self, cancel: threading.Event) -> None:
        for model in self.model_names:
            url = f"http://127.0.0.1:{self.port}/v2/models/{model}/ready"
            wait_http_ok(url, timeout_s=90, process=self.process, cancel=cancel)

    def watch(self, restart_s: float) -> subprocess.Popen[bytes] | None:
        """Report a death, and start the node again `restart_s` later (its new process)."""
        if self.process is None or self.process.poll() is None:
            return None
        if self._restart_at is None:
            self._restart_at = time.monotonic() + restart_s
            print(
                f"{self.name} (triton-sim on :{self.port}) exited with "
                f"{self.process.returncode}: the gateway places its replicas on the other "
                f"node; {self.name} starts again in {restart_s:g} s",
                flush=True,
            )
            return None
        if time.monotonic() < self._restart_at:
            return None
        self._restart_at = None
        print(f"{self.name}: starting triton-sim again", flush=True)
        return self.start()


def _ops_port(config_path: str) -> int | None:
    """The ops listener's port in the (checked) config, as the gateway will read it."""
    from gateway.config import load_config

    return load_config(config_path).gateway.server.ops.port


def _taken(ports: dict[str, int | None]) -> str | None:
    """A message naming the first of `ports` (by their option) that is taken, or None."""
    for option, port in ports.items():
        if port is not None and not port_is_free(port):
            return (
                f"demo: port {port} is taken on 127.0.0.1; choose another with {option}, "
                f"for example {option} {free_port()}"
            )
    return None


def run_demo(port: int, config_path: str, ops_port: int | None = None) -> int:
    """Start the stack, print how to call it, and stop it all on Ctrl-C or SIGTERM.

    The config (with its tenants and cluster files) is checked before anything starts;
    Ctrl-C while the stack starts stops what has started so far. `ops_port` replaces
    the config's ops port (through `GATEWAY_OPS_PORT`, which config/gateway.yaml reads).
    """
    if ops_port is not None:
        os.environ[OPS_PORT_ENV] = str(ops_port)
    config = _check(config_path)
    if config is None:
        return 1
    ops_port = _ops_port(config)
    # Found before Redis and two Triton servers start, not 10 s later.
    taken = _taken({"--port": port, "--ops-port": ops_port})
    if taken is not None:
        print(taken, file=sys.stderr)
        return 1
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    env = dict(os.environ)
    # The usage ledger is this run's, as its Redis is, so that its figures match the
    # counters and the budgets of this run (GATEWAY_STATE_DIR set: the one given, kept).
    own_state = STATE_DIR_ENV not in env
    if own_state:
        env[STATE_DIR_ENV] = tempfile.mkdtemp(prefix="gateway-demo-")
    # The demo's MCP server reads this checkout's docs (config/gateway.yaml, `mcp`).
    env.setdefault(SOURCE_ENV, str(_ROOT))
    children: list[subprocess.Popen[bytes]] = []
    try:
        if redis_server_path() is not None:
            redis_port = free_port()
            children.append(start_redis(redis_port, cancel=stopping))
            env["GATEWAY_REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
            print(f"redis-server on 127.0.0.1:{redis_port}")
        else:
            env["GATEWAY_REDIS_URL"] = EMBEDDED_URL
            print("redis-server not found: using the embedded fakeredis")

        # Traces: the gateway's and Triton's spans into this run's file, which `gateway
        # traces` prints (an OTLP endpoint already set in the environment is kept).
        traces_port = free_port()
        traces_file = os.path.join(env[STATE_DIR_ENV], "traces.jsonl")
        children.append(
            spawn(
                gateway_command("otlp-receiver", "--port", str(traces_port), "--file", traces_file)
            )
        )
        trace_url = f"http://127.0.0.1:{traces_port}/v1/traces"
        env.setdefault("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{traces_port}")
        nodes: list[_Node] = []
        for variable, models in _SERVERS:
            port_span = free_port(span=3, start=21000 + 100 * len(nodes))
            node = _Node(_node_name(variable), port_span, models, trace_url)
            nodes.append(node)
            children.append(node.start())
            env[variable] = f"http://127.0.0.1:{node.port}"
        for node in nodes:
            node.wait_ready(stopping)
            where = f"127.0.0.1:{node.port} (gRPC {node.port + 1})"
            print(f"{node.name}: triton-sim {','.join(node.model_names)} on {where}")

        gateway = spawn(gateway_command("serve", "--config", config, "--port", str(port)), env=env)
        children.append(gateway)
        wait_gateway_ready(
            f"http://127.0.0.1:{port}", timeout_s=60, process=gateway, cancel=stopping
        )
        print(_examples(port, ops_port, env[STATE_DIR_ENV]), flush=True)
        print(_traces_line(traces_file), flush=True)

        restart_s = float(os.environ.get(NODE_RESTART_ENV, NODE_RESTART_S))
        essential = [c for c in children if all(c is not n.process for n in nodes)]
        while not stopping.wait(0.5):
            for child in essential:
                if child.poll() is not None:
                    print(f"{child.args!r} exited with {child.returncode}", file=sys.stderr)
                    return 1
            for node in nodes:
                restarted = node.watch(restart_s)
                if restarted is not None:
                    children.append(restarted)
        return 0
    except Cancelled:
        return 130  # interrupted before the stack was up
    except (RuntimeError, TimeoutError, FileNotFoundError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopping...", flush=True)
        for child in reversed(children):
            stop(child)
        if own_state:
            shutil.rmtree(env[STATE_DIR_ENV], ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
