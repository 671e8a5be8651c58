"""Structured outputs as Triton request parameters: guided decoding.

Triton's LLM backends constrain generation to a JSON Schema when asked by request
parameters; Triton parameters are scalars, so the structures travel as JSON text:

- `guided_decoding`: vLLM's `GuidedDecodingParams` as its Triton backend takes them,
  `{"json": <schema>}` or `{"json_object": true}`;
- `guided_decoding_guide_type` and `guided_decoding_guide`: TensorRT-LLM's names,
  `"json_schema"` with the schema's text, or `"json"` for any JSON object.

Both are sent: a backend reads its own and ignores the other's.
"""

from __future__ import annotations

import orjson

from gateway.inference.types import ResponseFormat


def guided_decoding(fmt: ResponseFormat) -> dict[str, object]:
    """vLLM's guided decoding (`GuidedDecodingParams`) for `fmt`, as an object: what its
    Triton backend reads inside the `sampling_parameters` input."""
    if fmt.type == "json_schema" and fmt.schema is not None:
        return {"json": fmt.schema}
    return {"json_object": True}


def guided_decoding_parameters(fmt: ResponseFormat) -> dict[str, str]:
    """The request parameters that ask a Triton LLM backend for `fmt`."""
    if fmt.type == "json_schema" and fmt.schema is not None:
        schema = orjson.dumps(fmt.schema).decode()
        return {
            "guided_decoding": '{"json": ' + schema + "}",
            "guided_decoding_guide_type": "json_schema",
            "guided_decoding_guide": schema,
        }
    return {
        "guided_decoding": '{"json_object": true}',
        "guided_decoding_guide_type": "json",
        "guided_decoding_guide": "",
    }
