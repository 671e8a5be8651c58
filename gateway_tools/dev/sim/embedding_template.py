"""A Triton Python-backend model that imitates a text embedding model on the CPU.

`gateway_tools.dev.sim.repository` copies this file to `<repo>/<model>/1/model.py` for models
whose name starts with `embed`. It is called through Triton's standard `infer` API
(KServe v2), a batch of texts at a time.

Vectors are deterministic unit vectors made by feature hashing: every word and every
character trigram of a word adds a signed weight to one of `dimensions` coordinates, so
texts that share words are near (cosine similarity well above that of unrelated texts).
Their leading coordinates are themselves such a vector, so that truncating a vector and
normalizing it again (what `dimensions` asks of a Matryoshka model) keeps it meaningful.
`embed_texts` is importable without Triton, so tests compute the expected vectors.

Inputs:  text_input BYTES [-1] (one text per row).
Outputs: embedding FP32 [-1, dimensions], num_input_tokens INT32 [-1].
Model config parameters (string values): dimensions, delay_per_char (seconds).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from typing import Any

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton (tests) only for `embed_texts`
    pb_utils = None

_WORD = re.compile(r"\w+")


def count_input_tokens(text: bytes) -> int:
    """Input tokens as the simulator counts them: one per 4 bytes, rounded up."""
    return math.ceil(len(text) / 4)


def _features(text: str) -> list[tuple[str, float]]:
    features: list[tuple[str, float]] = []
    for word in _WORD.findall(text.lower()):
        features.append(("w:" + word, 1.0))
        padded = f"<{word}>"
        features.extend(("t:" + padded[i : i + 3], 0.5) for i in range(len(padded) - 2))
    return features


def embed_text(text: str, dimensions: int) -> np.ndarray:
    """The unit vector of `text` (all zeros but the first for a text without words)."""
    vector = np.zeros(dimensions, dtype=np.float64)
    for feature, weight in _features(text):
        h = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "big")
        vector[h % dimensions] += weight if (h >> 32) & 1 else -weight
    norm = float(np.linalg.norm(vector))
    if norm == 0.0:
        vector[0] = 1.0
        norm = 1.0
    return (vector / norm).astype(np.float32)


def embed_texts(texts: list[str], dimensions: int) -> np.ndarray:
    """One row per text: what the model answers for this batch."""
    return np.stack([embed_text(text, dimensions) for text in texts])


class TritonPythonModel:
    """The Python-backend entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        params = json.loads(args["model_config"]).get("parameters", {})
        self.dimensions = int(params.get("dimensions", {}).get("string_value", 256))
        self.delay_per_char = float(params.get("delay_per_char", {}).get("string_value", 0))

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "text_input")
            raw = [] if tensor is None else list(tensor.as_numpy().reshape(-1))
            if not raw:
                error = pb_utils.TritonError("text_input must hold at least one text")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            texts = [t if isinstance(t, bytes) else str(t).encode() for t in raw]
            time.sleep(self.delay_per_char * sum(len(t) for t in texts))
            vectors = embed_texts([t.decode(errors="replace") for t in texts], self.dimensions)
            counts = np.array([count_input_tokens(t) for t in texts], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("embedding", vectors),
                        pb_utils.Tensor("num_input_tokens", counts),
                    ]
                )
            )
        return responses
