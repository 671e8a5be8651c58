"""The Redis Lua scripts, kept as files in the top-level `lua/` directory.

In a source checkout (and an editable install) they are read from `lua/` beside the
`gateway` package; a wheel carries the same files as `gateway/lua/` (see `setup.py`).
Each is read once, by the module that registers it, and then called by SHA.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # gateway/
# Installed from a wheel: inside the package. From a checkout: next to it.
LUA_DIR = _PACKAGE / "lua" if (_PACKAGE / "lua").is_dir() else _PACKAGE.parent / "lua"


def read_script(name: str) -> str:
    """The text of `lua/<name>`."""
    return (LUA_DIR / name).read_text(encoding="utf-8")
