"""The Redis Lua scripts, kept as files in the top-level `lua/` directory.

In a source checkout (and an editable install) they are read from `lua/` beside the
`gateway` package; a wheel carries the same files as `gateway/lua/` (see `setup.py`).
Each is read once, by the module that registers it, and then called by SHA; what several
share is a file of its own, included (`-- #include bucket_time.lua`).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # gateway/
# Installed from a wheel: inside the package. From a checkout: next to it.
LUA_DIR = _PACKAGE / "lua" if (_PACKAGE / "lua").is_dir() else _PACKAGE.parent / "lua"


# A line that stands for another script's whole text (one level: what is included
# includes nothing), so that scripts share code without a copy in each.
_INCLUDE = "-- #include "


def read_script(name: str) -> str:
    """The text of `lua/<name>`, each `-- #include <file>` line replaced by that file."""
    lines = (LUA_DIR / name).read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(
        (LUA_DIR / line[len(_INCLUDE) :].strip()).read_text(encoding="utf-8")
        if line.startswith(_INCLUDE)
        else line
        for line in lines
    )
