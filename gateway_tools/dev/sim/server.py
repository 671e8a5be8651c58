"""Run the real `tritonserver` binary on a generated repository of simulated LLMs.

Ports: HTTP on `port`, gRPC on `port + 1`, metrics on `port + 2`, all on 127.0.0.1.
The server runs in its own session so that `stop()` can kill the Python backend stub
processes too, even the ones that outlive a crashed or killed server.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import FrameType, TracebackType

from gateway_tools.dev.sim.repository import (
    ModelProfile,
    parse_models,
    tritonserver_dir,
    write_repository,
)

HOST = "127.0.0.1"
SHM_DIR = Path("/dev/shm")
# No proxies: an http_proxy in the environment must not intercept calls to 127.0.0.1.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class TritonSimError(RuntimeError):
    """tritonserver failed to start or to become ready."""


class TritonSim:
    """One tritonserver process serving simulated LLMs; see the module docstring."""

    def __init__(
        self,
        port: int,
        models: str | Sequence[ModelProfile] = "llm-large,llm-small",
        trace_url: str | None = None,
    ):
        self.port = port
        # An OTLP/HTTP endpoint (`http://host:4318/v1/traces`): Triton's own spans of the
        # requests that come with a `traceparent` go there (`trace_arguments`).
        self.trace_url = trace_url
        self.profiles: list[ModelProfile] = (
            parse_models(models) if isinstance(models, str) else list(models)
        )
        # The stubs name their /dev/shm regions <prefix><uuid>: a unique prefix per
        # server lets stop() remove exactly this server's leftovers.
        self.shm_prefix = f"triton_sim_{secrets.token_hex(4)}_"
        self.workdir: Path | None = None
        self.log_path: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def model_names(self) -> list[str]:
        """Names of the served models, in `--models` order."""
        return [p.name for p in self.profiles]

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP/REST endpoint, e.g. http://127.0.0.1:8000."""
        return f"http://{HOST}:{self.port}"

    @property
    def grpc_target(self) -> str:
        """host:port of the gRPC endpoint (what grpc channels expect)."""
        return f"{HOST}:{self.port + 1}"

    @property
    def metrics_url(self) -> str:
        """URL of the Prometheus metrics."""
        return f"http://{HOST}:{self.port + 2}/metrics"

    @property
    def pid(self) -> int | None:
        """Process id of tritonserver (also its process group and session id)."""
        return self._process.pid if self._process else None

    def poll(self) -> int | None:
        """tritonserver's exit code, or None while it runs (or was never started)."""
        return self._process.poll() if self._process else None

    def start(self) -> None:
        """Write the model repository and launch tritonserver (does not wait for ready).

        After kill() or stop() this starts a fresh server on the same ports, like a
        replica coming back.
        """
        if self._process is not None and self._process.poll() is None:
            raise TritonSimError("already running")
        self.stop()  # clean up after an earlier run, if any
        missing = libpython_problem()
        if missing is not None:
            raise TritonSimError(missing)
        for port in (self.port, self.port + 1, self.port + 2):
            _ensure_port_free(port)
        self.workdir = Path(tempfile.mkdtemp(prefix="triton-sim-"))
        try:
            self._launch()
        except BaseException:
            self.stop()
            raise

    def _launch(self) -> None:
        assert self.workdir is not None
        layout = write_repository(self.workdir, self.profiles)
        self.log_path = self.workdir / "tritonserver.log"
        command = [
            str(tritonserver_dir() / "bin" / "tritonserver"),
            f"--model-repository={layout.model_repository}",
            f"--backend-directory={layout.backend_directory}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            "--model-control-mode=explicit",
            *(f"--load-model={name}" for name in self.model_names),
            f"--http-address={HOST}",
            f"--http-port={self.port}",
            f"--grpc-address={HOST}",
            f"--grpc-port={self.port + 1}",
            f"--metrics-address={HOST}",
            f"--metrics-port={self.port + 2}",
            "--exit-timeout-secs=3",
            *trace_arguments(self.trace_url, f"triton-sim-{self.port}"),
        ]
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_server_env(),
                cwd=self.workdir,
                start_new_session=True,  # own process group: stop() can kill stubs too
            )

    def wait_ready(self, timeout: float = 60.0, cancel: threading.Event | None = None) -> None:
        """Block until the server and every model report ready.

        Raises TritonSimError with the tail of the server log if the server exits, the
        timeout passes, or `cancel` is set first.
        """
        if self._process is None:
            raise TritonSimError("not started")
        paths = ["/v2/health/ready", *(f"/v2/models/{name}/ready" for name in self.model_names)]
        deadline = time.monotonic() + timeout
        while True:
            code = self._process.poll()
            if code is not None:
                raise TritonSimError(f"tritonserver exited with code {code}\n{self.log_tail()}")
            if all(_is_ok(self.http_url + path) for path in paths):
                return
            if cancel is not None and cancel.is_set():
                raise TritonSimError("startup cancelled")
            if time.monotonic() > deadline:
                raise TritonSimError(f"not ready after {timeout:.0f} s\n{self.log_tail()}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL tritonserver only, like a crashed replica; call stop() to clean up.

        The stubs notice their parent's death and exit by themselves (in about 0.5 s).
        """
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            # Wait without reaping: the zombie keeps the pid, and so the process group
            # id, from being reused until stop() has used it.
            _wait_exit(process.pid, timeout=10.0)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server, kill leftover stubs, and remove the repository and shm files.

        SIGTERM first (tritonserver unloads the models within --exit-timeout-secs), then
        SIGKILL for whatever is left. Safe to call more than once and after kill().
        """
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            # Not reaped yet, so process.pid still names our process group: plain os
            # calls, since Popen's methods would reap it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            _wait_exit(process.pid, timeout)
            # Stubs can outlive the server and ignore SIGTERM: SIGKILL the whole session.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if process is not None:
            process.wait()
        if self.workdir is not None:
            # Anything still running from our directory (e.g. if the server was reaped
            # before the session could be killed).
            _kill_all(processes_mentioning(str(self.workdir)), timeout=5.0)
            shutil.rmtree(self.workdir, ignore_errors=True)
        for leftover in SHM_DIR.glob(f"{self.shm_prefix}*"):
            leftover.unlink(missing_ok=True)
        self.workdir = None
        self.log_path = None

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server log ('' if there is none)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 16384))
            text = log.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> TritonSim:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def trace_arguments(url: str | None, service: str) -> list[str]:
    """tritonserver's OpenTelemetry tracing (Triton 2.51: opentelemetry-cpp, OTLP/HTTP in
    JSON), for the requests whose caller sends a `traceparent` only: `rate=0` samples none
    of its own, and a caller's context is traced whatever its sampled flag (so the gateway
    sends one only for a request it traces). `TIMESTAMPS` is the level that makes spans."""
    if url is None:
        return []
    return [
        "--trace-config=mode=opentelemetry",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=0",
        f"--trace-config=opentelemetry,url={url}",
        f"--trace-config=opentelemetry,resource=service.name={service}",
    ]


