"""uv.lock and the requirement files exported from it agree with pyproject.toml.

Every install reads the lock (bootstrap.sh for the tests, CI and the demo; the Dockerfile
for the image), so a range changed in pyproject.toml without `scripts/lock.sh`, or an
export edited by hand, would install something nobody locked. Both checks run offline:
`uv lock --locked` compares the lock with pyproject.toml's requirements without asking
the registry, and `uv export --frozen` only reads the lock.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
UV = Path(sys.executable).with_name("uv")
# Each exported file and the `uv export` options it is made with (scripts/lock.sh).
EXPORTS = {
    "requirements/runtime.txt": [],
    "requirements/demo.txt": ["--extra", "tools"],
    "requirements/dev.txt": ["--extra", "dev"],
    "requirements/build.txt": ["--only-group", "build"],
}


def uv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(UV), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_lock_holds_what_pyproject_asks_for() -> None:
    done = uv("lock", "--locked", "--offline", "--python", "3.11")
    assert done.returncode == 0, f"run scripts/lock.sh: {done.stderr.strip()}"


@pytest.mark.parametrize("path", EXPORTS)
def test_each_exported_requirements_file_is_the_lock_as_exported(path: str) -> None:
    done = uv(
        "export", "--quiet", "--frozen", "--no-emit-project", "--no-default-groups",
        *EXPORTS[path],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The first lines are uv's header, naming the command and its --output-file.
    exported = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    written = [line for line in (ROOT / path).read_text().splitlines() if not line.startswith("#")]
    assert written == exported, f"{path} differs from uv.lock: run scripts/lock.sh"
