"""`gateway eval` on a machine without its sandbox: a one-line refusal, not a traceback."""

from __future__ import annotations

import pytest

from gateway.cli import main
from gateway_tools.eval import judge
from gateway_tools.eval.sandbox import SandboxUnavailable


def test_check_suite_without_a_sandbox_refuses_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def unavailable(*_: object) -> None:
        raise SandboxUnavailable("bwrap not found: apt-get install bubblewrap")

    monkeypatch.setattr(judge, "verify", unavailable)
    assert main(["eval", "check-suite"]) == 2
    err = capsys.readouterr().err
    assert err == "check-suite: bwrap not found: apt-get install bubblewrap\n"
