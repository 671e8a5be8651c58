"""The gateway as a client of an upstream it does not trust (gateway/mcp/upstream_peer.py):
its answers resolve the calls waiting for them; what it sends unasked (notifications,
requests of its own, junk) is paid for from a budget, and a server past it is cut off,
every call waiting on it failed; a ping is answered, anything else it asks is refused;
and a response's error or missing result becomes the `UpstreamFailure` the caller sees."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from gateway.mcp import upstream_peer
from gateway.mcp.jsonrpc import INTERNAL_ERROR, METHOD_NOT_FOUND
from gateway.mcp.upstream_peer import (
    UNASKED_BURST,
    UNASKED_PER_S,
    UnaskedBudget,
    UpstreamFailure,
    UpstreamPeer,
    result_of,
)
from tests.fake_clock import FakeClock

BURST = int(UNASKED_BURST)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The module's clock, and only its: the event loop keeps the real one."""
    fake = FakeClock()
    monkeypatch.setattr(upstream_peer, "time", types.SimpleNamespace(monotonic=fake))
    return fake


class Sink:
    """The notifications the gateway is told of."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, method: str, params: dict[str, Any]) -> None:
        self.seen.append((method, params))


class Replies:
    """What the gateway answers the server's own requests."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


async def settled() -> None:
    """Let the tasks `received` started (the replies) run."""
    for _ in range(5):
        await asyncio.sleep(0)


# --- the budget --------------------------------------------------------------------------


def test_the_budget_allows_the_burst_then_refuses(clock: FakeClock) -> None:
    budget = UnaskedBudget()
    assert all(budget.take() for _ in range(BURST))
    assert not budget.take()
    assert not budget.take()


def test_the_budget_refills_at_its_rate_up_to_the_burst(clock: FakeClock) -> None:
    budget = UnaskedBudget(per_s=10, burst=20)
    assert sum(budget.take() for _ in range(100)) == 20
    clock.advance(1.0)
    assert sum(budget.take() for _ in range(100)) == 10
    clock.advance(3600.0)  # an hour quiet earns no more than the burst
    assert sum(budget.take() for _ in range(100)) == 20


def test_the_default_budget_refills_fifty_a_second(clock: FakeClock) -> None:
    budget = UnaskedBudget()
    while budget.take():
        pass
    clock.advance(1.0)
    assert sum(budget.take() for _ in range(100)) == int(UNASKED_PER_S)


# --- received ----------------------------------------------------------------------------


async def test_a_response_resolves_the_call_waiting_for_it() -> None:
    peer = UpstreamPeer("notes", Sink())
    first, second = peer.next_id(), peer.next_id()
    assert (first, second) == (1, 2)
    waiting_first, waiting_second = peer.expect(first), peer.expect(second)
    response = {"jsonrpc": "2.0", "id": second, "result": {"tools": []}}
    peer.received(response, Replies())
    assert waiting_second.done() and waiting_second.result() == response
    assert not waiting_first.done()


async def test_answers_to_calls_are_not_paid_for(clock: FakeClock) -> None:
    peer = UpstreamPeer("notes", Sink())
    for _ in range(BURST * 3):
        request_id = peer.next_id()
        waiting = peer.expect(request_id)
        peer.received({"jsonrpc": "2.0", "id": request_id, "result": {}}, Replies())
        assert waiting.result() == {"jsonrpc": "2.0", "id": request_id, "result": {}}
    assert not peer.closed and peer.failure is None


async def test_a_response_with_an_id_of_another_type_resolves_nothing() -> None:
    peer = UpstreamPeer("notes", Sink())
    waiting = peer.expect(peer.next_id())
    for other in ("1", True, 1.0):
        peer.received({"jsonrpc": "2.0", "id": other, "result": {}}, Replies())
    assert not waiting.done()


async def test_a_forgotten_call_is_not_resolved() -> None:
    peer = UpstreamPeer("notes", Sink())
    request_id = peer.next_id()
    waiting = peer.expect(request_id)
    peer.forget(request_id)
    peer.received({"jsonrpc": "2.0", "id": request_id, "result": {}}, Replies())
    assert not waiting.done()


