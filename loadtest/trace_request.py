"""One chat request traced through the gateway's own code: which modules and packages it
runs, and how often control enters each package (a call into it, or a return to it).

    .venv/bin/python -m loadtest.trace_request [--stream] [--baseline DIR]

The app is built in process as `loadtest.app_cost` builds it (bench-config, a backend
that answers at once, a redis-server of its own), warmed with 50 requests, then one
request is traced with `sys.setprofile`: every call and return of a Python function
(coroutines' resumptions and suspensions included) whose file is in one of the
programs' packages. An entry into a package is a move of the innermost gateway frame
from a module of another package into one of it; "climbs back" counts the entries made
by a return. `--baseline DIR` traces another source tree's app the same way (a child
process with that tree on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ("gateway", "gateway_control", "gateway_tools")


def _module_of(filename: str, tree: Path) -> str | None:
    """`gateway.serving.conductor` for a file of one of the programs, else None."""
    try:
        relative = Path(filename).resolve().relative_to(tree)
    except ValueError:
        return None
    if relative.parts[0] not in PROGRAMS:
        return None
    parts = relative.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(module: str) -> str:
    """`gateway.serving.conductor` -> `serving`; `gateway.app` -> `app`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


async def _trace(tree: Path, stream: bool) -> dict[str, Any]:
    from loadtest.app_cost import BODY, STREAM_BODY, _app, _lifespan, _one
    from loadtest.child_rounds import own_redis

    with own_redis() as redis_url:
        app = _app(redis_url)
        await _lifespan(app)
        body = STREAM_BODY if stream else BODY
        for _ in range(50):
            await _one(app, body)
        stack: list[str | None] = []
        entries: Counter[str] = Counter()
        climbs: Counter[str] = Counter()
        modules: set[str] = set()
        where: list[str | None] = [None]
        cache: dict[str, str | None] = {}

        def innermost() -> str | None:
            for module in reversed(stack):
                if module is not None:
                    return module
            return None

        def profile(frame: FrameType, event: str, arg: object) -> None:
            if event not in ("call", "return"):
                return
            filename = frame.f_code.co_filename
            module = cache.get(filename, "?")
            if module == "?":
                module = cache[filename] = _module_of(filename, tree)
            if event == "call":
                stack.append(module)
            elif stack:
                stack.pop()
            now = innermost()
            if now is None:
                return
            modules.add(now)
            before = where[0]
            if before is None or _package_of(before) != _package_of(now):
                entries[_package_of(now)] += 1
                if event == "return":
                    climbs[_package_of(now)] += 1
            where[0] = now

        sys.setprofile(profile)
        try:
            status = await _one(app, body)
        finally:
            sys.setprofile(None)
    if status != 200:
        raise SystemExit(f"the traced request was answered {status}")
    return {
        "modules": sorted(modules),
        "packages": sorted({_package_of(m) for m in modules}),
        "entries": dict(entries.most_common()),
        "climbs": dict(climbs.most_common()),
    }


def _report(name: str, found: dict[str, Any]) -> None:
    entries, climbs = found["entries"], found["climbs"]
    print(f"{name}: {len(found['modules'])} modules, {len(found['packages'])} packages")
    print("  entries (of them by a return):")
    for package, count in entries.items():
        print(f"    {package:14} {count:3} ({climbs.get(package, 0)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", action="store_true", help="a streamed chat")
    parser.add_argument("--baseline", type=Path, help="another source tree, traced too")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--modules", action="store_true", help="list the modules too")
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(asyncio.run(_trace(args.child, args.stream))))
        return
    trees = {"this tree": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    for name, tree in trees.items():
        command = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree)]
        command += ["--stream"] if args.stream else []
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
        found = json.loads(subprocess.run(command, env=env, capture_output=True, check=True,
                                          text=True).stdout)  # fmt: skip
        _report(name, found)
        if args.modules:
            print("  " + "\n  ".join(found["modules"]))


if __name__ == "__main__":
    main()
