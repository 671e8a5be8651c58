"""`gateway eval run`: every candidate at every task, `attempts` times, judged and recorded.

An attempt: the task through the template (sanitized first if the endpoint is external),
the answer streamed from the endpoint, applied to a fresh copy of the snapshot, and the
hidden tests run on it in the sandbox. Attempts run concurrently up to `concurrency`;
each is appended to `attempts.jsonl` as it finishes, so an interrupted run loses only
the attempts in flight, and running the same command again resumes it.

Nothing an attempt meets ends the run: a malformed task, an endpoint that refuses, an
answer that does not apply, a solution that loops or forks: each is a failed attempt
with its reason.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from gateway_tools.eval import judge, manifest, records, sandbox
from gateway_tools.eval.answers import AnswerError, apply, parse_answer
from gateway_tools.eval.client import Endpoint, Reply, Sampling, ask
from gateway_tools.eval.pricing import Prices
from gateway_tools.eval.prompt_template import Template
from gateway_tools.eval.records import Attempt
from gateway_tools.eval.run_keys import Admin, AdminError
from gateway_tools.eval.sanitizing import THROUGH_GATEWAY, Blocked, Sanitizer
from gateway_tools.eval.suite import Suite, Task
from gateway_tools.eval.tool_runner import (
    ToolSettings,
    candidate_name,
    tool_attempt,
    tool_config_record,
    tool_versions,
)

# Tests of one attempt: generous for a small project, short enough for a loop to cost little.
TEST_LIMITS = sandbox.Limits(wall_s=60.0)


class RunRefused(Exception):
    """The run cannot start: the output directory holds a run these settings cannot
    resume, or this machine has no sandbox to run the hidden tests in."""


@dataclass(frozen=True, slots=True)
class RunSettings:
    """Everything `gateway eval run` was asked to do."""

    endpoint: Endpoint
    candidates: tuple[str, ...]
    suite: Suite
    template: Template
    tasks: tuple[str, ...] = ()  # a selection of the suite's tasks; empty: all of them
    sampling: Sampling = field(default_factory=Sampling)
    attempts: int = 1
    concurrency: int = 1
    limits: sandbox.Limits = TEST_LIMITS
    prices: Prices = field(default_factory=Prices)
    sanitizer: Sanitizer | None = None  # set for an external endpoint
    # With `--tool`: each candidate model is run by each tool, attributed through the
    # gateway's admin API (`tool_runner.py`); None: the models are asked directly.
    tools: ToolSettings | None = None
    admin: tuple[str, str] | None = None  # the admin API's URL and an admin's key


def pairs(settings: RunSettings) -> dict[str, tuple[str | None, str]]:
    """Each candidate's name in the records, and its (tool, model): the models alone,
    or every tool on every model."""
    if settings.tools is None:
        return {model: (None, model) for model in settings.candidates}
    return {
        candidate_name(tool, model): (tool, model)
        for tool in settings.tools.tools
        for model in settings.candidates
    }


class Progress:
    """One line per finished attempt on a text stream: how far, how long, how many passed."""

    def __init__(self, total: int, earlier: list[Attempt], out: TextIO = sys.stderr) -> None:
        self.total, self.done, self._out = total, len(earlier), out
        self._passed = sum(attempt.passed for attempt in earlier)
        self._started = time.monotonic()

    def attempt(self, attempt: Attempt) -> None:
        self.done += 1
        self._passed += attempt.passed
        verdict = "pass" if attempt.passed else f"FAIL {attempt.reason}"
        elapsed = time.monotonic() - self._started
        print(
            f"[{self.done}/{self.total} {elapsed:6.1f}s, {self._passed} passed] "
            f"{attempt.candidate} {attempt.task} #{attempt.attempt}: {verdict}",
            file=self._out,
            flush=True,
        )


async def run(settings: RunSettings, out: Path, progress_out: TextIO = sys.stderr) -> list[Attempt]:
    """Run (or resume) the evaluation into `out`; every attempt recorded there is returned."""
    # Before any request: answers that cannot be judged are not worth asking for, and
    # they are never run unsandboxed.
    problem = await asyncio.to_thread(sandbox.unavailable)
    if problem is not None:
        raise RunRefused(problem)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, before any request)
    # Requests in flight are bounded by the run's concurrency; sandboxed tests, which
    # use this machine and not the endpoint, by its cores.
    limits = _Limits(asyncio.Semaphore(settings.concurrency), asyncio.Semaphore(_cores()))
    async with aiohttp.ClientSession() as session:
        admin, versions = await _tools_ready(session, settings)
        models = {
            name: await _describe(session, settings.endpoint, name, admin, settings.tools)
            for name in settings.candidates
        }
        candidates = {
            name: models[model] if tool is None else {
                "tool": tool, "tool_version": versions.get(tool), "model": model,
                "tool_config": tool_config_record(tool, model), **models[model],
            }
            for name, (tool, model) in pairs(settings).items()
        }  # fmt: skip
        record = _manifest(settings, candidates, out)
        # A resumed run keeps the verdicts its manifest recorded on the same task digests.
        verified = {
            task_id: entry["problem"]
            for task_id, entry in record["suite"]["tasks"].items()
            if entry.get("verified")
        }
        verified.update(await _verify(settings, limits.sandbox, skip=verified.keys()))
        record = manifest.with_verified(record, verified)
        records.write_manifest(out, record)
        earlier = records.read_attempts(out)
        done = {attempt.key for attempt in earlier}
        jobs = [
            (candidate, task, index)
            for candidate in pairs(settings)
            for task in selected(settings)
            for index in range(settings.attempts)
            if (candidate, task.id, index) not in done
        ]
        progress = Progress(len(jobs) + len(done), earlier, progress_out)
        log = records.AttemptLog(out)

        async def one(candidate: str, task: Task, index: int) -> None:
            tool, model = pairs(settings)[candidate]
            if tool is None or verified[task.id] is not None:
                attempt = await _attempt(
                    session, settings, limits, candidate, task, index, verified[task.id]
                )
            else:
                assert settings.tools is not None and admin is not None
                async with limits.requests:
                    attempt = await tool_attempt(
                        admin, settings.endpoint.base_url, settings.tools, settings.prices,
                        settings.limits, versions.get(tool), tool, model, task, index,
                    )  # fmt: skip
            log.append(attempt)
            progress.attempt(attempt)

        await asyncio.gather(*(one(*job) for job in jobs))
    records.write_manifest(out, manifest.finished(record))
    return records.read_attempts(out)


async def _tools_ready(
    session: aiohttp.ClientSession, settings: RunSettings
) -> tuple[Admin | None, dict[str, str | None]]:
    """For a run of tools: the admin API, checked (RunRefused when it cannot attribute
    the runs' calls), and each tool's version (None: not installed)."""
    if settings.tools is None:
        return None, {}
    if settings.admin is None:
        raise RunRefused("a run of tools needs the gateway's admin API (--admin-url, --admin-key)")
    admin = Admin(session, *settings.admin)
    try:
        await admin.check()
    except AdminError as exc:
        raise RunRefused(f"the runs' calls cannot be attributed: {exc}") from None
    return admin, await asyncio.to_thread(tool_versions, settings.tools)


def _manifest(
    settings: RunSettings, candidates: dict[str, dict[str, Any]], out: Path
) -> dict[str, Any]:
    """The run's manifest: new, or the earlier one of the run this resumes (RunRefused
    when the earlier run's settings are not these)."""
    fresh = manifest.build(
        suite=settings.suite,
        template={
            "name": settings.template.name,
            "version": settings.template.version,
            "digest": settings.template.digest,
        },
        settings=settings_record(settings),
        candidates=candidates,
        prices=settings.prices.describe(),
        outbound=settings.sanitizer.describe() if settings.sanitizer else THROUGH_GATEWAY,
    )
    if not (out / records.MANIFEST_FILE).exists():
        return fresh
    earlier = records.read_manifest(out)
    problems = manifest.differences(earlier, fresh)
    missing = sorted(set(fresh["candidates"]) ^ set(earlier.get("candidates", {})))
    problems += [f"candidate {name}: not in both runs" for name in missing]
    problems += manifest.tool_version_differences(earlier, fresh)
    if earlier.get("prices") != fresh["prices"]:
        problems.append("prices: not the prices the run began with")
    if problems:
        raise RunRefused(
            f"{out} holds a run with other settings; it cannot be resumed with these "
            "(use another --out):\n  " + "\n  ".join(problems)
        )
    return manifest.resumed(earlier)


def selected(settings: RunSettings) -> tuple[Task, ...]:
    """The tasks the run is asked to run."""
    if not settings.tasks:
        return settings.suite.tasks
    return tuple(task for task in settings.suite.tasks if task.id in settings.tasks)


def settings_record(settings: RunSettings) -> dict[str, Any]:
    """The settings that make two runs comparable, as the manifest records them."""
    tools = settings.tools
    modes = (
        {}
        if tools is None
        else {
            "tool_sandbox": tools.limits,
            "tool_tenant": tools.tenant,
            "tool_run_requests_per_minute": tools.requests_per_minute,
        }
    )
    return manifest.settings_of(
        **modes,
        tasks=sorted(settings.tasks) or "all",
        sampling=settings.sampling,
        attempts=settings.attempts,
        api=settings.endpoint.api,
        max_retries=settings.endpoint.max_retries,
        concurrency=settings.concurrency,
        sandbox=settings.limits,
    )


@dataclass(frozen=True, slots=True)
class _Limits:
    requests: asyncio.Semaphore  # to the endpoint, at once
    sandbox: asyncio.Semaphore  # sandboxed test runs, at once


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


async def _verify(
    settings: RunSettings, limit: asyncio.Semaphore, skip: Collection[str]
) -> dict[str, str | None]:
    """Each selected task's problem (None for a task that can judge answers), checked in
    the sandbox; tasks in `skip` are left out."""

    async def check(task: Task) -> tuple[str, str | None]:
        async with limit:
            return task.id, await asyncio.to_thread(judge.verify, task, settings.limits)

    tasks = [task for task in selected(settings) if task.id not in skip]
    return dict(await asyncio.gather(*(check(task) for task in tasks)))


async def _describe(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    model: str,
    admin: Admin | None = None,
    tools: ToolSettings | None = None,
) -> dict[str, Any]:
    """What the endpoint says of a model (`GET /models/{model}`): this gateway adds its
    config version for the model. Empty when the endpoint says nothing. A run of tools
    asks with a short-lived key of the tools' tenant, as its runs will."""
    if admin is None or tools is None:
        return await _described(session, endpoint.base_url, endpoint.key, model)
    try:
        key = await admin.create_key(tools.tenant, "gateway eval: model check", model, 120.0)
    except AdminError as exc:
        # Before anything is written: every attempt would need such a key.
        raise RunRefused(
            f"the tools' tenant {tools.tenant!r} cannot have a key for {model}: {exc}"
        ) from None
    try:
        return await _described(session, endpoint.base_url, key.secret, model)
    finally:
        await admin.revoke(key.id)


async def _described(
    session: aiohttp.ClientSession, base_url: str, key: str, model: str
) -> dict[str, Any]:
    url = f"{base_url.rstrip('/')}/models/{model}"
    try:
        async with session.get(url, headers={"Authorization": f"Bearer {key}"},
                               timeout=aiohttp.ClientTimeout(total=10)) as response:  # fmt: skip
            if response.status != 200:
                return {"listed": False, "status": response.status}
            body = await response.json()
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return {"listed": False}
    keep = ("owned_by", "config_version")
    return {"listed": True, **{k: body[k] for k in keep if isinstance(body, dict) and k in body}}


async def _attempt(
    session: aiohttp.ClientSession,
    settings: RunSettings,
    limits: _Limits,
    candidate: str,
    task: Task,
    index: int,
    problem: str | None,
) -> Attempt:
    attempt = Attempt(
        candidate=candidate, task=task.id, attempt=index, category=task.category, passed=False
    )
    if problem is not None:
        attempt.reason = f"task: {problem}"
        return attempt
    messages = settings.template.messages(task)
    if settings.sanitizer is not None:
        try:
            messages, _ = settings.sanitizer.apply(messages)
        except Blocked as exc:
            attempt.reason = f"blocked: the task holds {', '.join(exc.categories)}"
            return attempt
    attempt.seed = settings.sampling.seed + index
    async with limits.requests:
        reply = await ask(
            session, settings.endpoint, candidate, messages, settings.sampling, attempt.seed
        )
    _take_reply(attempt, reply, settings.prices.cost(candidate, reply.tokens_in, reply.tokens_out))
    if not reply.ok:
        attempt.reason = f"upstream: {reply.error}"
        return attempt
    async with limits.sandbox:
        await asyncio.to_thread(judge_answer, attempt, task, reply.text, settings.limits)
    return attempt


def _take_reply(attempt: Attempt, reply: Reply, cost: float | None) -> None:
    attempt.ttft_s, attempt.total_s = reply.ttft_s, reply.total_s
    attempt.tokens_in, attempt.tokens_out = reply.tokens_in, reply.tokens_out
    attempt.cost, attempt.requests = cost, reply.requests
    attempt.error, attempt.fallback = reply.error, reply.fallback


def judge_answer(attempt: Attempt, task: Task, answer: str, limits: sandbox.Limits) -> None:
    """Apply the answer to a fresh snapshot and run the hidden tests (in a thread)."""
    try:
        change = parse_answer(answer)
    except AnswerError as exc:
        attempt.reason = f"answer: {exc}"
        return
    attempt.answer_form, attempt.files_touched = change.form, change.paths
    attempt.expected_files_touched = sorted(change.paths) == sorted(task.expected_files)
    with judge.working_copy(task) as project:
        try:
            apply(change, project)
        except AnswerError as exc:
            attempt.reason = f"answer: {exc}"
            return
        except OSError as exc:
            attempt.reason = f"answer: cannot write it: {exc.strerror}"
            return
        verdict = judge.judge_project(task, project, limits)
    attempt.passed, attempt.reason = verdict.passed, verdict.reason
    attempt.tests_passed, attempt.tests_failed = verdict.tests_passed, verdict.tests_failed
    attempt.tests_s = verdict.duration_s
