"""What outbound sanitization and log redaction cost per KB of prompt.

    .venv/bin/python -m loadtest.sanitizer_cost [--detect-secrets]

Texts: this repository's docs (prose), its Python source (code), and prose with a
finding every ~200 bytes (secrets, e-mails, cards, phones, internal hosts). For each:
microseconds per KB to scan (what `block` pays), to scan and mask (`mask`), and to
redact a log line of it (`log_prompts`). `--detect-secrets` also times Yelp's
detect-secrets (if importable) on the same prose, line by line, as its scanner works.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from gateway.observability.logging import redact
from gateway.privacy.patterns import PERSONAL, SECRETS, host_detector
from gateway.privacy.scanner import Masker, Scanner

ROOT = Path(__file__).resolve().parent.parent
FINDINGS = [
    "mail jane.doe@example.com",
    "card 4111 1111 1111 1111",
    "call +49 30 1234567",
    "key sk-proj-Zx81Qw0aLm2Pq9",
    "on pg1.corp.example.com",
    "password=hunter2-horse",
]


def texts() -> dict[str, str]:
    prose = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    code = "\n".join(p.read_text() for p in sorted((ROOT / "gateway").rglob("*.py")))
    words = prose.split(" ")
    seeded = []
    for i in range(0, len(words), 30):  # ~200 bytes of prose, then a finding
        seeded.append(" ".join(words[i : i + 30]))
        seeded.append(FINDINGS[(i // 30) % len(FINDINGS)])
    return {
        "prose": prose[:65536],
        "code": code[:65536],
        "prose + findings": " ".join(seeded)[:65536],
    }


def per_kb(run: Callable[[str], object], text: str, chunk: int = 4096) -> float:
    """Microseconds per KB of `run` over `text`, in prompts of `chunk` bytes."""
    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for piece in pieces:
            run(piece)
        best = min(best, time.perf_counter() - started)
    return best * 1e6 / (len(text) / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--detect-secrets", action="store_true")
    args = parser.parse_args()
    hosts = host_detector(("corp.example.com",))
    assert hosts is not None
    scanner = Scanner([*SECRETS, *PERSONAL, hosts])

    def mask(text: str) -> str:
        return Masker().mask(text, scanner.find(text))

    print("| text | findings per KB | scan (block) | scan + mask | log redaction |")
    print("|---|---|---|---|---|")
    for name, text in texts().items():
        density = len(scanner.find(text)) / (len(text) / 1024)
        print(
            f"| {name} | {density:.1f} | {per_kb(scanner.find, text):.0f} µs/KB "
            f"| {per_kb(mask, text):.0f} µs/KB | {per_kb(redact, text):.0f} µs/KB |"
        )
    if args.detect_secrets:
        from detect_secrets.core.scan import scan_line
        from detect_secrets.settings import default_settings

        prose = texts()["prose"][:8192]
        with default_settings():

            def scan(text: str) -> None:
                for line in text.splitlines():
                    list(scan_line(line))

            print(f"| prose, detect-secrets | | {per_kb(scan, prose):.0f} µs/KB | | |")


if __name__ == "__main__":
    main()
