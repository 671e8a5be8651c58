"""Which packages the distribution holds; the rest of the metadata is in pyproject.toml.

Everything under `gateway/` (`gateway.eval.templates`, data only, named by hand: it has
no `__init__.py`), and the top-level `lua/` (the Redis scripts) installed as `gateway/lua/`,
where `gateway.storage.scripts` looks for it in an installed gateway.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["gateway", "gateway.*"]),
        "gateway.eval.templates",
        "gateway.lua",
    ],
    package_dir={"gateway.lua": "lua"},
)
