"""The Triton gRPC backend: a replica that cannot be reached."""

from __future__ import annotations

import socket

import pytest

from gateway.backends.base import CONNECT_FAILED, ReplicaUnavailable
from gateway.backends.triton_grpc import TritonGRPCBackend
from gateway.inference.types import RequestKind
from tests.unit.backends.calls import upstream_call


async def test_grpc_replica_that_does_not_connect_fails_within_connect_s() -> None:
    # A port that accepts TCP but never speaks HTTP/2: the channel stays CONNECTING.
    with socket.socket() as silent, socket.socket() as closed:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        backend = TritonGRPCBackend(connect_timeout_s=0.3, total_timeout_s=30)
        try:
            # The silent one is given up at the connect timeout, not the total one (30 s).
            silent_url = f"127.0.0.1:{silent.getsockname()[1]}"
            with pytest.raises(ReplicaUnavailable) as failed:
                await backend.complete(silent_url, upstream_call(RequestKind.COMPLETION))
            assert str(failed.value) == CONNECT_FAILED
            assert failed.value.detail == f"gRPC: no connection to {silent_url} within 0.3 s"
            # The refused one fails as a connection that could not be made.
            closed_url = f"127.0.0.1:{closed.getsockname()[1]}"
            with pytest.raises(ReplicaUnavailable) as failed:
                await backend.complete(closed_url, upstream_call(RequestKind.COMPLETION))
            assert str(failed.value) == CONNECT_FAILED
        finally:
            await backend.close()