def libpython_problem() -> str | None:
    """Why the Python backend stub cannot load this interpreter's libpython; None if it can.

    The stub links `libpython3.X.so.1.0`. It is looked for next to this interpreter
    (its LIBDIR, which `_server_env` puts first), then where the dynamic loader looks.
    On Debian the system interpreter's copy comes in the `libpython3.X` package, which a
    bare `python3.X` does not pull in.
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    soname = f"libpython{version}.so.1.0"
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir and (Path(libdir) / soname).exists():
        return None
    if ctypes.util.find_library(f"python{version}") is not None:
        return None
    return (
        f"{soname} not found (in {libdir} or the loader's path): tritonserver's Python "
        f"backend needs it; install it: apt-get install libpython{version}"
    )


def _server_env() -> dict[str, str]:
    env = dict(os.environ)
    # The stub links libpython: this interpreter's copy must win over an older system
    # one, and `python` on PATH must be this venv's so that the stub finds numpy.
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(libdir), env.get("LD_LIBRARY_PATH", "")) if p
        )
    env["PATH"] = os.pathsep.join(
        p for p in (os.path.dirname(sys.executable), env.get("PATH", "")) if p
    )
    return env


def _ensure_port_free(port: int) -> None:
    # Fail early: otherwise another server on the port could answer our readiness polls.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise TritonSimError(f"port {port} on {HOST} is in use") from exc


def _is_ok(url: str) -> bool:
    try:
        with _HTTP.open(url, timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait_exit(pid: int, timeout: float | None) -> None:
    """Wait until our child `pid` has exited, without reaping it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while deadline is None or time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return
        except ChildProcessError:
            return  # already reaped
        time.sleep(0.05)


def processes_mentioning(marker: str) -> list[int]:
    """Live processes whose command line contains `marker` (zombies have none)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue  # it exited while we looked
    return [pid for pid in pids if pid != os.getpid()]


def _kill_all(pids: list[int], timeout: float) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = [pid for pid in pids if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())  # empty for a zombie
    except OSError:
        return False


def run_triton_sim(port: int, models: str, trace_url: str | None = None) -> int:
    """Serve `models` until SIGINT or SIGTERM (the `gateway triton-sim` command).

    Prints one line when ready; returns the process exit code. Must run in the main
    thread (it installs signal handlers).
    """
    stop_requested = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    # Installed explicitly: a shell starting us with `&` sets SIGINT to "ignore".
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            sim = TritonSim(port, models, trace_url)
        except ValueError as exc:
            print(f"triton-sim: {exc}", file=sys.stderr)
            return 2
        try:
            sim.start()
            sim.wait_ready(timeout=30.0 + 10.0 * len(sim.profiles), cancel=stop_requested)
            print(
                f"triton-sim ready: models={','.join(sim.model_names)} http={sim.http_url} "
                f"grpc={sim.grpc_target} metrics={sim.metrics_url}",
                flush=True,
            )
            while not stop_requested.wait(0.5):
                code = sim.poll()
                if code is not None:
                    tail = sim.log_tail()
                    print(
                        f"triton-sim: tritonserver exited with code {code}\n{tail}", file=sys.stderr
                    )
                    return 1
            return 0
        except (RuntimeError, OSError) as exc:  # TritonSimError, or a broken install
            if stop_requested.is_set():
                return 0
            print(f"triton-sim: {exc}", file=sys.stderr)
            return 1
        finally:
            sim.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
