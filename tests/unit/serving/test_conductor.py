"""The conductor's own rules that need no running gateway (the rest: tests/inprocess)."""

from __future__ import annotations

from gateway.api.errors import model_not_found
from gateway.serving.conductor import MAX_SHOWN_MODEL, shown_model

PASSWORD_URL = "postgres://admin:hunter2secretpw@db.internal:5432/x"


def test_a_model_name_cut_before_a_secrets_end_shows_none_of_it() -> None:
    # Cut first, a password URL loses its `@host` and with it what makes it one to the
    # detectors: the name is redacted before it is cut.
    before_at = PASSWORD_URL.index("@")
    pad = "gpt-" + "a" * (MAX_SHOWN_MODEL - len("gpt-") - 1 - before_at)
    name = pad + " " + PASSWORD_URL
    assert name[:MAX_SHOWN_MODEL].endswith("hunter2secretpw")  # the cut lands before `@`
    shown = shown_model(name)
    assert "hunter2" not in shown
    assert len(shown) <= MAX_SHOWN_MODEL + len("...") and shown.endswith("...")
    assert "hunter2" not in model_not_found(name).message


def test_a_short_model_name_is_shown_whole_or_redacted() -> None:
    assert shown_model("llm-large") == "llm-large"
    assert (
        shown_model(f"gpt-4 {PASSWORD_URL}")
        == "gpt-4 postgres://admin:[REDACTED]@db.internal:5432/x"
    )
    assert shown_model("x" * 10_000_000)[-3:] == "..."  # cheap however long: a window
