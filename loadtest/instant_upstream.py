"""An upstream that answers at once: nginx with fixed responses.

Three ports from the one given: P an OpenAI-compatible chat answer, P+1 the same model
streaming (a whole SSE stream per request), P+2 a Triton server's HTTP generate
extension streaming (`generate_stream`), with its readiness and metrics endpoints.
nginx costs the benchmark little CPU, so what is measured is the gateway.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import orjson

CHAT_RESPONSE = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "fake-llama-8b",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello from the instant upstream."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }
).decode()

STREAM_CHUNKS = 20

# Ports start_nginx listens on, from the one it is given.
UPSTREAM_PORTS = 3


def _chunk(delta: dict[str, str], finish: str | None = None, **extra: object) -> str:
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "fake-llama-8b",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return "data: " + orjson.dumps(body).decode() + "\\n\\n"


# A whole streamed answer: STREAM_CHUNKS tokens, the finish chunk, usage, [DONE].
# (nginx turns each \n in the config string into a newline.)
STREAM_RESPONSE = (
    _chunk({"role": "assistant", "content": "tok0 "})
    + "".join(_chunk({"content": f"tok{i} "}) for i in range(1, STREAM_CHUNKS))
    + _chunk({}, "length")
    + "data: "
    + orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": STREAM_CHUNKS,
                      "total_tokens": 12 + STREAM_CHUNKS},
        }
    ).decode()
    + "\\n\\ndata: [DONE]\\n\\n"
)  # fmt: skip


def _triton_event(text: str) -> str:
    """One `generate_stream` event as Triton writes it for an LLM model with the outputs
    gateway/backends/triton_http.py reads (those of the simulator's model): the piece of
    text and its token counts, one output token a piece."""
    body = {
        "model_name": "fake-llama-8b",
        "model_version": "1",
        "num_cached_tokens": 0,
        "num_input_tokens": 12,
        "num_output_tokens": 1,
        "text_output": text,
    }
    return "data: " + orjson.dumps(body).decode() + "\\n\\n"


# A whole Triton stream: STREAM_CHUNKS pieces, the same tokens as STREAM_RESPONSE. Triton
# ends a decoupled model's stream by closing it (no [DONE]).
TRITON_STREAM_RESPONSE = "".join(_triton_event(f"tok{i} ") for i in range(STREAM_CHUNKS))

# What the gateway's health loop scrapes of a Triton replica: its queue, empty.
TRITON_METRICS = (
    "# TYPE nv_inference_pending_request_count gauge\\n"
    'nv_inference_pending_request_count{model="fake-llama-8b",version="1"} 0\\n'
)

_CONF = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  keepalive_requests 1000000;
  keepalive_timeout 60s;
  server {{
    listen 127.0.0.1:{port};
    location = /v1/chat/completions {{
      default_type application/json;
      return 200 '{chat}';
    }}
    location = /v1/models {{
      default_type application/json;
      return 200 '{{"object":"list","data":[{{"id":"fake-llama-8b","object":"model"}}]}}';
    }}
    # An OTLP/HTTP collector that takes every span and keeps none (the tracing bench).
    location = /v1/traces {{
      default_type application/x-protobuf;
      return 200 '';
    }}
  }}
  # The same model, streaming: every answer is a whole SSE stream.
  server {{
    listen 127.0.0.1:{stream_port};
    location = /v1/chat/completions {{
      default_type text/event-stream;
      return 200 '{stream}';
    }}
    location = /v1/models {{
      default_type application/json;
      return 200 '{{"object":"list","data":[]}}';
    }}
  }}
  # A Triton server's HTTP endpoints for that model, streaming (the generate extension).
  server {{
    listen 127.0.0.1:{triton_port};
    location ~ ^/v2/models/[^/]+/generate_stream$ {{
      default_type text/event-stream;
      return 200 '{triton_stream}';
    }}
    location ~ ^/v2/(health|models/[^/]+)/ready$ {{
      return 200 '';
    }}
    location = /metrics {{
      default_type text/plain;
      return 200 '{triton_metrics}';
    }}
  }}
}}
"""


def start_nginx(port: int) -> tuple[subprocess.Popen[bytes], Path]:
    """nginx serving the fixed responses on 127.0.0.1:`port`, in the foreground, a
    streamed answer on `port` + 1 and a Triton stream on `port` + 2 (UPSTREAM_PORTS)."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    workdir = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    conf = workdir / "nginx.conf"
    conf.write_text(
        _CONF.format(
            dir=workdir,
            port=port,
            stream_port=port + 1,
            chat=CHAT_RESPONSE,
            stream=STREAM_RESPONSE,
            triton_port=port + 2,
            triton_stream=TRITON_STREAM_RESPONSE,
            triton_metrics=TRITON_METRICS,
        )
    )
    process = subprocess.Popen(
        [nginx, "-c", str(conf), "-p", str(workdir), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return process, workdir
