"""The Batch APIs against real Triton, driven by the official SDKs: OpenAI's files and
batches, Anthropic's message batches; a tenant's files and batches its own."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import boto3  # type: ignore[import-untyped]
import openai
import pytest
from openai import OpenAI

from gateway_tools.dev.processes import gateway_command, stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.conftest import start_sim
from tests.e2e.stack import KEYS, Gateway, model, start_gateway, tenant
from tests.integration.test_object_stores import BUCKET, moto_server


@pytest.fixture(scope="module")
def sim() -> Iterator[TritonSim]:
    server = start_sim("llm-small=1,llm-slow=40")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(
    sim: TritonSim, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("batches")
    models = {
        "llm-small": model("triton_grpc", [sim.grpc_target]),
        # Four slots: a batch of it takes seconds, long enough to cancel it midway.
        "llm-slow": model("triton_grpc", [sim.grpc_target], queue={"max_in_flight_per_replica": 4}),
    }
    tenants = {
        "acme": tenant("acme", ["*"], priority="online"),
        "globex": tenant("globex", ["llm-small"], priority="online"),
        "ops": tenant("ops", [], admin=True),
    }
    gw = start_gateway(
        tmp,
        models,
        redis_url,
        tenants=tenants,
        gateway={
            "ledger": {"url": f"sqlite:///{tmp}/usage.db", "spool_dir": str(tmp / "spool")},
            "batches": {"files_dir": str(tmp / "files"), "housekeeping_interval_s": 0.2},
            # A batch line pays half (`batch_discount`, 0.5 by default).
            "prices": {
                "models": {"llm-small": {"input_per_million": 1000, "output_per_million": 4000}}
            },
        },
    )
    try:
        yield gw
    finally:
        stop(gw.process)


def _openai(gateway: Gateway, who: str = "acme") -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=KEYS[who], max_retries=0)


def _jsonl(lines: list[Any]) -> bytes:
    return b"".join(
        (line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines
    )


def _chat(custom_id: str, content: str = "Hello", model_name: str = "llm-small") -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": model_name,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": content}],
        },
    }


def _ledger_rows(gateway: Gateway, batch_id: str, expected: int) -> list[dict[str, Any]]:
    """The usage ledger's records of a batch's lines, once all `expected` are written."""
    deadline = time.monotonic() + 30
    while True:
        rows = []
        with sqlite3.connect(gateway.config_dir / "usage.db") as connection:
            connection.row_factory = sqlite3.Row
            with contextlib.suppress(sqlite3.OperationalError):  # no record written yet
                rows = connection.execute(
                    "SELECT * FROM usage_ledger WHERE batch_id = ?", (batch_id,)
                ).fetchall()
        if len(rows) >= expected or time.monotonic() > deadline:
            assert len(rows) == expected
            return [dict(row) for row in rows]
        time.sleep(0.2)


def _wait_ended(client: OpenAI, batch_id: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.2)


def test_an_openai_batch_runs_and_its_output_and_errors_are_keyed_by_custom_id(
    gateway: Gateway,
) -> None:
    client = _openai(gateway)
    lines = [_chat(f"req-{i}", f"Hello {i}") for i in range(20)]
    lines.insert(3, b"{not json")
    lines.append(_chat("other-endpoint") | {"url": "/v1/embeddings"})
    lines.append(_chat("no-such-model", model_name="gpt-nothing"))
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(_jsonl(lines))
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
        output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    assert batch.status == "in_progress" and batch.request_counts is not None
    assert batch.request_counts.total == 23 and batch.metadata == {"job": "nightly"}
    done = _wait_ended(client, batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (20, 3)
    assert done.usage is not None and done.usage.output_tokens == 80
    assert done.output_file_id and done.error_file_id
    output_file = client.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output" and output_file.expires_at is not None
    assert output_file.expires_at - output_file.created_at == 7200
    output = [
        json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()
    ]
    assert sorted(line["custom_id"] for line in output) == sorted(f"req-{i}" for i in range(20))
    first = output[0]
    assert first["id"].startswith("batch_req_") and first["error"] is None
    assert first["response"]["status_code"] == 200
    assert first["response"]["body"]["object"] == "chat.completion"
    errors = {
        line["custom_id"]: line
        for line in map(json.loads, client.files.content(done.error_file_id).text.splitlines())
    }
    assert errors[None]["error"]["code"] == "invalid_json"
    assert errors["other-endpoint"]["error"]["code"] == "mismatched_endpoint"
    assert errors["no-such-model"]["error"]["code"] == "model_not_found"
    listed = client.batches.list(limit=100)
    assert batch.id in [b.id for b in listed.data]
    # Every line in the usage ledger with its batch, at half the price.
    recorded = _ledger_rows(gateway, batch.id, 20)
    assert {row["endpoint"] for row in recorded} == {"chat"}
    for row in recorded:
        full = row["prompt_tokens"] * 1000 + row["completion_tokens"] * 4000
        assert row["cost_micros"] == full // 2, row
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_a_cancelled_batch_ends_with_what_ran_and_the_rest_cancelled(gateway: Gateway) -> None:
    client = _openai(gateway)
    lines = [_chat(f"slow-{i}", model_name="llm-slow") for i in range(200)]  # 0.1 s each
    uploaded = client.files.create(file=("slow.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    time.sleep(1.0)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    ended = _wait_ended(client, batch.id)
    assert ended.status == "cancelled"
    counts = ended.request_counts
    assert counts is not None and counts.completed + counts.failed == 200
    assert 0 < counts.completed < 200
    assert ended.error_file_id is not None
    cancelled = client.files.content(ended.error_file_id).text.splitlines()
    assert json.loads(cancelled[0])["error"]["code"] == "batch_cancelled"


def test_another_tenants_files_and_batches_are_not_found(gateway: Gateway) -> None:
    acme, globex = _openai(gateway), _openai(gateway, "globex")
    uploaded = acme.files.create(
        file=("in.jsonl", io.BytesIO(_jsonl([_chat("a")]))), purpose="batch"
    )
    batch = acme.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    for call in (
        lambda: globex.files.retrieve(uploaded.id),
        lambda: globex.files.content(uploaded.id),
        lambda: globex.files.delete(uploaded.id),
        lambda: globex.batches.retrieve(batch.id),
        lambda: globex.batches.cancel(batch.id),
        lambda: globex.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert uploaded.id not in [f.id for f in globex.files.list().data]
    done = _wait_ended(acme, batch.id)
    assert done.output_file_id is not None
    with pytest.raises(openai.NotFoundError):
        globex.files.content(done.output_file_id)
    # A batch on a deleted file: not found either.
    assert acme.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        acme.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )


def test_a_file_the_batch_cannot_take_is_refused_with_why(gateway: Gateway) -> None:
    client = _openai(gateway)
    duplicated = client.files.create(
        file=("dup.jsonl", io.BytesIO(_jsonl([_chat("same"), _chat("x"), _chat("same")]))),
        purpose="batch",
    )
    with pytest.raises(openai.BadRequestError, match=r"lines 1, 3"):
        client.batches.create(
            input_file_id=duplicated.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    many = client.files.create(
        file=("many.jsonl", io.BytesIO(b'{"custom_id": "x"}\n' * 100_001)), purpose="batch"
    )
    with pytest.raises(openai.BadRequestError, match=r"at most 50,000"):
        client.batches.create(
            input_file_id=many.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(
            input_file_id=many.id,
            endpoint="/v1/moderations",
            completion_window="24h",  # type: ignore[arg-type]
        )


def test_an_anthropic_message_batch_runs_and_its_results_stream(gateway: Gateway) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key=KEYS["acme"], max_retries=0)
    requests: list[Any] = [
        {
            "custom_id": f"m-{i}",
            "params": {
                "model": "llm-small",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "Hi"}],
            },
        }
        for i in range(5)
    ]
    requests.append(
        {"custom_id": "denied", "params": {"model": "llm-nope", "max_tokens": 4, "messages": []}}
    )
    batch = client.messages.batches.create(requests=requests)
    assert batch.processing_status == "in_progress"
    # The request for a model the key may not use has failed already: counted at once.
    assert (batch.request_counts.processing, batch.request_counts.errored) == (5, 1)
    deadline = time.monotonic() + 60
    while batch.processing_status != "ended":
        assert time.monotonic() < deadline
        time.sleep(0.2)
        batch = client.messages.batches.retrieve(batch.id)
    assert batch.request_counts.succeeded == 5 and batch.request_counts.errored == 1
    assert batch.results_url == f"/v1/messages/batches/{batch.id}/results"  # not the Host's
    assert batch.ended_at is not None
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert results["m-0"].type == "succeeded"
    assert results["m-0"].message.content[0].type == "text"  # type: ignore[union-attr]
    assert results["denied"].type == "errored"
    assert batch.id in [b.id for b in client.messages.batches.list(limit=50).data]
    deleted = client.messages.batches.delete(batch.id)
    assert deleted.type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)


def _post(gateway: Gateway, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    import http.client

    connection = http.client.HTTPConnection(gateway.url.removeprefix("http://"), timeout=30)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


_FILE_PART = (
    b'--b\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n{}\r\n--b--\r\n'
)


def test_hostile_uploads_get_a_clear_error_and_leave_nothing(gateway: Gateway) -> None:
    auth = {"Authorization": f"Bearer {KEYS['globex']}"}
    files_dir = gateway.config_dir / "files" / "globex"
    before = sorted(files_dir.rglob("*")) if files_dir.exists() else []
    # A declared 300 MB: refused before a byte of it is read.
    import http.client

    connection = http.client.HTTPConnection(gateway.url.removeprefix("http://"), timeout=30)
    connection.putrequest("POST", "/v1/files")
    connection.putheader("Authorization", auth["Authorization"])
    connection.putheader("Content-Type", "multipart/form-data; boundary=b")
    connection.putheader("Content-Length", str(300 * 1024 * 1024))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413 and b"200 MB" in response.read()
    connection.close()

    # 201 MB sent without a length: counted as it streams, refused past 200 MB.
    def chunks() -> Iterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
        block = b"x" * (1024 * 1024)
        for _ in range(201):
            yield block
        yield b"\r\n--b--\r\n"

    connection = http.client.HTTPConnection(gateway.url.removeprefix("http://"), timeout=60)
    connection.request(
        "POST",
        "/v1/files",
        body=chunks(),
        headers={**auth, "Content-Type": "multipart/form-data; boundary=b"},
        encode_chunked=True,
    )
    response = connection.getresponse()
    assert response.status == 413, response.read()
    connection.close()
    two_files = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n{}\r\n'
        + _FILE_PART
    )
    for body, content_type, expected in [
        (b"not a form", "application/json", "multipart/form-data"),
        (two_files, "multipart/form-data; boundary=b", "two `file` parts"),
        (
            b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n{}',
            "multipart/form-data; boundary=b",
            "closing boundary",
        ),
        (
            b"--b\r\nContent-Disposition form-data no colon\r\n\r\nx\r\n--b--\r\n",
            "multipart/form-data; boundary=b",
            "not well-formed",
        ),
        (b"--b\r\ngarbage", "multipart/form-data; boundary=b", "closing boundary"),
        (
            _FILE_PART,
            "multipart/form-data; boundary=b",
            "purpose",
        ),
        (
            b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
            + _FILE_PART,
            "multipart/form-data; boundary=b",
            "purpose",
        ),
    ]:
        status, error = _post(gateway, "/v1/files", body, {**auth, "Content-Type": content_type})
        assert status == 400 and expected in error["error"]["message"], (status, error)
    assert (sorted(files_dir.rglob("*")) if files_dir.exists() else []) == before


def test_hostile_batch_creates_are_refused_with_what_refused_them(gateway: Gateway) -> None:
    client = _openai(gateway, "globex")
    uploaded = client.files.create(
        file=("a.jsonl", io.BytesIO(_jsonl([_chat("a")]))), purpose="batch"
    )
    for metadata in ({f"k{i}": "v" for i in range(17)}, {"k": "v" * 513}, {"k" * 65: "v"}):
        with pytest.raises(openai.BadRequestError, match="metadata"):
            client.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata=metadata,
            )
    with pytest.raises(openai.BadRequestError, match="output_expires_after"):
        client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": 10},
        )
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="1h",  # type: ignore[arg-type]
        )
    for body, expected in [
        (b"[1, 2]", "JSON object"),
        (b'{"endpoint": {"a": 1}, "completion_window": "24h", "input_file_id": "x"}', "endpoint"),
        (b'{"endpoint": ["x"], "completion_window": "24h", "input_file_id": "x"}', "endpoint"),
    ]:
        headers = {"Authorization": f"Bearer {KEYS['globex']}", "Content-Type": "application/json"}
        status, error = _post(gateway, "/v1/batches", body, headers)
        assert status == 400 and expected in error["error"]["message"], (status, error)
    for path in ("/v1/batches?limit=%C2%B2", "/v1/files?limit=%C2%B2"):
        call = urllib.request.Request(
            gateway.url + path, headers={"Authorization": f"Bearer {KEYS['globex']}"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(call, timeout=10)
        assert refused.value.code == 400, path
    auth = {"x-api-key": KEYS["globex"], "Content-Type": "application/json"}
    request = {"custom_id": "a", "params": {"model": "llm-small", "max_tokens": 1, "messages": []}}
    for body, expected in [
        ({"requests": []}, "requests"),
        ({"requests": "x"}, "requests"),
        ({"requests": [{**request, "custom_id": "has space"}]}, "custom_id"),
        ({"requests": [{**request, "custom_id": "x" * 65}]}, "custom_id"),
        ({"requests": [request, request]}, "unique"),
        ({"requests": [{"custom_id": "a", "params": "x"}]}, "params"),
        ({"requests": [request] * 100_001}, "100,000"),
    ]:
        status, error = _post(gateway, "/v1/messages/batches", json.dumps(body).encode(), auth)
        assert status == 400, (status, error)
        assert error["type"] == "error" and expected in error["error"]["message"]


def test_an_anthropic_batch_is_its_tenants_and_ends_before_its_results(gateway: Gateway) -> None:
    acme = anthropic.Anthropic(base_url=gateway.url, api_key=KEYS["acme"], max_retries=0)
    globex = anthropic.Anthropic(base_url=gateway.url, api_key=KEYS["globex"], max_retries=0)
    params: Any = {
        "model": "llm-slow",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "x"}],
    }
    batch = acme.messages.batches.create(
        requests=[{"custom_id": f"s{i}", "params": params} for i in range(100)]
    )
    # The SDK asks for results only once `results_url` is set; a client that asks before:
    request = urllib.request.Request(
        f"{gateway.url}/v1/messages/batches/{batch.id}/results", headers={"x-api-key": KEYS["acme"]}
    )
    with pytest.raises(urllib.error.HTTPError) as early:
        urllib.request.urlopen(request, timeout=10)
    assert early.value.code == 404 and b"no results yet" in early.value.read()
    with pytest.raises(anthropic.ConflictError):
        acme.messages.batches.delete(batch.id)
    for call in (
        lambda: globex.messages.batches.retrieve(batch.id),
        lambda: globex.messages.batches.cancel(batch.id),
        lambda: globex.messages.batches.delete(batch.id),
    ):
        with pytest.raises(anthropic.NotFoundError):
            call()
    cancelled = acme.messages.batches.cancel(batch.id)
    assert cancelled.processing_status in ("canceling", "ended")
    deadline = time.monotonic() + 60
    while cancelled.processing_status != "ended":
        assert time.monotonic() < deadline
        time.sleep(0.2)
        cancelled = acme.messages.batches.retrieve(batch.id)
    kinds = [r.result.type for r in acme.messages.batches.results(batch.id)]
    assert len(kinds) == 100 and "canceled" in kinds
    assert cancelled.request_counts.canceled == kinds.count("canceled")


def _batches_cli(gateway: Gateway, *words: str) -> subprocess.CompletedProcess[str]:
    command = gateway_command("batches", *words, "--url", gateway.ops_url)
    env = {**os.environ, "GATEWAY_ADMIN_KEY": "sk-test-ops"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def test_ops_list_follow_and_cancel_every_tenants_batches(gateway: Gateway) -> None:
    acme, globex = _openai(gateway), _openai(gateway, "globex")
    quick = globex.files.create(
        file=("q.jsonl", io.BytesIO(_jsonl([_chat(f"q{i}") for i in range(3)]))), purpose="batch"
    )
    done = _wait_ended(
        globex,
        globex.batches.create(
            input_file_id=quick.id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id,
    )
    slow = acme.files.create(
        file=(
            "s.jsonl",
            io.BytesIO(_jsonl([_chat(f"s{i}", model_name="llm-slow") for i in range(400)])),
        ),
        purpose="batch",
    )
    running = acme.batches.create(
        input_file_id=slow.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    listed = _batches_cli(gateway, "list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    assert rows[done.id][1:5] == ["globex", "openai", "completed", "3/3"]
    assert rows[running.id][1:4] == ["acme", "openai", "in_progress"]
    shown = _batches_cli(gateway, "get", running.id)
    assert json.loads(shown.stdout)["lines"]["total"] == 400
    cancelled = _batches_cli(gateway, "cancel", running.id)
    assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["status"] == "cancelling"
    assert _wait_ended(acme, running.id).status == "cancelled"
    again = _batches_cli(gateway, "cancel", done.id)
    assert again.returncode == 1 and "HTTP 409" in again.stderr
    # A tenant's key is no admin's.
    call = urllib.request.Request(
        f"{gateway.ops_url}/admin/batches", headers={"Authorization": f"Bearer {KEYS['acme']}"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(call, timeout=10)
    assert refused.value.code == 403


def test_batch_files_in_an_s3_bucket(sim: TritonSim, redis_url: str, tmp_path: Path) -> None:
    with moto_server() as endpoint:
        credentials = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
        s3 = boto3.client(
            "s3", region_name="us-east-1", endpoint_url=endpoint,
            aws_access_key_id="test", aws_secret_access_key="test",
        )  # fmt: skip
        s3.create_bucket(Bucket=BUCKET)
        gw = start_gateway(
            tmp_path,
            {"llm-small": model("triton_grpc", [sim.grpc_target])},
            redis_url,
            tenants={"acme": tenant("acme", ["*"])},
            gateway={
                "ledger": {
                    "url": f"sqlite:///{tmp_path}/usage.db",
                    "spool_dir": str(tmp_path / "spool"),
                },
                "batches": {
                    "s3": {"bucket": BUCKET, "endpoint_url": endpoint},
                    "housekeeping_interval_s": 0.2,
                },
            },
            env=credentials,
        )
        try:
            client = _openai(gw)
            uploaded = client.files.create(
                file=("in.jsonl", io.BytesIO(_jsonl([_chat("a"), _chat("b")]))), purpose="batch"
            )
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
            assert keys == [f"gateway-batches/acme/{uploaded.id}"]
            done = _wait_ended(
                client,
                client.batches.create(
                    input_file_id=uploaded.id,
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                ).id,
            )
            assert done.output_file_id is not None
            output = client.files.content(done.output_file_id).text.splitlines()
            assert sorted(json.loads(line)["custom_id"] for line in output) == ["a", "b"]
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
            assert f"gateway-batches/acme/{done.output_file_id}" in keys
        finally:
            stop(gw.process)
