"""An OpenAI-compatible inference gateway in front of NVIDIA Triton replicas."""

__version__ = "0.1.0"
