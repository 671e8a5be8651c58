"""gateway.config.source against what a config path may name by mistake or by malice: a
device, a FIFO, a huge file, aliases that expand a small file into a huge one, a file
that is no config (its lines must not be echoed). Each is refused in one line, at once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.config import check_config
from gateway.config.source import MAX_ALIAS_EXPANSIONS, MAX_FILE_BYTES, read_source


def problems_of(path: str | Path) -> list[str]:
    return [str(p) for p in read_source(str(path)).problems]


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom", "/tmp"])
def test_what_is_no_regular_file_is_refused_unread(path: str) -> None:
    assert problems_of(path) == [f"{path}: cannot read file: not a regular file"]


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "gateway.yaml"
    os.mkfifo(fifo)
    assert problems_of(fifo) == [f"{fifo}: cannot read file: not a regular file"]


def test_a_file_past_the_size_cap_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "tenants.yaml"
    big.write_bytes(b"# " + b"x" * MAX_FILE_BYTES + b"\n")
    assert problems_of(big) == [f"{big}: cannot read file: larger than 4 MiB"]


def test_a_billion_laughs_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    bomb = tmp_path / "cluster.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    message = f"invalid YAML: aliases expand to more than {MAX_ALIAS_EXPANSIONS:,} values"
    assert problems_of(bomb) == [f"{bomb}: {message}"]


def test_aliases_as_configs_use_them_are_read(tmp_path: Path) -> None:
    # 2,000 tenants sharing their limits by a merge: 6,000 values built again, well
    # below the cap.
    lines = ["defaults: &limits {requests_per_minute: 60, tokens_per_minute: 1000}"]
    lines += [f"t{i}: {{<<: *limits, name: t{i}}}" for i in range(2000)]
    config = tmp_path / "tenants.yaml"
    config.write_text("\n".join(lines) + "\n")
    source = read_source(str(config))
    assert source.problems == []
    assert source.data["t1999"] == {"requests_per_minute": 60, "tokens_per_minute": 1000,
                                    "name": "t1999"}  # fmt: skip


def test_a_file_that_is_no_config_is_not_echoed(tmp_path: Path) -> None:
    # As a secrets file named by mistake: its lines must not reach the output.
    (tmp_path / "gateway.yaml").write_text("root:$6$salt$hash:20228:0:99999:7::: x\n")
    problems = check_config(str(tmp_path / "gateway.yaml"))
    assert problems and not any("$6$salt" in p for p in problems), problems