async def test_a_flood_past_the_budget_cuts_the_server_off_and_fails_every_waiting_call(
    clock: FakeClock,
) -> None:
    sink = Sink()
    peer = UpstreamPeer("noisy", sink)
    waiting = [peer.expect(peer.next_id()) for _ in range(3)]
    notice = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x"}}
    for _ in range(BURST):
        peer.received(notice, Replies())
    assert not peer.closed
    assert not any(future.done() for future in waiting)
    peer.received(notice, Replies())
    assert peer.closed
    assert peer.failure is not None and peer.failure.outcome == "unavailable"
    assert "noisy" in peer.failure.message
    for future in waiting:
        failure = future.exception()
        assert isinstance(failure, UpstreamFailure)
        assert failure.outcome == "unavailable"
    # What came within the budget was delivered; the message past it was not.
    assert len(sink.seen) == BURST


async def test_a_server_cut_off_keeps_the_first_reason(clock: FakeClock) -> None:
    peer = UpstreamPeer("noisy", Sink())
    for _ in range(BURST + 1):
        peer.received({"jsonrpc": "2.0", "method": "notifications/message"}, Replies())
    assert peer.closed
    first = peer.failure
    peer.received({"jsonrpc": "2.0", "method": "notifications/message"}, Replies())
    assert peer.failure is first  # the first reason is kept


