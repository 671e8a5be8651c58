"""Script calls made at the same moment go to Redis together: one round trip for many.

Each request admitted by the limiter costs one script call (take.lua), and each settle
another (adjust.lua). Sent one by one, every call pays redis-py's per-command work and a
round trip of its own, which is most of what the limiter costs a gateway worker. The
coalescer queues the calls and sends them as one pipeline:

* an urgent call (an admission, which a request waits for) made while no urgent round
  trip is in flight goes out at the next turn of the event loop, with every call queued
  by then: a lone request waits for no one, not even for a settle in flight;
* urgent calls made while an urgent round trip is in flight wait for it, then go out
  together (group commit);
* other calls (charges and settles, off the critical path) ride along with the next
  round trip, or go out on their own when nothing is in flight.

Under load many requests share a round trip, and the decisions stay exact: every call
still runs its script whole in Redis, in the order the calls were made.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

# Told the number of calls and the seconds of each round trip.
RoundTripObserver = Callable[[int, float], None]


@dataclass(slots=True)
class _Call:
    script: AsyncScript
    keys: Sequence[str]
    args: Sequence[Any]
    reply: asyncio.Future[Any]


class ScriptCoalescer:
    """Sends the script calls of one moment to one Redis server in one pipeline."""

    def __init__(self, redis: Redis, observe: RoundTripObserver | None = None) -> None:
        self._redis = redis
        self._observe = observe
        self._queue: list[_Call] = []
        # The task sending urgent calls, and the one sending the rest when nothing urgent
        # is going on. Either sends whatever is queued.
        self._urgent: asyncio.Task[None] | None = None
        self._background: asyncio.Task[None] | None = None

    def call(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any], urgent: bool = True
    ) -> asyncio.Future[Any]:
        """Queue one call of `script`; the future gets its reply or its error."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Call(script, keys, args, reply))
        # A new task first runs at the next turn of the loop: calls made until then join.
        if urgent:
            if self._urgent is None:
                self._urgent = asyncio.create_task(self._send_all(urgent=True))
        elif self._urgent is None and self._background is None:
            self._background = asyncio.create_task(self._send_all(urgent=False))
        return reply

    async def _send_all(self, urgent: bool) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._send(batch)
        finally:
            if urgent:
                self._urgent = None
            else:
                self._background = None

    async def _send(self, batch: list[_Call]) -> None:
        started = time.perf_counter()
        try:
            replies = await self._execute(batch)
        except BaseException as exc:
            # The connection failed: so did every call in the batch.
            for call in batch:
                if not call.reply.done():
                    call.reply.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if self._observe is not None:
            self._observe(len(batch), time.perf_counter() - started)
        for call, reply in zip(batch, replies, strict=True):
            if call.reply.done():  # its caller gave up waiting
                continue
            if isinstance(reply, Exception):
                call.reply.set_exception(reply)
            else:
                call.reply.set_result(reply)

    async def _execute(self, batch: Sequence[_Call]) -> list[Any]:
        if len(batch) == 1:
            # Alone: a plain EVALSHA costs less than a pipeline of one.
            call = batch[0]
            try:
                return [await self._evalsha(call)]
            except NoScriptError:
                await self._redis.script_load(call.script.script)
                return [await self._evalsha(call)]
        replies = await self._pipeline(batch)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            # Redis lost its scripts (a restart, a failover, SCRIPT FLUSH): load them and
            # send again the calls that found them missing.
            for script in {batch[i].script for i in missing}:
                await self._redis.script_load(script.script)
            again = await self._pipeline([batch[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _evalsha(self, call: _Call) -> Any:
        return await self._redis.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)

    async def _pipeline(self, batch: Sequence[_Call]) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for call in batch:
            pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        return list(await pipe.execute(raise_on_error=False))

    async def close(self) -> None:
        """Wait for the calls already queued to be sent."""
        for sender in (self._urgent, self._background):
            if sender is not None:
                await asyncio.shield(sender)
