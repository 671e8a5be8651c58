"""What the outbound scan costs a request to an external model, per KB.

    .venv/bin/python loadtest/outbound_scan.py
    PYTHONPATH=/path/to/an/older/checkout .venv/bin/python loadtest/outbound_scan.py

Times `OutboundGuard.prepare` (gateway.serving.outbound), the whole of what the request
path runs for an external model: under `block` (the scan) and under `mask` (the scan
and the masked copy), for chat requests of 4 KB of text each. Run by path with another
checkout on PYTHONPATH, it times that checkout's guard on the same texts: the figures
before and after a change, side by side (the first line says which `gateway` ran).

Texts: typical ones (this repository's docs and Python source, prose with a finding
every ~200 bytes, prose in other scripts) and adversarial ones, each built to make one
step of the scan work hardest: invisible characters between all letters, look-alike
and fullwidth letters throughout, JSON and percent escapes throughout, base64 runs that
decode to text, numbers with odd separators, and the shapes that make regular
expressions backtrack. And one request whose 4 KB are tool definitions (JSON Schemas).
"""

from __future__ import annotations

import base64
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gateway
from gateway.config import Config, GatewayConfig, ModelConfig, Tenant, TenantsConfig
from gateway.inference.types import (
    ChatMessage,
    ChatOptions,
    InferenceRequest,
    RequestKind,
    SamplingParams,
    Tool,
)
from gateway.serving.outbound import OutboundGuard, SensitiveDataBlocked

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 4096
FINDINGS = [
    "mail jane.doe@example.com",
    "card 4111 1111 1111 1111",
    "call +49 30 1234567",
    "key sk-proj-Zx81Qw0aLm2Pq9",
    "on pg1.corp.example.com",
    "password=hunter2-horse",
]


def typical() -> dict[str, str]:
    prose = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    code = "\n".join(p.read_text() for p in sorted((ROOT / "gateway").rglob("*.py")))
    words = prose.split(" ")
    seeded = []
    for i in range(0, len(words), 30):  # ~200 bytes of prose, then a finding
        seeded.append(" ".join(words[i : i + 30]))
        seeded.append(FINDINGS[(i // 30) % len(FINDINGS)])
    scripts = (
        "Привет, как дела? Сегодня мы обсуждаем архитектуру шлюза. "
        "今日はゲートウェイの設計について話します。"
        "Η πύλη στέλνει αιτήματα σε εξωτερικά μοντέλα. "  # noqa: RUF001 - Greek prose
        "مرحبا، هذا نص عربي قصير. "
        "नमस्ते, यह एक छोटा हिंदी पाठ है। 👋🏽 👨‍👩‍👧 ❤️ "
    )
    return {
        "prose": prose[:65536],
        "code": code[:65536],
        "prose + findings": " ".join(seeded)[:65536],
        "other scripts": (scripts * 400)[:32768],
    }


def adversarial() -> dict[str, str]:
    rng = random.Random(7)
    prose = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))[:16384]
    letters = "abcdefghijklmnopqrstuvwxyz"
    fullwidth = "".join(chr(ord(c) - 0x21 + 0xFF01) if "!" <= c <= "~" else c for c in prose)
    # Latin letters swapped for their Cyrillic look-alikes.
    cyrillic = (
        "\u0430\u0435\u043e\u0440\u0441\u0445\u0443"
        "\u0410\u0415\u041d\u041a\u041c\u041e\u0420\u0421\u0422\u0425"
    )
    homoglyphs = prose.translate(str.maketrans("aeopcxyAEHKMOPCTX", cyrillic))
    sentence = "The quick brown fox jumps over the lazy dog, and the key is here. "
    blobs = " ".join(
        base64.b64encode((sentence * rng.randint(1, 3)).encode()).decode() for _ in range(200)
    )
    numbers = " ".join(
        f"{rng.randint(1000, 9999)}.{rng.randint(1000, 9999)}/{rng.randint(10, 99)}"
        f"_{rng.randint(100, 999)}" + rng.choice([" - ", " / ", ".", "  "]) + str(rng.randint(1, 9))
        for _ in range(3000)
    )
    return {
        "zero-width between letters": "\u200b".join(prose)[:16384],
        "fullwidth letters": fullwidth[:16384],
        "Cyrillic look-alikes": homoglyphs[:16384],
        "JSON escapes": "".join(f"\\u{ord(c):04x}" for c in prose)[:32768],
        "percent escapes": "".join(f"%{b:02X}" for b in prose.encode())[:32768],
        "base64 of text": blobs[:32768],
        "numbers, odd separators": numbers[:32768],
        "digit soup": "".join(rng.choice("0123456789 .-/_") for _ in range(32768)),
        "regex backtracking": (
            "x." * 2000
            + "a" * 4000
            + "@" * 2000
            + "password=" * 400
            + "https://a:" * 400
            + "".join(rng.choice(letters + letters.upper() + "0123456789+/") for _ in range(8000))
        )[:32768],
    }


def schema_request(size: int) -> InferenceRequest:
    """A chat request of a short question and `size` characters of tool definitions."""
    tools = []
    while sum(len(str(t)) for t in tools) < size:
        n = len(tools)
        tools.append(
            Tool(
                name=f"tool_{n}",
                description=f"Looks up record {n} in the inventory and returns its fields.",
                parameters={
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": "The record's id"},
                        "limit": {"type": "integer", "default": 10, "examples": [5, 10]},
                        "sort": {"type": "string", "enum": ["asc", "desc"]},
                    },
                    "required": ["id"],
                },
            )
        )
    return chat("Which records are low on stock?", ChatOptions(tools=tuple(tools)))


