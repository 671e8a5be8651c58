"""`gateway keys`: the arguments as the admin API's calls, the answers printed."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from gateway.apikeys import keys_cli
from gateway.cli import main


def test_budget_argument() -> None:
    assert keys_cli.parse_budget("0.05/day") == {"amount": 0.05, "period": "day"}
    assert keys_cli.parse_budget("3") == {"amount": 3.0, "period": "month"}
    assert keys_cli.parse_budget("1/total/llm-small") == {
        "amount": 1.0, "period": "total", "model": "llm-small",
    }  # fmt: skip
    with pytest.raises(argparse.ArgumentTypeError):
        keys_cli.parse_budget("lots/day")


def test_commands_call_the_admin_api(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[Any, ...]] = []

    def request(url: str, key: str, method: str, path: str, body: Any = None) -> Any:
        calls.append((url, key, method, path, body))
        if path.startswith("/admin/keys?") or (path == "/admin/keys" and method == "GET"):
            record = {"id": "key_1", "tenant": "acme", "name": "ci", "display": "sk-ab…wxyz",
                      "status": "active", "models": None, "budget": None}  # fmt: skip
            return 200, {"object": "list", "data": [record]}
        return 201, {"id": "key_1", "key": "sk-secret"}

    monkeypatch.setattr(keys_cli, "request", request)
    monkeypatch.setenv(keys_cli.ADMIN_KEY_ENV, "sk-admin")
    argv = ["keys", "create", "--tenant", "acme", "--name", "ci", "--models", "llm-small",
            "--budget", "0.05/day", "--expires", "2027-01-01", "--rpm", "10"]  # fmt: skip
    assert main(argv) == 0
    assert calls[-1] == (
        "http://127.0.0.1:8081", "sk-admin", "POST", "/admin/keys",
        {"tenant": "acme", "name": "ci", "models": ["llm-small"],
         "budget": {"amount": 0.05, "period": "day"}, "expires_at": "2027-01-01",
         "limits": {"requests_per_minute": 10}},
    )  # fmt: skip
    assert "sk-secret" in capsys.readouterr().out
    assert main(["keys", "--url", "http://gw:9", "list", "--tenant", "acme"]) == 0
    assert calls[-1][2:4] == ("GET", "/admin/keys?tenant=acme")
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["id", "tenant", "name"] and "key_1" in table
    assert main(["keys", "--admin-key", "k2", "update", "key_1", "--no-budget", "--name", "x"]) == 0
    assert calls[-1][1:] == ("k2", "PATCH", "/admin/keys/key_1", {"budget": None, "name": "x"})
    for command, method, path in [
        ("get", "GET", "/admin/keys/key_1"),
        ("revoke", "DELETE", "/admin/keys/key_1"),
        ("rotate", "POST", "/admin/keys/key_1/rotate"),
    ]:
        assert main(["keys", command, "key_1"]) == 0
        assert calls[-1][2:4] == (method, path)


def test_admin_of_makes_or_unmakes_a_tenant_s_admin(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def request(url: str, key: str, method: str, path: str, body: Any = None) -> Any:
        calls.append(body)
        return 200, {"id": "key_1"}

    monkeypatch.setattr(keys_cli, "request", request)
    monkeypatch.setenv(keys_cli.ADMIN_KEY_ENV, "sk-admin")
    argv = ["keys", "create", "--tenant", "acme", "--name", "ops", "--admin-of", "acme"]
    assert main(argv) == 0
    assert calls[-1] == {"tenant": "acme", "name": "ops", "admin_of": "acme"}
    assert main(["keys", "update", "key_1", "--no-admin"]) == 0
    assert calls[-1] == {"admin_of": None}
    assert main(["keys", "update", "key_1", "--admin-of", "acme"]) == 0
    assert calls[-1] == {"admin_of": "acme"}


def test_mcp_tools_narrow_a_key_or_give_it_all_of_its_tenant_s(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Any] = []

    def request(url: str, key: str, method: str, path: str, body: Any = None) -> Any:
        calls.append(body)
        if method == "GET":
            records = [
                {"id": "key_1", "tenant": "acme", "name": "ci", "models": None,
                 "budget": None, "mcp_tools": ["notes/echo", "github/*"]},
                {"id": "key_2", "tenant": "acme", "name": "ci", "models": None,
                 "budget": None, "mcp_tools": None},
                {"id": "key_3", "tenant": "acme", "name": "ci", "models": None,
                 "budget": None, "mcp_tools": []},
            ]  # fmt: skip
            return 200, {"object": "list", "data": records}
        return 200, {"id": "key_1"}

    monkeypatch.setattr(keys_cli, "request", request)
    monkeypatch.setenv(keys_cli.ADMIN_KEY_ENV, "sk-admin")
    argv = ["keys", "create", "--tenant", "acme", "--name", "ci", "--mcp-tools",
            "notes/echo, github/*"]  # fmt: skip
    assert main(argv) == 0
    assert calls[-1] == {"tenant": "acme", "name": "ci", "mcp_tools": ["notes/echo", "github/*"]}
    assert main(["keys", "create", "--tenant", "acme", "--name", "ci"]) == 0
    assert "mcp_tools" not in calls[-1]  # all of the tenant's
    assert main(["keys", "update", "key_1", "--mcp-tools", "notes"]) == 0
    assert calls[-1] == {"mcp_tools": ["notes"]}
    assert main(["keys", "update", "key_1", "--mcp-tools", ""]) == 0
    assert calls[-1] == {"mcp_tools": []}
    assert main(["keys", "update", "key_1", "--all-mcp-tools"]) == 0
    assert calls[-1] == {"mcp_tools": None}
    capsys.readouterr()
    assert main(["keys", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "mcp_tools"
    assert [line.split()[-1] for line in lines[1:]] == ["notes/echo,github/*", "*", "-"]


def test_an_error_answer_is_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        keys_cli, "request", lambda *a, **k: (400, {"error": {"message": "bad name"}})
    )
    assert main(["keys", "--admin-key", "k", "get", "key_1"]) == 1
    assert "HTTP 400: bad name" in capsys.readouterr().err
    monkeypatch.delenv(keys_cli.ADMIN_KEY_ENV, raising=False)
    assert main(["keys", "get", "key_1"]) == 2


def test_the_url_goes_before_or_after_the_subcommand_or_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the new-user review: `gateway keys create ... --url URL` was refused."""
    urls: list[str] = []

    def request(url: str, key: str, method: str, path: str, body: Any = None) -> Any:
        urls.append(url)
        return 200, {"object": "list", "data": []}

    monkeypatch.setattr(keys_cli, "request", request)
    monkeypatch.setenv(keys_cli.ADMIN_KEY_ENV, "sk-admin")
    assert main(["keys", "list", "--url", "http://after:1"]) == 0
    assert main(["keys", "--url", "http://before:2", "list"]) == 0
    monkeypatch.setenv(keys_cli.URL_ENV, "http://env:3")
    assert main(["keys", "list"]) == 0
    assert main(["keys", "list", "--url", "http://given:4"]) == 0
    assert urls == ["http://after:1", "http://before:2", "http://env:3", "http://given:4"]
