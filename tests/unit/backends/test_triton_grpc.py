"""The Triton gRPC backend: a replica that cannot be reached."""

from __future__ import annotations

import socket
import time

import pytest

from gateway.backends.base import ReplicaUnavailable
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
            for port, within in ((silent.getsockname()[1], 2.0), (closed.getsockname()[1], 1.0)):
                started = time.monotonic()
                with pytest.raises(ReplicaUnavailable):
                    await backend.complete(
                        f"127.0.0.1:{port}", upstream_call(RequestKind.COMPLETION)
                    )
                assert time.monotonic() - started < within
        finally:
            await backend.close()
