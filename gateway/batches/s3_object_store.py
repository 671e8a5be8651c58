"""Batch files in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW...), through aiobotocore.

An object is written as one multipart upload of `PART_BYTES` parts, completed only when
its last part is in (aborted if anything fails): nobody sees half of it, and a 200 MB file
never sits in memory whole. Small objects (one part) are one `PutObject`. Credentials come
from the standard AWS environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, a role),
never from gateway.yaml. Imported only when gateway.yaml names a bucket (`batches.s3`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from aiobotocore.session import get_session  # type: ignore[import-untyped]
from botocore.config import Config as BotoConfig  # type: ignore[import-untyped]
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from gateway.batches.object_store import READ_CHUNK_BYTES
from gateway.config.schema import S3Store as S3Settings

# S3's smallest part but the last is 5 MiB.
PART_BYTES = 8 * 1024 * 1024


class S3Store:
    """`object_store.ObjectStore` on a bucket: objects `{prefix}{key}`."""

    def __init__(self, settings: S3Settings) -> None:
        self._settings = settings
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None

    async def _ready(self) -> Any:
        if self._client is None:
            settings = self._settings
            self._client = await self._stack.enter_async_context(
                get_session().create_client(
                    "s3",
                    region_name=settings.region,
                    endpoint_url=settings.endpoint_url,
                    config=BotoConfig(retries={"max_attempts": 3, "mode": "standard"}),
                )
            )
        return self._client

    def _name(self, key: str) -> str:
        return f"{self._settings.prefix}{key}"

    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        client, bucket, name = await self._ready(), self._settings.bucket, self._name(key)
        buffer = bytearray()
        size = 0
        upload_id: str | None = None
        parts: list[dict[str, Any]] = []
        try:
            async for chunk in chunks:
                buffer += chunk
                size += len(chunk)
                while len(buffer) >= PART_BYTES:
                    if upload_id is None:
                        started = await client.create_multipart_upload(Bucket=bucket, Key=name)
                        upload_id = started["UploadId"]
                    part, buffer = bytes(buffer[:PART_BYTES]), buffer[PART_BYTES:]
                    parts.append(await _upload_part(client, bucket, name, upload_id, parts, part))
            if upload_id is None:
                await client.put_object(Bucket=bucket, Key=name, Body=bytes(buffer))
                return size
            if buffer:
                parts.append(
                    await _upload_part(client, bucket, name, upload_id, parts, bytes(buffer))
                )
            await client.complete_multipart_upload(
                Bucket=bucket, Key=name, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            if upload_id is not None:
                with contextlib.suppress(Exception):
                    await client.abort_multipart_upload(Bucket=bucket, Key=name, UploadId=upload_id)
            raise
        return size

    async def get(self, key: str) -> AsyncIterator[bytes]:
        client = await self._ready()
        try:
            answer = await client.get_object(Bucket=self._settings.bucket, Key=self._name(key))
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise FileNotFoundError(key) from None
            raise
        async with answer["Body"] as body:
            while chunk := await body.read(READ_CHUNK_BYTES):
                yield chunk

    async def delete(self, key: str) -> None:
        client = await self._ready()
        await client.delete_object(Bucket=self._settings.bucket, Key=self._name(key))

    async def close(self) -> None:
        await self._stack.aclose()
        self._client = None


async def _upload_part(
    client: Any, bucket: str, name: str, upload_id: str, parts: list[dict[str, Any]], data: bytes
) -> dict[str, Any]:
    number = len(parts) + 1
    answer = await client.upload_part(
        Bucket=bucket, Key=name, UploadId=upload_id, PartNumber=number, Body=data
    )
    return {"PartNumber": number, "ETag": answer["ETag"]}
