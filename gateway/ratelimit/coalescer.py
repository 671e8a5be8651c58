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
  round trip that starts within `background_delay_s`, or go out on their own then.

Under load many requests share a round trip; even one client alone costs one round
trip a request, its settle riding with its next admission. The decisions stay exact:
every call still runs its script whole in Redis, in the order the calls were made. A
settle's refund and lease release reach Redis at most `background_delay_s` later,
which can only make the limits stricter for that moment, never looser.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hiredis import pack_command
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis._parsers.socket import SERVER_CLOSED_CONNECTION_ERROR
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection as Connection
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

# Told the number of calls and the seconds of each round trip.
RoundTripObserver = Callable[[int, float], None]


@dataclass(slots=True)
class _Call:
    script: AsyncScript
    keys: Sequence[str]
    args: Sequence[Any]
    reply: asyncio.Future[Any]
    # The command already packed (a `PackedCall`'s), or None: packed when sent.
    packed: bytes | None = None


def _bulk(value: Any) -> bytes:
    """One argument as `pack_command` packs it (without the command's header)."""
    packed: bytes = pack_command((value,))
    return packed[4:]  # b"*1\r\n"


class PackedCall:
    """An EVALSHA of `sha` whose KEYS and ARGV are the same in every call but for an
    amount (at `amount_at` in ARGV, the same at each place), a second amount (at
    `second_at`: a request's spend beside its tokens) and a member (at `member_at` in
    ARGV, after the amounts): packed once, those places filled in per call. `pack`
    gives exactly the bytes of `pack_command` of the whole command, at a fraction of
    its cost (most arguments of a limiter's call are the same for every request)."""

    def __init__(
        self,
        sha: str,
        keys: Sequence[str],
        args: Sequence[Any],
        amount_at: Sequence[int],
        member_at: int | None = None,
        second_at: Sequence[int] = (),
    ) -> None:
        command = ("EVALSHA", sha, len(keys), *keys, *args)
        bulks = [_bulk(part) for part in command]
        first = 3 + len(keys)
        end = len(bulks) if member_at is None else first + member_at
        cuts = [first + i for i in amount_at]
        seconds = [first + i for i in second_at]
        if (
            cuts != sorted(cuts)
            or seconds != sorted(seconds)
            or (cuts and seconds and seconds[0] < cuts[-1])
            or any(cut >= end for cut in (*cuts, *seconds))
        ):
            raise ValueError("amounts go before the second amounts, both before the member")
        # The parts between the amounts, then between the second amounts: an amount's
        # bytes join them.
        segments: list[bytes] = []
        start = 0
        for cut in (*cuts, *seconds):
            segments.append(b"".join(bulks[start:cut]))
            start = cut + 1
        segments.append(b"".join(bulks[start:end]))
        self._parts = segments[: len(cuts) + 1]
        self._second_parts = [b"", *segments[len(cuts) + 1 :]] if seconds else []
        self._parts[0] = b"*%d\r\n" % len(command) + self._parts[0]
        self._tail = None if member_at is None else b"".join(bulks[end + 1 :])

    def pack(self, amount: int, member: str | None = None, second: int = 0) -> bytes:
        """The command with `amount` (and `second` and `member`, if it has them) in place."""
        # An int and an ASCII string written out here as `pack_command` writes them
        # (cheaper than calling it for one argument); anything else packed by it.
        packed = _joined(amount, self._parts)
        if self._second_parts:
            packed += _joined(second, self._second_parts)
        if self._tail is None:
            return packed
        if type(member) is str and member.isascii():
            return b"%s$%d\r\n%s\r\n%s" % (packed, len(member), member.encode(), self._tail)
        return b"".join((packed, _bulk(member), self._tail))


def _joined(amount: Any, parts: list[bytes]) -> bytes:
    """`parts` joined by the bulk of `amount`."""
    if type(amount) is int:
        digits = b"%d" % amount
        return (b"$%d\r\n%s\r\n" % (len(digits), digits)).join(parts)
    return _bulk(amount).join(parts)


