"""Model profiles and the on-disk model repository that `tritonserver` serves.

The layout written by `write_repository(root, profiles)`:

    root/repo/<model>/config.pbtxt          decoupled Python-backend model
    root/repo/<model>/1/model.py            a copy of gateway_tools/dev/sim/model_template.py
                                            (embedding_template.py for `embed*` models)
    root/backends/python/*                  symlinks into the installed pytriton wheel
"""

from __future__ import annotations

import importlib.util
import math
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

MODEL_TEMPLATE = Path(__file__).with_name("model_template.py")
EMBEDDING_TEMPLATE = Path(__file__).with_name("embedding_template.py")
SYNC_SUFFIX = "-sync"
# Models named so are embedding models (text in, a vector out), of this many dimensions.
EMBEDDING_PREFIX = "embed"
EMBEDDING_DIMENSIONS = 256
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ModelProfile:
    """How fast one simulated model is."""

    name: str
    token_delay: float  # seconds per generated token
    prefill_per_char: float  # seconds per prompt byte before the first token
    # A file of recorded answers that the model replays (gateway_tools/dev/replay.py), if any.
    replay_file: str | None = None
    # Prompts the model computes at once (0: any number); 1 makes prefill a queue, as on
    # a GPU, so that time to first token grows with load and shrinks with cache hits.
    prefill_slots: int = 0
    # The inputs it takes: the generic convention's, or those of Triton's vLLM backend
    # or TensorRT-LLM's ensemble (`INTERFACE_INPUTS`), so that the gateway's
    # `triton_interface` is tested against a real Triton.
    interface: str = "generic"

    @property
    def decoupled(self) -> bool:
        """Streaming (decoupled) unless the name ends in `-sync`: such a model answers once
        per request and Triton runs its requests one at a time, queueing the rest (so
        `nv_inference_pending_request_count` shows its queue)."""
        return not self.name.endswith(SYNC_SUFFIX) and not self.embedding

    @property
    def embedding(self) -> bool:
        """An embedding model (`embedding_template.py`): its name starts with `embed`."""
        return self.name.startswith(EMBEDDING_PREFIX)


LARGE = ModelProfile("llm-large", token_delay=0.04, prefill_per_char=0.0004)
SMALL = ModelProfile("llm-small", token_delay=0.008, prefill_per_char=0.00005)
# An embedding model has no tokens to generate: only its time per input byte counts.
EMBED = ModelProfile("embed-small", token_delay=0.0, prefill_per_char=0.00001)
# Each simulated LLM's prefix cache (model_template.PrefixCache): blocks of 16 tokens (as
# vLLM's default), 4096 of them (64 K tokens, 256 KB of prompt text).
BLOCK_TOKENS = 16
PREFIX_CACHE_BLOCKS = 4096
# A replaying model streams recorded answers of a few KB: 2 ms a 16-byte piece.
REPLAY_TOKEN_DELAY = 0.002
_KNOWN = {LARGE.name: LARGE, SMALL.name: SMALL, EMBED.name: EMBED}


def profile_for(name: str, token_delay_ms: float | None = None) -> ModelProfile:
    """The profile for `name`: a known one, the small one, or an explicit token delay.

    With `token_delay_ms`, prefill costs a hundredth of a token delay per byte.
    """
    if not _NAME.match(name):
        raise ValueError(f"invalid model name {name!r}: use letters, digits, '_', '.', '-'")
    if token_delay_ms is None:
        base = _KNOWN.get(name, EMBED if name.startswith(EMBEDDING_PREFIX) else SMALL)
        return ModelProfile(name, base.token_delay, base.prefill_per_char)
    if not (math.isfinite(token_delay_ms) and token_delay_ms >= 0):
        raise ValueError(f"token delay for {name!r} must be >= 0 ms, got {token_delay_ms}")
    token_delay = token_delay_ms / 1000
    return ModelProfile(name, token_delay, token_delay / 100)


def parse_models(spec: str) -> list[ModelProfile]:
    """Parse a `--models` value such as `llm-large,llm-small,fast=1,coder=@answers.json`.

    `name=MS` sets the per-token delay in milliseconds; `name=@FILE` makes a model that
    replays the recorded answers in FILE; `name:vllm` or `name:tensorrtllm` one that takes
    the inputs of Triton's vLLM backend or TensorRT-LLM's ensemble (`qwen:vllm=8`).
    """
    profiles: list[ModelProfile] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, sep, delay = item.partition("=")
        name, _, interface = name.strip().partition(":")
        profile = _profile(name, sep, delay)
        if interface:
            if interface not in INTERFACE_INPUTS:
                choices = " or ".join(sorted(INTERFACE_INPUTS))
                raise ValueError(f"{item!r}: the inputs of {choices}, not {interface!r}")
            profile = replace(profile, interface=interface)
        profiles.append(profile)
    names = [p.name for p in profiles]
    if not names:
        raise ValueError("no models given")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate model names: {', '.join(duplicates)}")
    return profiles


def _profile(name: str, sep: str, delay: str) -> ModelProfile:
    """One model of a `--models` value: its name, and what followed an `=`."""
    if delay.startswith("@"):
        if not Path(delay[1:]).is_file():
            raise ValueError(f"{name}: no file of recorded answers at {delay[1:]!r}")
        base = profile_for(name, REPLAY_TOKEN_DELAY * 1000)
        return ModelProfile(name, base.token_delay, base.prefill_per_char, delay[1:])
    try:
        delay_ms = float(delay) if sep else None
    except ValueError:
        item = f"{name}{sep}{delay}"
        raise ValueError(f"bad token delay in {item!r}: expected name=MILLISECONDS") from None
    return profile_for(name, delay_ms)


