"""A key of its own for each run of a coding tool, and the gateway's records of its calls.

`gateway eval run --tool` attributes every request a tool makes through the gateway's
own records, not the tool's: each (tool, model, task, attempt) run gets a managed key of
its own (`POST /admin/keys`, for the run's tenant, its models the one model, expiring
soon after the run's time limit) and the key is revoked when the run ends. Every request
the tool made is then in the usage ledger under that key's id, read back with
`GET /admin/usage/requests` (docs/operations.md): its endpoint, the model that served
it, tokens (cached ones too), cost, status, latency, a stream's time to its first token
and the fallback taken. Both calls go to the gateway's ops listener (or its API port,
where admin routes are served there) with an admin tenant's key.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

# Records are written off the request path in batches: a run's are all in once the
# count has not moved for this long (more than the ledger's default flush interval).
SETTLED_S = 2.5
SETTLE_TIMEOUT_S = 30.0
_PAGE = 1000
_TIMEOUT = aiohttp.ClientTimeout(total=15)


class AdminError(Exception):
    """The admin API refused or could not be reached; the message says which and why."""


@dataclass(frozen=True, slots=True)
class RunKey:
    """A run's key: its id (the ledger's `key_id`) and the key itself (for the tool)."""

    id: str
    secret: str


@dataclass(frozen=True, slots=True)
class Admin:
    """The gateway's admin API at `url` (the ops listener's root), with an admin's key."""

    session: aiohttp.ClientSession
    url: str
    key: str

    async def check(self) -> None:
        """Refuse a run that could not attribute its calls: the key is not an admin's,
        or the gateway keeps no usage ledger."""
        await self._call("GET", "/admin/usage/requests", params={"key": "-", "limit": "1"})

    async def create_key(
        self,
        tenant: str,
        name: str,
        model: str,
        expires_in_s: float,
        requests_per_minute: int | None = None,
    ) -> RunKey:
        """A key of `tenant` for `model` alone, expiring `expires_in_s` from now, capped
        at `requests_per_minute` of its own (None: its tenant's limits alone)."""
        body: dict[str, Any] = {
            "tenant": tenant,
            "name": name,
            "models": [model],
            "expires_at": time.time() + expires_in_s,
        }
        if requests_per_minute is not None:
            body["limits"] = {"requests_per_minute": requests_per_minute}
        data = await self._call("POST", "/admin/keys", json=body)
        return RunKey(str(data["id"]), str(data["key"]))

    async def revoke(self, key_id: str) -> None:
        """The key is refused from now on (a tool left running can spend nothing)."""
        await self._call("DELETE", f"/admin/keys/{key_id}")

    async def requests(self, key_id: str, since: float) -> list[dict[str, Any]]:
        """Every record of `key_id` from `since` (unix seconds), oldest first."""
        found: dict[str, dict[str, Any]] = {}
        while True:
            params = {"key": key_id, "since": _iso(since), "limit": str(_PAGE)}
            page = (await self._call("GET", "/admin/usage/requests", params=params))["data"]
            fresh = [record for record in page if record["request_id"] not in found]
            found.update((record["request_id"], record) for record in page)
            if len(page) < _PAGE or not fresh:
                return sorted(found.values(), key=lambda r: (r["ts"], r["request_id"]))
            since = page[-1]["ts"]

    async def settled_requests(self, key_id: str, since: float) -> list[dict[str, Any]]:
        """`requests`, once the ledger has written them all: the count has stopped moving
        for `SETTLED_S` (up to `SETTLE_TIMEOUT_S`)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        records = await self.requests(key_id, since)
        stable_since = time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            again = await self.requests(key_id, since)
            if len(again) != len(records):
                records, stable_since = again, time.monotonic()
            elif time.monotonic() - stable_since >= SETTLED_S:
                break
        return records

    async def _call(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        url = self.url.rstrip("/") + path
        headers = {"Authorization": f"Bearer {self.key}"}
        try:
            async with self.session.request(
                method, url, headers=headers, timeout=_TIMEOUT, **options
            ) as response:
                body: Any = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise AdminError(f"the admin API at {self.url} did not answer: {exc}") from None
        if response.status >= 400:
            message = body.get("error", {}).get("message") if isinstance(body, dict) else None
            raise AdminError(f"{method} {path}: {response.status}: {message or body}")
        if not isinstance(body, dict):
            raise AdminError(f"{method} {path}: not a JSON object")
        return body


def _iso(ts: float) -> str:
    """Unix seconds as the ISO 8601 time the admin API's `since` takes (microseconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e6):06d}Z"