class _Sender:
    """One connection and the one long-lived task that sends on it, woken per batch."""

    __slots__ = ("busy", "connection", "expired", "idle", "started", "task", "wake")

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.task: asyncio.Task[None] | None = None
        # Set to wake the task when it waits for work; None while it works.
        self.wake: asyncio.Future[None] | None = None
        # Sending (or woken to send) the queue: a caller need not wake it.
        self.busy = False
        # The loop time the round trip in flight started at, or None.
        self.started: float | None = None
        # The watchdog cancelled the task for taking too long.
        self.expired = False
        # Set when the task next waits for work (or ends): what close() waits for.
        self.idle: asyncio.Future[None] | None = None


class ScriptCoalescer:
    """Sends the script calls of one moment to one Redis server in one pipeline.

    It keeps two connections of its own, one for each sender, outside redis-py's pool:
    checking a connection out of the pool, the pipeline object and redis-py's per-call
    socket timeouts (each a task of its own) cost more than the round trip itself. One
    timeout (`timeout_s`) covers each round trip instead.

    Where requests arrive staggered, a round trip carries a few calls, so what each one
    costs whatever it carries counts: each sender is one long-lived task woken by a
    future (not a task created per batch), one watchdog timer keeps the timeouts of
    every round trip (not a timer set and cancelled per round trip), and the packed
    calls are written straight to the connection's stream.
    """

    def __init__(
        self,
        redis: Redis,
        observe: RoundTripObserver | None = None,
        background_delay_s: float = 0.002,
        timeout_s: float | None = None,
    ) -> None:
        self._redis = redis
        self._observe = observe
        self._delay_s = background_delay_s
        pool = redis.connection_pool
        self._timeout_s = timeout_s or pool.connection_kwargs.get("socket_timeout") or 5.0
        own = {**pool.connection_kwargs, "socket_timeout": None}
        self._queue: list[_Call] = []
        # The sender of urgent calls, and the one sending the rest when nothing urgent
        # came to take them along. Either sends whatever is queued.
        self._urgent = _Sender(pool.connection_class(**own))
        self._background = _Sender(pool.connection_class(**own))
        self._background_timer: asyncio.TimerHandle | None = None
        # The one timer that times the round trips out, and its loop.
        self._watchdog: asyncio.TimerHandle | None = None
        self._watchdog_loop: asyncio.AbstractEventLoop | None = None

    def call(
        self,
        script: AsyncScript,
        keys: Sequence[str],
        args: Sequence[Any],
        urgent: bool = True,
        packed: bytes | None = None,
    ) -> asyncio.Future[Any]:
        """Queue one call of `script`; the future gets its reply or its error.

        `packed` is the call already packed (by a `PackedCall` of `script`): then it is
        sent as it is, and `keys` and `args` are not read.
        """
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Call(script, keys, args, reply, packed))
        # A woken sender first runs at the next turn of the loop: calls made until then
        # join.
        if urgent:
            if not self._urgent.busy:
                self._start(self._urgent, loop)
        elif self._background_timer is None and not self._background.busy:
            self._background_timer = loop.call_later(self._delay_s, self._send_background)
        return reply

    def _send_background(self) -> None:
        self._background_timer = None
        if self._queue and not self._urgent.busy and not self._background.busy:
            self._start(self._background, asyncio.get_running_loop())

    def _start(self, sender: _Sender, loop: asyncio.AbstractEventLoop) -> None:
        """Have `sender` send the queue from the next turn of the loop."""
        sender.busy = True
        task = sender.task
        if task is None or task.done() or task.get_loop() is not loop:
            # The first batch (or the first on this loop, or after a cancel ended it).
            sender.wake = None
            sender.task = loop.create_task(self._sender(sender))
            return
        wake, sender.wake = sender.wake, None
        assert wake is not None  # not busy: it waits for work
        wake.set_result(None)

    async def _sender(self, sender: _Sender) -> None:
        """Send the queue each time woken, until cancelled."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                while self._queue:
                    batch, self._queue = self._queue, []
                    await self._send(sender, batch)
                self._idle(sender)
                sender.wake = wake = loop.create_future()
                await wake
        finally:
            self._idle(sender)
            sender.wake = None

    @staticmethod
    def _idle(sender: _Sender) -> None:
        sender.busy = False
        idle, sender.idle = sender.idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)

    async def _send(self, sender: _Sender, batch: list[_Call]) -> None:
        started = time.perf_counter()
        # Replies in the order of `batch`; those read before a failure still count:
        # Redis ran those calls.
        replies: list[Any] = []
        try:
            await self._execute(sender, batch, replies)
        except BaseException as exc:
            # The connection failed (or the sender was cancelled): so did every call
            # that has no reply.
            for i, call in enumerate(batch):
                if i < len(replies) and not isinstance(replies[i], NoScriptError):
                    _settle(call, replies[i])
                    continue
                if call.reply.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    call.reply.cancel()
                else:
                    call.reply.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if self._observe is not None:
            self._observe(len(batch), time.perf_counter() - started)
        for call, reply in zip(batch, replies, strict=True):
            _settle(call, reply)

    async def _execute(self, sender: _Sender, batch: Sequence[_Call], replies: list[Any]) -> None:
        try:
            await self._round_trip(sender, batch, replies)
        except TimeoutError:
            # Redis did not answer in time: the batch may still run when it does, so it
            # is not sent again. (TimeoutError is an OSError: this comes first.)
            raise
        except (RedisConnectionError, OSError):
            if replies:
                # Redis answered part of the batch, so it ran those calls: sending them
                # again would take twice. The rest fail with the connection.
                raise
            # A connection Redis closed (a restart, an idle timeout) fails on first use,
            # before any reply: send the batch once more on a new connection.
            await self._round_trip(sender, batch, replies)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            # Redis lost its scripts (a restart, a failover, SCRIPT FLUSH): load them and
            # send again the calls that found them missing.
            for script in {batch[i].script for i in missing}:
                await self._redis.script_load(script.script)
            again: list[Any] = []
            await self._round_trip(sender, [batch[i] for i in missing], again)
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply

    async def _round_trip(
        self, sender: _Sender, batch: Sequence[_Call], replies: list[Any]
    ) -> None:
        """Send every call of `batch` at once and append their replies to `replies`, in
        order (those read before a failure stay there); TimeoutError if it takes longer
        than `timeout_s`."""
        # hiredis packs in C what redis-py's `pack_commands` packs in Python, the same
        # bytes at a sixth of the cost: packing was the limiter's largest own cost.
        packed = b"".join(
            pack_command(("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args))
            if call.packed is None
            else call.packed
            for call in batch
        )
        connection = sender.connection
        loop = asyncio.get_running_loop()
        sender.started = loop.time()
        if self._watchdog is None or self._watchdog_loop is not loop:
            # No timer yet (or only one on a loop no longer running).
            self._arm_watchdog(sender.started)
        try:
            if not connection.is_connected:
                # connect() and not send_packed_command's own connecting: a Sentinel
                # connection asks the sentinels for the primary only in connect()
                # (redis-py's send_packed_command would connect to localhost:6379).
                await connection.connect()  # type: ignore[no-untyped-call]
            parser = connection._parser
            cls = type(connection)
            # Only where redis-py's own `send_packed_command` and `read_response` would
            # write and read: a connection class with its own (Sentinel's turns READONLY
            # into a connection error, fakeredis's uses no socket) is used through them.
            if (
                type(parser) is _AsyncHiredisParser
                and cls.read_response is Connection.read_response
                and cls.send_packed_command is Connection.send_packed_command
            ):
                # What send_packed_command does with no socket timeout, without its
                # checks and its coroutine: a write, and a drain only when the
                # transport could not send it all at once.
                writer = connection._writer
                assert writer is not None  # connected
                writer.write(packed)
                if writer.transport.get_write_buffer_size():
                    await writer.drain()
                await _read_replies(connection, parser, len(batch), replies)
                return
            await connection.send_packed_command(packed, check_health=False)
            for _ in batch:
                try:
                    replies.append(await connection.read_response())
                except ResponseError as error:  # this call's own error
                    replies.append(error)
        except BaseException as exc:
            # Replies may be left unread on the connection: it cannot be used again.
            await connection.disconnect(nowait=True)
            if sender.expired:
                # The watchdog's cancel, taken back as asyncio.timeout takes its own:
                # TimeoutError if it ended the round trip and no other cancel came.
                sender.expired = False
                task = asyncio.current_task()
                assert task is not None
                if task.uncancel() == 0 and isinstance(exc, asyncio.CancelledError):
                    raise TimeoutError from exc
            raise
        finally:
            sender.started = None

    def _arm_watchdog(self, started: float) -> None:
        """Check the round trip that started at `started` when its time is up."""
        loop = asyncio.get_running_loop()
        self._watchdog = loop.call_at(started + self._timeout_s, self._check_round_trips)
        self._watchdog_loop = loop

    def _check_round_trips(self) -> None:
        """Cancel each sender whose round trip has run out of time; look again when the
        next one in flight would (one timer for every round trip, not one each)."""
        self._watchdog = None
        now = asyncio.get_running_loop().time()
        earliest = None
        for sender in (self._urgent, self._background):
            started = sender.started
            if started is None or sender.expired:
                continue
            if now - started >= self._timeout_s:
                assert sender.task is not None  # a round trip runs in it
                sender.expired = True
                sender.task.cancel()
            elif earliest is None or started < earliest:
                earliest = started
        if earliest is not None:
            self._arm_watchdog(earliest)

    async def close(self) -> None:
        """Send the calls already queued, then close the connections."""
        if self._background_timer is not None:
            self._background_timer.cancel()
            self._send_background()
        for sender in (self._urgent, self._background):
            task = sender.task
            if task is None or task.done():
                continue
            if sender.busy:
                # Let it finish what it sends (without being cancelled if this is).
                sender.idle = idle = task.get_loop().create_future()
                await asyncio.shield(idle)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            sender.task = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for sender in (self._urgent, self._background):
            await sender.connection.disconnect()


async def _read_replies(
    connection: Connection, parser: _AsyncHiredisParser, count: int, replies: list[Any]
) -> None:
    """Read `count` replies off `connection` with its own hiredis reader, as its
    `read_response` would one by one (no read timeout), with an error reply as the
    call's own error rather than raised: the same replies without redis-py's several
    Python calls per reply, which cost more than the rest of the round trip together."""
    if not parser._connected:
        raise RedisConnectionError(SERVER_CLOSED_CONNECTION_ERROR)
    reader, stream = parser._reader, parser._stream
    assert reader is not None and stream is not None  # set when it connected
    push = parser._hiredis_PushNotificationType
    until = len(replies) + count
    while len(replies) < until:
        reply = reader.gets()
        while reply is NOT_ENOUGH_DATA:
            try:
                data = await stream.read(parser._read_size)
            except OSError as exc:
                raise RedisConnectionError(
                    f"Error while reading from {connection._host_error()} : {exc.args}"
                ) from exc
            if not data:
                raise RedisConnectionError(SERVER_CLOSED_CONNECTION_ERROR)
            reader.feed(data)
            reply = reader.gets()
        # As redis-py: an error reply that means the connection failed (LOADING, ...)
        # is raised, not given to the call.
        if isinstance(reply, RedisConnectionError):
            raise reply
        if push is not None and isinstance(reply, push):
            # RESP3 (redis-py's default): a push message (an invalidation, a maintenance
            # notice) is handed to redis-py's handlers and is no call's reply.
            await parser.handle_push_response(reply)
            continue
        if type(reply) is list and reply and isinstance(reply[0], RedisConnectionError):
            raise reply[0]
        replies.append(reply)


def _settle(call: _Call, reply: Any) -> None:
    """Give `call` its reply (an error reply as its exception)."""
    if call.reply.done():  # its caller gave up waiting
        return
    if isinstance(reply, Exception):
        call.reply.set_exception(reply)
    else:
        call.reply.set_result(reply)