async def test_a_ping_of_the_server_is_answered_with_an_empty_result(clock: FakeClock) -> None:
    replies, sink = Replies(), Sink()
    peer = UpstreamPeer("notes", sink)
    peer.received({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"}, replies)
    await settled()
    assert replies.sent == [{"jsonrpc": "2.0", "id": "srv-1", "result": {}}]
    assert sink.seen == []


@pytest.mark.parametrize(
    "method", ["sampling/createMessage", "elicitation/create", "roots/list", "tools/call"]
)
async def test_any_other_request_of_the_server_is_answered_method_not_found(
    method: str, clock: FakeClock
) -> None:
    replies, sink = Replies(), Sink()
    peer = UpstreamPeer("notes", sink)
    peer.received({"jsonrpc": "2.0", "id": 9, "method": method, "params": {}}, replies)
    await settled()
    assert len(replies.sent) == 1
    answer = replies.sent[0]
    assert (answer["jsonrpc"], answer["id"]) == ("2.0", 9)
    assert "result" not in answer
    assert answer["error"]["code"] == METHOD_NOT_FOUND == -32601
    assert method in answer["error"]["message"]
    assert sink.seen == []


async def test_a_reply_that_fails_to_send_is_swallowed(clock: FakeClock) -> None:
    async def broken(message: dict[str, Any]) -> None:
        raise ConnectionResetError("gone")

    peer = UpstreamPeer("notes", Sink())
    before = asyncio.all_tasks()
    peer.received({"jsonrpc": "2.0", "id": 1, "method": "ping"}, broken)
    sending = asyncio.all_tasks() - before
    assert len(sending) == 1
    await asyncio.gather(*sending)  # raises if the reply's failure escaped
    assert not peer.closed


async def test_list_changed_notifications_reach_the_sink(clock: FakeClock) -> None:
    sink, replies = Sink(), Replies()
    peer = UpstreamPeer("notes", sink)
    peer.received({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}, replies)
    peer.received(
        {"jsonrpc": "2.0", "method": "notifications/resources/list_changed", "params": {}},
        replies,
    )
    peer.received(
        {"jsonrpc": "2.0", "method": "notifications/prompts/list_changed", "params": [1]},
        replies,
    )
    await settled()
    assert sink.seen == [
        ("notifications/tools/list_changed", {}),
        ("notifications/resources/list_changed", {}),
        ("notifications/prompts/list_changed", {}),
    ]
    assert replies.sent == []


@pytest.mark.parametrize(
    "junk",
    [
        "not json-rpc",
        42,
        None,
        [{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}],
        {"jsonrpc": "2.0", "method": 7},
        {"jsonrpc": "2.0", "id": 99, "result": {}},  # an answer to nothing asked
        {"jsonrpc": "2.0", "id": [1], "result": {}},
    ],
)
async def test_junk_is_dropped_but_paid_for(junk: Any, clock: FakeClock) -> None:
    sink, replies = Sink(), Replies()
    peer = UpstreamPeer("junky", sink)
    for _ in range(BURST):
        peer.received(junk, replies)
    await settled()
    assert (sink.seen, replies.sent) == ([], [])
    assert not peer.closed
    peer.received(junk, replies)
    assert peer.closed
    assert peer.failure is not None and peer.failure.outcome == "unavailable"


async def test_the_budget_is_shared_by_every_kind_of_unasked_message(clock: FakeClock) -> None:
    replies, sink = Replies(), Sink()
    peer = UpstreamPeer("mixed", sink)
    kinds: list[Any] = [
        {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"},
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        "junk",
    ]
    for i in range(BURST):
        peer.received(kinds[i % 3], replies)
    assert not peer.closed
    peer.received(kinds[0], replies)
    assert peer.closed
    await settled()


async def test_a_server_within_its_rate_is_never_cut_off(clock: FakeClock) -> None:
    peer = UpstreamPeer("steady", Sink())
    for _ in range(10 * BURST):
        peer.received({"jsonrpc": "2.0", "method": "notifications/message"}, Replies())
        clock.advance(1 / UNASKED_PER_S)
    assert not peer.closed


async def test_a_cut_off_asked_by_the_gateway_fails_the_waiting_calls_with_its_reason() -> None:
    peer = UpstreamPeer("notes", Sink())
    waiting = peer.expect(peer.next_id())
    peer.cut_off(UpstreamFailure("unavailable", "closed by the gateway"), quiet=True)
    failure = waiting.exception()
    assert isinstance(failure, UpstreamFailure) and failure.message == "closed by the gateway"
    assert peer.closed


# --- result_of ---------------------------------------------------------------------------


def test_a_result_is_returned_as_it_is() -> None:
    body = {"content": [{"type": "text", "text": "hi"}]}
    assert result_of("notes", {"jsonrpc": "2.0", "id": 1, "result": body}) is body


def test_an_error_becomes_an_error_failure_with_the_server_s_code_message_and_data() -> None:
    response = {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32602, "message": "Unknown tool: x", "data": {"tool": "x"}},
    }
    with pytest.raises(UpstreamFailure) as raised:
        result_of("notes", response)
    failure = raised.value
    assert (failure.outcome, failure.code, failure.message) == ("error", -32602, "Unknown tool: x")
    assert failure.data == {"tool": "x"}


@pytest.mark.parametrize("code", ["-32602", None, 1.5, True, [1]])
def test_an_error_whose_code_is_not_an_integer_becomes_an_internal_error(code: Any) -> None:
    with pytest.raises(UpstreamFailure) as raised:
        result_of("notes", {"jsonrpc": "2.0", "id": 1, "error": {"code": code, "message": "m"}})
    assert raised.value.outcome == "error"
    assert raised.value.code == INTERNAL_ERROR == -32603


@pytest.mark.parametrize("error", ["boom", None, 5, [], {"code": 12}])
def test_an_error_without_a_message_is_named_after_its_server(error: Any) -> None:
    with pytest.raises(UpstreamFailure) as raised:
        result_of("notes", {"jsonrpc": "2.0", "id": 1, "error": error})
    assert raised.value.outcome == "error"
    assert raised.value.message == "MCP server notes answered an error"


@pytest.mark.parametrize(
    "response",
    [
        {"jsonrpc": "2.0", "id": 1},
        {"jsonrpc": "2.0", "id": 1, "result": None},
        {"jsonrpc": "2.0", "id": 1, "result": "ok"},
        {"jsonrpc": "2.0", "id": 1, "result": [1, 2]},
    ],
)
def test_a_response_without_a_result_object_is_malformed(response: dict[str, Any]) -> None:
    with pytest.raises(UpstreamFailure) as raised:
        result_of("notes", response)
    assert raised.value.outcome == "malformed"
    assert raised.value.code is None
    assert "notes" in raised.value.message
