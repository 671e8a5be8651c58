"""A stream of several choices (`n`, or a completion's list of prompts), in OpenAI's
chunk format: each choice's pieces as they arrive, with its `index`, and its finish when
it ends. (The Responses and Messages wires have one choice.)"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator

from gateway.api import errors
from gateway.api.openai.openai_answers import SSE_DONE, ChunkWriter, sse_error
from gateway.inference.types import Delta
from gateway.serving.conductor import Plan, Stream


async def choice_events(
    plan: Plan, stream: Stream, end: Callable[[int, str | None], Awaitable[None]]
) -> AsyncGenerator[bytes, None]:
    """The events of a stream of several choices (`n`, or a completion's prompts): each
    choice's pieces as they arrive, with its `index`; a choice's finish when it ends."""
    parts = plan.parts
    model = stream.served.route.name
    writer = ChunkWriter(parts[0], response_id=plan.ask.record.request_id, model=model)
    status = 499
    reason: str | None = None  # why the gateway ended it with an error event
    checked = parts[0].options.response_format is not None
    texts: list[list[str]] = [[] for _ in parts]
    called = [False] * len(parts)
    merged = stream.pieces()

    def events(index: int, delta: Delta) -> Iterator[bytes]:
        stream.add(delta, index)
        if delta.text:
            if checked:  # kept only to check it against `response_format`
                texts[index].append(delta.text)
            yield writer.text(delta.text, delta.logprobs, index)
        if delta.tool_calls:
            called[index] = True
            yield writer.tool_calls(delta.tool_calls, index)

    try:
        for index, (first, _, _) in enumerate(stream.opened):
            if parts[index].echo:
                yield writer.text(parts[index].prompt, index=index)
            if first is not None:
                for event in events(index, first):
                    yield event
        async for index, piece in merged:
            if piece is not None:
                for event in events(index, piece):
                    yield event
                continue
            finish = stream.finish_reason(index, called[index])
            try:
                stream.check(index, "".join(texts[index]), called[index], finish)
            except errors.CLIENT_ERRORS as exc:
                invalid = errors.client_error(exc)
                status = invalid.status
                yield sse_error(invalid.body())
                return
            yield writer.finish(finish, index)
        if parts[0].include_usage:
            yield writer.usage(stream.usage())
        yield SSE_DONE
        status = 200
    except Exception as exc:
        failed = errors.stream_failure(model, exc)
        status, reason = failed.status, failed.reason
        yield sse_error(failed.body())
    finally:
        # Before the streams close: its readers of them must stop first (a client that
        # left mid-stream ends this generator while they wait for pieces).
        await merged.aclose()
        await end(status, reason)