# The inputs each interface declares beyond `text_input` (name, type, dims), as the
# backends' own configs name them (vLLM's auto-completed config; TensorRT-LLM's ensemble).
_FLAGS = ("stream", "exclude_input_in_output", "return_num_input_tokens",
          "return_num_output_tokens")  # fmt: skip
INTERFACE_INPUTS: dict[str, list[tuple[str, str, str]]] = {
    "generic": [("max_tokens", "TYPE_INT32", "1"), ("stream", "TYPE_BOOL", "1")],
    "vllm": [
        *((flag, "TYPE_BOOL", "1") for flag in _FLAGS),
        ("sampling_parameters", "TYPE_STRING", "1"),
    ],
    "tensorrtllm": [
        ("max_tokens", "TYPE_INT32", "1"),
        *((flag, "TYPE_BOOL", "1") for flag in _FLAGS),
        ("return_log_probs", "TYPE_BOOL", "1"),
        ("temperature", "TYPE_FP32", "1"),
        ("top_p", "TYPE_FP32", "1"),
        ("seed", "TYPE_UINT64", "1"),
        ("stop_words", "TYPE_STRING", "-1"),
        ("guided_decoding_guide_type", "TYPE_STRING", "1"),
        ("guided_decoding_guide", "TYPE_STRING", "1"),
    ],
}


def render_config(profile: ModelProfile) -> str:
    """The config.pbtxt of one simulated model."""
    if profile.embedding:
        return _render_embedding_config(profile)
    policy = "model_transaction_policy { decoupled: true }\n" if profile.decoupled else ""
    inputs = "".join(
        f',\n  {{ name: "{name}" data_type: {kind} dims: [ {dims} ] optional: true }}'
        for name, kind, dims in INTERFACE_INPUTS[profile.interface]
    )
    return f"""\
name: "{profile.name}"
backend: "python"
max_batch_size: 0
{policy}input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }}{inputs}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "output_log_probs" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "num_cached_tokens" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "token_delay" value {{ string_value: "{profile.token_delay!r}" }} }}
parameters {{ key: "prefill_per_char" value {{ string_value: "{profile.prefill_per_char!r}" }} }}
parameters {{ key: "prefix_cache_blocks" value {{ string_value: "{PREFIX_CACHE_BLOCKS}" }} }}
parameters {{ key: "block_tokens" value {{ string_value: "{BLOCK_TOKENS}" }} }}
parameters {{ key: "prefill_slots" value {{ string_value: "{profile.prefill_slots}" }} }}
parameters {{ key: "interface" value {{ string_value: "{profile.interface}" }} }}
{_replay_parameter(profile)}"""


def _replay_parameter(profile: ModelProfile) -> str:
    if profile.replay_file is None:
        return ""
    path = str(Path(profile.replay_file).resolve())
    return f'parameters {{ key: "replay_file" value {{ string_value: "{path}" }} }}\n'


def _render_embedding_config(profile: ModelProfile) -> str:
    return f"""\
name: "{profile.name}"
backend: "python"
max_batch_size: 0
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ -1 ] }}
]
output [
  {{ name: "embedding" data_type: TYPE_FP32 dims: [ -1, {EMBEDDING_DIMENSIONS} ] }},
  {{ name: "num_input_tokens" data_type: TYPE_INT32 dims: [ -1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "dimensions" value {{ string_value: "{EMBEDDING_DIMENSIONS}" }} }}
parameters {{ key: "delay_per_char" value {{ string_value: "{profile.prefill_per_char!r}" }} }}
"""


def tritonserver_dir() -> Path:
    """`pytriton/tritonserver` of the installed nvidia-pytriton wheel (not imported: slow)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "nvidia-pytriton is not installed: pip install 'inference-gateway[tools]'"
        )
    return Path(spec.origin).parent / "tritonserver"


@dataclass(frozen=True)
class RepositoryLayout:
    """Paths of a generated repository."""

    model_repository: Path
    backend_directory: Path


def write_backends(backend_directory: Path, server_dir: Path | None = None) -> None:
    """Link the Python backend and the stub for this interpreter's version."""
    server_dir = server_dir or tritonserver_dir()
    python_dir = backend_directory / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    sources = [
        server_dir / "backends" / "python" / "libtriton_python.so",
        server_dir / "backends" / "python" / "triton_python_backend_utils.py",
        server_dir / "python_backend_stubs" / version / "triton_python_backend_stub",
    ]
    for source in sources:
        if not source.exists():
            raise RuntimeError(f"missing {source} in the nvidia-pytriton wheel")
        (python_dir / source.name).symlink_to(source)


def write_repository(root: Path, profiles: Sequence[ModelProfile]) -> RepositoryLayout:
    """Write the model repository and the backends directory under `root`."""
    layout = RepositoryLayout(root / "repo", root / "backends")
    write_backends(layout.backend_directory)
    for profile in profiles:
        version_dir = layout.model_repository / profile.name / "1"
        version_dir.mkdir(parents=True)
        (version_dir.parent / "config.pbtxt").write_text(render_config(profile))
        template = EMBEDDING_TEMPLATE if profile.embedding else MODEL_TEMPLATE
        shutil.copyfile(template, version_dir / "model.py")
    return layout
