"""OpenAI's own APIs as wires: `/v1/chat/completions`, `/v1/completions` and
`/v1/embeddings` (`openai_requests.py` parses their bodies, `openai_answers.py` writes
their answers and stream chunks)."""

from __future__ import annotations

from gateway.api.openai.openai_answers import ChunkWriter, completion_body, embeddings_body
from gateway.api.openai.openai_requests import parse_chat, parse_completion, parse_embeddings
from gateway.api.wire import StreamWriter, Wire
from gateway.inference.types import InferenceRequest


def _chunk_writer(
    request: InferenceRequest, response_id: str, model: str, prompt_estimate: int
) -> StreamWriter:
    return ChunkWriter(request, response_id=response_id, model=model)


CHAT = Wire("chat", "chatcmpl-", parse_chat, completion_body, _chunk_writer)
COMPLETIONS = Wire(
    "completions", "cmpl-", parse_completion, completion_body, _chunk_writer,
    operation="text_completion",
)  # fmt: skip
EMBEDDINGS = Wire(
    "embeddings", "embd-", parse_embeddings, embeddings_body, _chunk_writer,
    operation="embeddings",
)  # fmt: skip
