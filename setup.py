"""Which packages the distribution holds; the rest of the metadata is in pyproject.toml.

The three programs' packages: `gateway/` (the server), `gateway_control/` (placement and
the closed loop) and `gateway_tools/` (the offline tools; `gateway_tools.eval.templates`,
data only, named by hand: it has no `__init__.py`), and the top-level `lua/` (the Redis
scripts) installed as `gateway/lua/`, where `gateway.storage.scripts` looks for it in an
installed gateway.
"""

from pathlib import Path

from setuptools import find_packages, setup

# A build from part of the tree builds what is there: the image's context holds the
# server and the control plane, not the tools.
DATA_ONLY = [name for name in ["gateway_tools.eval.templates"] if Path(*name.split(".")).is_dir()]

setup(
    packages=[
        *find_packages(include=["gateway", "gateway.*", "gateway_control", "gateway_control.*"]),
        *find_packages(include=["gateway_tools", "gateway_tools.*"]),
        *DATA_ONLY,
        "gateway.lua",
    ],
    package_dir={"gateway.lua": "lua"},
)
