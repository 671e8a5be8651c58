"""The managed keys a gateway knows, in memory: the request path looks a key up in a dict,
never in Redis.

Every `interval_s` (0.25 s) the directory reads the store's version counter (one GET);
when it moved, it loads every record again. A create or a revoke on any gateway is so
honoured on every gateway within a second, with no restart and no reload.

A key the directory does not know may be one made an instant ago on another gateway:
`refresh` looks again at once, but only one look is ever in flight, shared by every
caller that asks meanwhile (and by the poll), so a flood of bad keys costs Redis at most
one GET at a time. When Redis cannot be reached the directory keeps the keys it last
loaded (and says so once in the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.apikeys.key_store import KeyStore
from gateway.apikeys.managed_key import ManagedKey
from gateway.storage.redis_client import REDIS_ERRORS

log = logging.getLogger("gateway.keys")

POLL_INTERVAL_S = 0.25


class KeyDirectory:
    """The managed keys by their hex digest, kept up to date from a `KeyStore`."""

    def __init__(self, store: KeyStore, interval_s: float = POLL_INTERVAL_S) -> None:
        self._store = store
        self._interval_s = interval_s
        self._by_digest: dict[str, ManagedKey] = {}
        self._version: int | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._unreachable = False
        # Seen by tests: Redis looks made (version reads) and loads of every record.
        self.lookups = 0
        self.loads = 0

    def lookup(self, digest: str) -> ManagedKey | None:
        """The key with this hex digest, revoked and expired ones included."""
        return self._by_digest.get(digest)

    def by_id(self, key_id: str) -> ManagedKey | None:
        """The managed key `key_id` (revoked and expired ones too; None: unknown)."""
        for key in self._by_digest.values():
            if key.id == key_id:
                return key
        return None

    def __len__(self) -> int:
        return len(self._by_digest)

    @property
    def version(self) -> int | None:
        """The store version the keys were loaded at (None: never loaded)."""
        return self._version

    async def refresh(self) -> None:
        """Load the keys again if the store changed; callers meanwhile share one look."""
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.create_task(self._refresh())
        # Shielded: a caller that gives up (its client left) does not cancel the others'.
        await asyncio.shield(task)

    async def refresh_from_now(self) -> None:
        """Load what the store holds now: a look already in flight may have read before
        a change just made (here, or on another gateway an instant ago), so one more
        starts after it; callers meanwhile share it, as they share `refresh`'s."""
        task = self._refreshing
        if task is not None and not task.done():
            await asyncio.shield(task)
        await self.refresh()

    async def _refresh(self) -> None:
        self.lookups += 1
        try:
            version = await self._store.version()
            if version != self._version:
                version, keys = await self._store.load()
                self.loads += 1
                self._by_digest = {key.digest: key for key in keys.values()}
                self._version = version
        except REDIS_ERRORS as exc:
            if not self._unreachable:
                self._unreachable = True
                log.warning(
                    "managed keys: Redis unreachable (%s); the %d keys loaded last stay",
                    type(exc).__name__,
                    len(self._by_digest),
                    extra={"fields": {"event": "keys_unreachable"}},
                )
            return
        except (ValueError, KeyError, TypeError) as exc:  # a record no gateway wrote
            log.error("managed keys: a stored record cannot be read (%s)", exc)
            return
        if self._unreachable:
            self._unreachable = False
            log.warning("managed keys: Redis reachable again, %d keys", len(self._by_digest))

    async def start(self) -> None:
        """Load the keys (or keep none if Redis is down), then poll."""
        await self.refresh()
        self._poller = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.refresh()
            except Exception:  # a bug: log it, keep polling
                log.exception("managed keys: refresh failed")

    async def stop(self) -> None:
        for task in (self._poller, self._refreshing):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._poller = None
