"""The simulated embedding model's vectors: what the tests and the demo rely on."""

from __future__ import annotations

import numpy as np

from gateway_tools.dev.sim.embedding_template import embed_texts
from gateway_tools.dev.sim.repository import EMBED, render_config


def test_vectors_are_deterministic_unit_vectors() -> None:
    first = embed_texts(["The cat sat on the mat.", ""], 256)
    again = embed_texts(["The cat sat on the mat.", ""], 256)
    assert first.dtype == np.float32 and first.shape == (2, 256)
    assert np.array_equal(first, again)
    assert np.allclose(np.linalg.norm(first, axis=1), 1.0)


def test_similar_texts_are_nearer_than_unrelated_ones_even_shortened() -> None:
    texts = ["The cat sat on the mat.", "A cat sits on a mat.", "Revenue grew in Q3."]
    for dimensions in (256, 64):
        vectors = embed_texts(texts, 256)[:, :dimensions]
        cat, sits, revenue = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        assert np.dot(cat, sits) > np.dot(cat, revenue) + 0.1


def test_the_embedding_model_is_not_decoupled_and_outputs_fp32_rows() -> None:
    config = render_config(EMBED)
    assert "decoupled" not in config
    assert 'name: "embedding" data_type: TYPE_FP32 dims: [ -1, 256 ]' in config
