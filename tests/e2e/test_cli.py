"""The `gateway` command's config checks, run as a user runs them: exit codes and
`file:line: message` output. No server is started (these take a second or two)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gateway_tools.dev.processes import free_port, gateway_command

SHIPPED = Path(__file__).resolve().parents[2] / "config"


def gateway(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gateway_command(*args), capture_output=True, text=True, timeout=60, cwd=cwd
    )


@pytest.fixture
def configs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped gateway.yaml, tenants.yaml and cluster.yaml."""
    for name in ("gateway.yaml", "tenants.yaml", "cluster.yaml"):
        shutil.copy(SHIPPED / name, tmp_path / name)
    for name in ("NODE_A_URL", "NODE_B_URL", "GATEWAY_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def edit(path: Path, old: str, new: str) -> int:
    """Replace the first `old` by `new`; the line it is on."""
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return text[: text.index(old)].count("\n") + 1


def test_the_shipped_config_is_ok() -> None:
    done = gateway("check-config", "--config", "config/gateway.yaml", cwd=SHIPPED.parent)
    assert (done.returncode, done.stdout) == (0, "config/gateway.yaml: ok\n"), done.stderr


def test_a_broken_tenants_file_fails_with_file_and_line(configs: Path) -> None:
    rpm = edit(configs / "tenants.yaml", "requests_per_minute: 600", "requests_per_minute: true")
    priority = edit(configs / "tenants.yaml", "priority: batch", "priority: bulk")

    for checked in ("gateway.yaml", "tenants.yaml"):  # with its gateway.yaml, or bare
        done = gateway("check-config", "--config", checked, cwd=configs)
        assert done.returncode == 1, done.stdout
        assert done.stdout.splitlines() == [
            f"tenants.yaml:{rpm}: tenants.acme.limits.requests_per_minute: "
            "Input should be a valid integer",
            f"tenants.yaml:{priority}: tenants.globex.priority: "
            "priority 'bulk' is not a class (online, batch)",
        ]


def test_a_control_character_fails_with_file_and_line(configs: Path) -> None:
    line = edit(configs / "tenants.yaml", "share: 3", "share: 3\x07")
    done = gateway("check-config", "--config", "gateway.yaml", cwd=configs)
    assert done.returncode == 1
    assert done.stdout.startswith(f"tenants.yaml:{line}: invalid YAML: character #x07 at column")
    assert "Traceback" not in done.stderr


def test_a_broken_cluster_file_fails_check_config_and_serve(configs: Path) -> None:
    gpus = edit(configs / "cluster.yaml", "gpus: 2", "gpus: -2")
    model = edit(configs / "cluster.yaml", "model: llm-small", "model: llm-tiny")
    small = edit(configs / "gateway.yaml", "llm-small:", "llm-small:")
    expected = [
        f"cluster.yaml:{gpus}: nodes[0].gpus: Input should be greater than 0",
        f"cluster.yaml:{model}: deployments[1].model: "
        "model 'llm-tiny' is not defined in gateway.yaml",
        f"gateway.yaml:{small}: models.llm-small.replicas: "
        "no replicas, and cluster.yaml has no deployment of 'llm-small'",
    ]

    done = gateway("check-config", "--config", "gateway.yaml", cwd=configs)
    assert (done.returncode, done.stdout.splitlines()) == (1, expected)

    served = gateway("serve", "--config", "gateway.yaml", "--port", str(free_port()), cwd=configs)
    assert served.returncode == 1
    assert served.stderr.splitlines()[-3:] == expected
    assert "Traceback" not in served.stderr


def test_a_missing_cluster_file_fails(configs: Path) -> None:
    (configs / "cluster.yaml").unlink()
    done = gateway("check-config", "--config", "gateway.yaml", cwd=configs)
    assert done.returncode == 1
    assert done.stdout == "cluster.yaml: cannot read file: No such file or directory\n"


def test_demo_refuses_a_broken_config_before_starting_anything(configs: Path) -> None:
    gpus = edit(configs / "cluster.yaml", "gpus: 2", "gpus: -2")
    done = gateway("demo", "--config", "gateway.yaml", "--port", str(free_port()), cwd=configs)
    assert done.returncode == 1
    assert f"cluster.yaml:{gpus}: nodes[0].gpus: Input should be greater than 0" in done.stderr
    assert "redis-server on" not in done.stdout and "triton-sim" not in done.stdout


def test_ambiguous_alias_patterns_fail_check_config_and_serve(configs: Path) -> None:
    # llm-large has `claude-*`: a pattern as specific for another model is ambiguous.
    line = edit(configs / "gateway.yaml", 'aliases: ["claude-haiku-*"]', 'aliases: ["claude-?*"]')
    large = edit(configs / "gateway.yaml", 'aliases: ["claude-*"', 'aliases: ["claude-*"')
    expected = [
        f"gateway.yaml:{line}: models.llm-small.aliases[0]: pattern 'claude-?*' (model "
        f"'llm-small') and 'claude-*' (model 'llm-large', line {large}) can match the same "
        "name and are as specific: which one serves it is ambiguous",
    ]
    done = gateway("check-config", "--config", "gateway.yaml", cwd=configs)
    assert (done.returncode, done.stdout.splitlines()) == (1, expected)

    served = gateway("serve", "--config", "gateway.yaml", "--port", str(free_port()), cwd=configs)
    assert served.returncode == 1
    assert served.stderr.splitlines()[-1:] == expected
    assert "Traceback" not in served.stderr


def test_a_tenant_alias_to_a_model_it_may_not_use_fails(configs: Path) -> None:
    line = edit(configs / "tenants.yaml", '"gpt-*": llm-small', '"gpt-*": llm-large')
    for checked in ("gateway.yaml", "tenants.yaml"):
        done = gateway("check-config", "--config", checked, cwd=configs)
        assert (done.returncode, done.stdout.splitlines()) == (
            1,
            [
                f"tenants.yaml:{line}: tenants.globex.aliases.gpt-*: tenant 'globex' may not "
                "use model 'llm-large' (its `models`)"
            ],
        )
