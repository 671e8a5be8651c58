"""Simulated LLMs served by the real tritonserver binary on the CPU.

`TritonSim` starts `tritonserver` on a generated model repository of decoupled
Python-backend models (see `model_template.py`) that answer with deterministic text at
a configurable prefill and per-token speed. `run_triton_sim` is `gateway triton-sim`.
"""

from gateway_tools.dev.sim.repository import LARGE, SMALL, ModelProfile, parse_models, profile_for
from gateway_tools.dev.sim.server import TritonSim, TritonSimError, run_triton_sim

__all__ = [
    "LARGE",
    "SMALL",
    "ModelProfile",
    "TritonSim",
    "TritonSimError",
    "parse_models",
    "profile_for",
    "run_triton_sim",
]