def chat(text: str, options: Any = None) -> InferenceRequest:
    return InferenceRequest(
        RequestKind.CHAT,
        "hosted",
        SamplingParams(max_tokens=16),
        messages=(ChatMessage("system", "You are helpful."), ChatMessage("user", text)),
        options=options if options is not None else ChatOptions(),
    )


def guard(policy: str) -> OutboundGuard:
    model = ModelConfig.model_validate(
        {"backend": "openai", "replicas": [{"url": "http://x"}], "external": True}
    )
    tenant = Tenant.model_validate({"api_keys": ["x"], "outbound": {"policy": policy}})
    return OutboundGuard(
        Config(
            gateway=GatewayConfig(
                models={"hosted": model}, outbound={"internal_domains": ["corp.example.com"]}
            ),
            tenants=TenantsConfig(tenants={"acme": tenant}),
            tenant_by_key_hash={},
            gateway_path="",
            tenants_path="",
        )
    )


def per_kb(run: Callable[[InferenceRequest], object], requests: list[InferenceRequest]) -> float:
    """Microseconds per KB of text of `run` over `requests`, best of 5."""
    size = sum(len(m.content.encode()) for r in requests for m in r.messages)
    size += sum(len(str(t).encode()) for r in requests for t in r.options.tools)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for request in requests:
            run(request)
        best = min(best, time.perf_counter() - started)
    return best * 1e6 / (size / 1024)


def main() -> None:
    print(f"gateway: {Path(gateway.__file__).parent}")
    tenant_mask = Tenant.model_validate({"api_keys": ["x"], "outbound": {"policy": "mask"}})
    tenant_block = Tenant.model_validate({"api_keys": ["x"], "outbound": {"policy": "block"}})
    masking, blocking = guard("mask"), guard("block")

    def mask(request: InferenceRequest) -> object:
        return masking.prepare("acme", tenant_mask, ["hosted"], request, "id")

    def block(request: InferenceRequest) -> object:
        try:
            return blocking.prepare("acme", tenant_block, ["hosted"], request, "id")
        except SensitiveDataBlocked:
            return None

    print("| text | scan (block) | scan + mask |")
    print("|---|---|---|")
    rows = {**typical(), **adversarial()}
    for name, text in rows.items():
        requests = [chat(text[i : i + CHUNK]) for i in range(0, len(text), CHUNK)]
        print(
            f"| {name} | {per_kb(block, requests):.0f} µs/KB | {per_kb(mask, requests):.0f} µs/KB |"
        )
    requests = [schema_request(CHUNK) for _ in range(8)]
    print(
        f"| tool definitions | {per_kb(block, requests):.0f} µs/KB "
        f"| {per_kb(mask, requests):.0f} µs/KB |"
    )


if __name__ == "__main__":
    main()
