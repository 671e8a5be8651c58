"""Live reload of the tenants file: on change (file watch), on SIGHUP, or by the admin API.

An invalid file is refused with its `file:line: message` problems and the running
tenants stay. Each applied reload logs what changed, tenant by tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from watchfiles import awatch

from gateway.config import ConfigError, TenantsConfig, load_tenants
from gateway.observability import metrics
from gateway.observability.logging import redact
from gateway.serving.runtime import Runtime

log = logging.getLogger("gateway.reload")


@dataclass
class ReloadResult:
    applied: bool
    problems: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)


def tenant_changes(old: TenantsConfig, new: TenantsConfig) -> list[str]:
    """What changed, one line per tenant and setting; key hashes are only counted."""
    changes = []
    for name in sorted(old.tenants.keys() | new.tenants.keys()):
        before, after = old.tenants.get(name), new.tenants.get(name)
        if before is None:
            changes.append(f"tenant {name}: added")
        elif after is None:
            changes.append(f"tenant {name}: removed")
        else:
            changes += [
                f"tenant {name}: {path} {was} -> {now}"
                for path, was, now in _diff(
                    _describe(before.model_dump()), _describe(after.model_dump())
                )
            ]
    return changes


def _describe(tenant: dict[str, Any]) -> dict[str, Any]:
    keys = tenant.pop("api_keys")
    flat = _flatten(tenant)
    flat["api_keys"] = f"{len(keys)} key(s) {sorted(keys)!r}"  # hashes, never keys
    return flat


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _diff(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [
        (path, old.get(path), new.get(path))
        for path in sorted(old.keys() | new.keys())
        if old.get(path) != new.get(path)
    ]


class TenantsReloader:
    """Reloads the tenants file into a running gateway."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._path = os.path.abspath(runtime.config.tenants_path)
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def reload(self, reason: str) -> ReloadResult:
        """Load, validate and apply the tenants file; keep the running tenants if invalid."""
        async with self._lock:
            try:
                tenants = await asyncio.to_thread(
                    load_tenants,
                    self._path,
                    set(self._runtime.routes),
                    self._runtime.config.gateway.admission.classes,
                    set(self._runtime.config.gateway.mcp.servers),
                )
            except Exception as exc:
                # Anything else is a bug in the loader, but the running tenants still stay
                # and the watcher lives on.
                if isinstance(exc, ConfigError):
                    found = [str(p) for p in exc.problems]
                else:
                    found = [f"{self._path}: cannot be loaded ({type(exc).__name__}: {exc})"]
                # Redacted: the admin endpoint returns them, and a problem may quote a
                # line holding a secret (a plain key where a hash belongs).
                problems = [redact(p) for p in found]
                metrics.CONFIG_RELOADS.labels("rejected").inc()
                log.error(
                    "reload (%s) refused, the running tenants stay:\n  %s",
                    reason,
                    "\n  ".join(problems),
                    extra={"fields": {"event": "config_reload", "result": "rejected",
                                      "trigger": reason, "problems": problems}},
                )  # fmt: skip
                return ReloadResult(applied=False, problems=problems)
            changes = tenant_changes(self._runtime.config.tenants, tenants)
            if not changes:
                metrics.CONFIG_RELOADS.labels("unchanged").inc()
                return ReloadResult(applied=True)
            self._runtime.apply_tenants(tenants)
            metrics.CONFIG_RELOADS.labels("applied").inc()
            log.warning(
                "reload (%s) applied:\n  %s",
                reason,
                "\n  ".join(changes),
                extra={"fields": {"event": "config_reload", "result": "applied",
                                  "trigger": reason, "changes": changes,
                                  "version": self._runtime.config_version}},
            )  # fmt: skip
            return ReloadResult(applied=True, changes=changes)

    async def _watch(self) -> None:
        # Watch the directory: editors and Kubernetes replace the file rather than write it.
        directory, name = os.path.split(self._path)
        while True:
            try:
                async for changes in awatch(directory, debounce=200, step=50, recursive=False):
                    # `..data` is the symlink a Kubernetes ConfigMap swaps on update.
                    if any(os.path.basename(path) in (name, "..data") for _, path in changes):
                        await self.reload("file changed")
            except Exception:  # e.g. the directory went away for a moment
                log.exception("watching %s failed; watching again in 1 s", directory)
            await asyncio.sleep(1.0)

    def start(self) -> None:
        """Begin watching the file (unless configured off) and listening for SIGHUP."""
        if self._runtime.config.gateway.server.watch_tenants_file:
            self._track(asyncio.create_task(self._watch()))
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
        except (NotImplementedError, RuntimeError):
            log.info("SIGHUP reload is not available here")

    def _on_sighup(self) -> None:
        self._track(asyncio.create_task(self.reload("SIGHUP")))

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
