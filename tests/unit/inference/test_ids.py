"""Request and lease ids never repeat, in this process or a forked child."""

from __future__ import annotations

import itertools
import os

from gateway.inference.ids import random_id, unique_id


def test_ids_do_not_repeat() -> None:
    ids = [unique_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 24 and int(i, 16) >= 0 for i in ids)


def test_a_forked_child_draws_ids_of_its_own() -> None:
    parent = unique_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id, then leave at once
        os.write(write, unique_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert child[:12] != parent[:12]
    assert child != unique_id()


def test_response_ids_tell_nothing_of_each_other() -> None:
    """A client seeing its ids cannot count the gateway's requests: no shared prefix, no
    sequence."""
    ids = [random_id() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 24 and int(i, 16) >= 0 for i in ids)
    assert len({i[:12] for i in ids}) == len(ids)
    numbers = [int(i, 16) for i in ids]
    assert not any(b - a == 1 for a, b in itertools.pairwise(numbers))
