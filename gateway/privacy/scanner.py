"""Finding sensitive data in text, and masking it with typed placeholders."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.privacy.patterns import Detector


@dataclass(frozen=True, slots=True)
class Finding:
    start: int
    end: int
    category: str


class Scanner:
    """Finds what `detectors` describe. Where two findings overlap, the one that starts
    first is kept; at the same start, the one whose detector comes first (a URL's
    password before an e-mail address, a card number before a phone number)."""

    def __init__(self, detectors: Sequence[Detector]) -> None:
        self._detectors = tuple(detectors)

    def find(self, text: str) -> list[Finding]:
        """The findings in `text`, in order, none overlapping."""
        lowered = text.lower()
        found: list[tuple[int, int, Finding]] = []
        for rank, detector in enumerate(self._detectors):
            if not detector.may_match(text, lowered):
                continue
            for match in detector.matches(text):
                start, end = detector.span(match)
                if end > start and (detector.valid is None or detector.valid(text[start:end])):
                    found.append((start, rank, Finding(start, end, detector.category)))
        found.sort(key=lambda entry: entry[:2])
        kept: list[Finding] = []
        for _, _, finding in found:
            if not kept or finding.start >= kept[-1].end:
                kept.append(finding)
        return kept


class Masker:
    """Replaces findings with typed placeholders (`[EMAIL_1]`, `[API_KEY_2]`), the same
    value by the same placeholder across every text of one request."""

    def __init__(self) -> None:
        self._placeholders: dict[tuple[str, str], str] = {}
        self._numbers: Counter[str] = Counter()
        # Findings by category, values left out.
        self.counts: Counter[str] = Counter()

    def mask(self, text: str, findings: Sequence[Finding]) -> str:
        """`text` with each of `findings` (from `Scanner.find(text)`) replaced."""
        if not findings:
            return text
        parts = []
        position = 0
        for finding in findings:
            parts.append(text[position : finding.start])
            parts.append(self._placeholder(finding.category, text[finding.start : finding.end]))
            position = finding.end
        parts.append(text[position:])
        return "".join(parts)

    def _placeholder(self, category: str, value: str) -> str:
        self.counts[category] += 1
        key = (category, value)
        placeholder = self._placeholders.get(key)
        if placeholder is None:
            self._numbers[category] += 1
            placeholder = f"[{category.upper()}_{self._numbers[category]}]"
            self._placeholders[key] = placeholder
        return placeholder
