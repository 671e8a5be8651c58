"""scripts/bootstrap.sh says what failed: a system package the command cannot run without
stops it with the package's name and the command that installs it; one that only a
feature needs (bubblewrap, for the demo: `gateway eval`'s sandbox) is named in one line
with what will not work. (It went on without a word when apt-get failed.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def bootstrap_without_packages(tmp_path: Path, role: str) -> subprocess.CompletedProcess[str]:
    """bootstrap.sh for `role` on a PATH with the shell's tools only: no redis-server,
    no bubblewrap, and no apt-get to install them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "id", "cat", "sha256sum", "cut", "tail"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", scripts / "bootstrap.sh")
    env = {"PATH": str(bin_dir), "PYTHON": sys.executable, "BOOTSTRAP_FOR": role,
           "HOME": os.environ.get("HOME", "/root")}  # fmt: skip
    return subprocess.run(
        [str(bin_dir / "bash"), str(scripts / "bootstrap.sh")],
        env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip


def test_a_package_the_demo_needs_stops_it_naming_the_command(tmp_path: Path) -> None:
    done = bootstrap_without_packages(tmp_path, "demo")
    assert done.returncode == 1
    assert "demo needs redis-server, which could not be installed" in done.stderr
    assert "apt-get install redis-server" in done.stderr
    # Only a feature's: named, with what will not work, and not a reason to stop.
    assert "bubblewrap is not installed: `gateway eval` will refuse to run" in done.stderr
    assert not (tmp_path / ".venv").exists()  # stopped before anything was installed


def test_the_tests_need_bubblewrap_too(tmp_path: Path) -> None:
    done = bootstrap_without_packages(tmp_path, "test")
    assert done.returncode == 1
    assert "test needs redis-server bubblewrap" in done.stderr
