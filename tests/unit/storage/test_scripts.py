"""The Redis scripts live in the top-level `lua/`; an installed gateway must find them too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from gateway.storage import scripts

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = sorted(path.name for path in (ROOT / "lua").glob("*.lua"))


def test_a_checkout_reads_the_scripts_from_the_top_level_lua_directory() -> None:
    assert scripts.LUA_DIR == ROOT / "lua"
    assert {"take.lua", "adjust.lua", "bucket_time.lua"} <= set(SCRIPTS)
    for name in SCRIPTS:
        text = (ROOT / "lua" / name).read_text(encoding="utf-8")
        if "-- #include " not in text:
            assert scripts.read_script(name) == text


def test_what_take_and_adjust_share_is_one_file_included_in_both() -> None:
    """The shared code (the wait for a level, a budget's calendar) is written once, in
    bucket_time.lua, and each script as Redis runs it holds it whole, once, in its place."""
    shared = (ROOT / "lua" / "bucket_time.lua").read_text(encoding="utf-8")
    for name in ("take.lua", "adjust.lua"):
        written = (ROOT / "lua" / name).read_text(encoding="utf-8")
        assert "local function period_bounds" not in written
        run = scripts.read_script(name)
        assert run == written.replace("-- #include bucket_time.lua\n", shared)
        assert run.count("local function period_bounds") == 1


def test_a_wheel_carries_every_script_and_an_installed_gateway_loads_them(
    tmp_path: Path,
) -> None:
    # Built from a copy, so the checkout gets no build/ directory.
    source = tmp_path / "source"
    for name in ("gateway", "gateway_control", "gateway_tools", "lua"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [*pip[:-1], "wheel", str(source), "--no-deps", "--no-build-isolation", "-v",
         "-w", str(wheels)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    # A clean install: no packaging warning (setuptools warned of eval/templates, a data
    # directory without __init__.py that no `packages` entry named).
    assert "Warning" not in build.stdout + build.stderr, build.stderr[-3000:]
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    packed = sorted(n for n in names if n.endswith(".lua"))
    assert packed == [f"gateway/lua/{name}" for name in SCRIPTS]
    templates = sorted(
        p.name for p in (ROOT / "gateway_tools" / "eval" / "templates").glob("*.yaml")
    )
    assert templates
    assert [n for n in names if n.startswith("gateway_tools/eval/templates/")] == [
        f"gateway_tools/eval/templates/{name}" for name in templates
    ]

    # Installed (not editable) into a directory of its own, imported from there alone.
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    probe = (
        "import gateway, gateway.ratelimit.redis_store as store, gateway.storage.scripts as s;"
        "print(gateway.__file__); print(s.LUA_DIR); print(len(store.TAKE_LUA))"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    package_file, lua_dir, take_length = result.stdout.split()
    assert Path(package_file).is_relative_to(site)
    assert Path(lua_dir) == site / "gateway" / "lua"
    assert int(take_length) == len(scripts.read_script("take.lua"))
