"""A batch's input file read and checked (gateway/batches/batch_input.py): what refuses
the batch at create, with the limit or the lines named, and what only its own line."""

from __future__ import annotations

import orjson
import pytest

from gateway.batches.batch_input import (
    MAX_FILE_BYTES,
    MAX_LINES,
    BatchInputRefused,
    read_batch_input,
)

CHAT = "/v1/chat/completions"


def line(custom_id: str, **changes: object) -> bytes:
    request = {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "llm", "messages": [{"role": "user", "content": custom_id}]},
        **changes,
    }
    return orjson.dumps(request)


def test_every_good_line_is_a_request_in_file_order() -> None:
    read = read_batch_input(b"\n".join(line(f"r{i}") for i in range(3)) + b"\n", CHAT)
    assert [(r.line, r.custom_id) for r in read.lines] == [(1, "r0"), (2, "r1"), (3, "r2")]
    assert orjson.loads(read.lines[0].body)["messages"][0]["content"] == "r0"
    assert (read.lines[0].model, read.lines[0].streams) == ("llm", False)
    assert (read.errors, read.total) == ([], 3)


def test_a_bad_line_goes_to_the_error_file_and_the_rest_run() -> None:
    data = b"\n".join(
        [
            line("ok"),
            b"{not json",
            b"[1, 2]",
            orjson.dumps({"method": "POST", "url": CHAT, "body": {}}),
            line("other", url="/v1/embeddings"),
            line("get", method="GET"),
            line("nobody", body="text"),
            b"[" * 5000 + b"]" * 5000,  # deeper than any parser takes
            line("x" * 513),
        ]
    )
    read = read_batch_input(data, CHAT)
    assert [r.custom_id for r in read.lines] == ["ok"]
    assert [(e.line, e.custom_id, e.code) for e in read.errors] == [
        (2, None, "invalid_json"),
        (3, None, "invalid_request"),
        (4, None, "missing_custom_id"),
        (5, "other", "mismatched_endpoint"),
        (6, "get", "invalid_method"),
        (7, "nobody", "invalid_body"),
        (8, None, "invalid_json"),
        (9, None, "invalid_custom_id"),
    ]
    assert read.total == 9


def test_a_custom_id_used_twice_refuses_the_batch_naming_its_lines() -> None:
    data = b"\n".join([line("a"), line("b"), line("a"), line("a", url="/v1/x")])
    with pytest.raises(BatchInputRefused, match=r'`custom_id` "a" is on lines 1, 3, 4'):
        read_batch_input(data, CHAT)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "holds no request"),
        (b"\n", "holds no request"),
        (b"\n".join([line(f"r{i}") for i in range(MAX_LINES + 1)]), "50,001 lines; a batch may"),
        (b" " * (MAX_FILE_BYTES + 1), "at most 209,715,200 \\(200 MB\\)"),
    ],
    ids=["empty", "a newline", "50,001 lines", "200 MB and a byte"],
)
def test_a_file_that_cannot_be_a_batch_is_refused_with_the_limit_named(
    data: bytes, why: str
) -> None:
    with pytest.raises(BatchInputRefused, match=why):
        read_batch_input(data, CHAT)


def test_a_body_too_deep_to_write_back_is_its_lines_error() -> None:
    # Read (orjson takes 1,024 levels), but not written back (it writes 254).
    deep = b"[" * 300 + b'"x"' + b"]" * 300
    raw = (
        b'{"custom_id": "deep", "method": "POST", "url": "' + CHAT.encode()
        + b'", "body": {"model": "llm", "messages": ' + deep + b"}}\n"
    )  # fmt: skip
    read = read_batch_input(raw, CHAT)
    assert [(e.custom_id, e.code) for e in read.errors] == [("deep", "invalid_body")]
