"""Finding sensitive data in text, and masking it with typed placeholders.

`Scanner.find` reads a text as it is written (log redaction, `gateway eval`);
`Scanner.find_deep` reads it as a model would (outbound sanitization): also normalized
(`gateway.privacy.normalizer`: escapes, HTML references, percent-encoding, Unicode forms,
invisible characters, look-alike letters, separators inside numbers), with numbers split
across lines or table cells joined (`gateway.privacy.joiner`), and inside encoded runs
(`gateway.privacy.decoder`: base64, base64url, hex). Its findings are spans of the text
as written, keyed by the normalized value, so `Masker` gives a secret one placeholder in
every form.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gateway.privacy.decoder import MIN_RUN, encoded_runs
from gateway.privacy.joiner import join_split
from gateway.privacy.normalizer import Normalized, group_digits, normalize
from gateway.privacy.patterns import Detector

# Every number a numeric detector finds (a card, a phone or social security number, an
# IBAN) has seven digits at least, none more than four characters from the next.
_SEVEN_DIGITS = re.compile(r"\d(?:[^\d\n]{0,4}\d){6}")
# Encoded runs are decoded this many times over (base64 of base64 of text), no more:
# each level costs a scan of what it decoded to.
MAX_DECODE_DEPTH = 2


@dataclass(frozen=True, slots=True)
class Finding:
    start: int
    end: int
    category: str
    # What the placeholder is numbered by: the value as normalized, so `jane@x.com` with
    # a Cyrillic `a` and with a Latin one are one address; None: the text as written.
    key: str | None = None
    # An encoded run: the findings in the text it decodes to. The whole run is masked,
    # as their placeholders (where the run's characters are is not where theirs are).
    inner: tuple[Finding, ...] = ()

    def leaves(self) -> Iterator[Finding]:
        """This finding, or for an encoded run the findings it holds (each counted)."""
        if not self.inner:
            yield self
            return
        for finding in self.inner:
            yield from finding.leaves()


class Scanner:
    """Finds what `detectors` describe. Where two findings overlap, the one that starts
    first is kept; at the same start, the one whose detector comes first (a URL's
    password before an e-mail address, a card number before a phone number)."""

    def __init__(self, detectors: Sequence[Detector]) -> None:
        self._detectors = tuple(detectors)
        self._numeric = tuple(d for d in self._detectors if d.numeric)
        self._joinable = tuple(d for d in self._detectors if d.split_valid is not None)
        markers = {marker for d in self._detectors for marker in d.markers}
        # Whether a text holds any marker at all, in one search: most short strings (a
        # schema's `"type": "string"`) hold none, and then no marked detector is tried.
        self._any_marker = (
            re.compile("|".join(re.escape(m) for m in sorted(markers))) if markers else None
        )

    def find(self, text: str) -> list[Finding]:
        """The findings in `text`, in order, none overlapping."""
        return _find(text, self._detectors, self._any_marker)

    def find_deep(self, text: str, depth: int = 0) -> list[Finding]:
        """The findings in `text` as a model reads it, in order, none overlapping: as
        written, normalized, with the separators inside numbers read as spaces, with
        numbers split across lines or table cells joined, and in encoded runs that
        decode to text (`depth` levels down so far).

        Each is a span of `text` as written, keyed by its normalized value. Where two
        readings find overlapping spans, their union is one finding: masking covers all
        that any reading found.
        """
        normalized = normalize(text)
        grouped = group_digits(normalized)
        found: list[Finding] = []
        if depth < MAX_DECODE_DEPTH and len(normalized.text) >= MIN_RUN:
            for run in encoded_runs(normalized.text):
                inner = self.find_deep(run.decoded, depth + 1)
                if inner:
                    start, end = normalized.span(run.start, run.end)
                    found.append(Finding(start, end, inner[0].category, None, tuple(inner)))
        found.extend(_keyed(normalized, self.find(normalized.text)))
        if grouped is not normalized:
            # Only a number whose separators changed reads differently: the numeric
            # patterns are tried around those (a scan of the whole text again would cost
            # a third more on prose, which has a decimal number here and there).
            near = _find_near(grouped.text, self._numeric, grouped.edited())
            found.extend(_keyed(grouped, near))
        if self._joinable:
            joined = join_split(grouped)
            if joined is not grouped:
                # Only around the joins, and only what passes the stricter test of a
                # number read that way (a row of figures is one too).
                near = _find_near(joined.text, self._joinable, joined.edited(), split=True)
                found.extend(_keyed(joined, near))
        if normalized.changed:
            # Normalizing can also end a value early (`pass%20word` is `pass word`): the
            # text as written is read too, and the union kept.
            found.extend(_keyed(Normalized(text), self.find(text)))
        return _union(found)


def _find(
    text: str, detectors: Sequence[Detector], any_marker: re.Pattern[str] | None = None
) -> list[Finding]:
    """The findings of `detectors` in `text`, in order, none overlapping (`any_marker`:
    a search for any of their markers, which may rule them all out at once)."""
    lowered = text.lower()
    marked = any_marker is None or any_marker.search(lowered) is not None
    digits = _SEVEN_DIGITS.search(text) is not None
    found: list[tuple[int, int, Finding]] = []
    for rank, detector in enumerate(detectors):
        # `Detector.may_match`, inline: the outbound scan calls this for every string of
        # a request (a tool schema has hundreds), where a call per detector shows.
        if detector.markers:
            if not marked:
                continue
            for marker in detector.markers:
                if marker in lowered:
                    break
            else:
                continue
        if detector.numeric and not digits:
            continue
        if detector.gate is not None and detector.gate.search(text) is None:
            continue
        for match in detector.matches(text):
            start, end = detector.span(match)
            if end > start and (detector.valid is None or detector.valid(text[start:end])):
                found.append((start, rank, Finding(start, end, detector.category)))
    return _without_overlaps(found)


def _without_overlaps(found: list[tuple[int, int, Finding]]) -> list[Finding]:
    """The findings in order of their start (then of their detector's rank), each one that
    overlaps a kept one left out."""
    found.sort(key=lambda entry: entry[:2])
    kept: list[Finding] = []
    for _, _, finding in found:
        if not kept or finding.start >= kept[-1].end:
            kept.append(finding)
    return kept


# A number is at most 42 characters (an IBAN of 34 in groups of 4): a window this far
# around each changed separator holds any number it is part of.
_NEAR = 48


def _find_near(
    text: str, detectors: Sequence[Detector], spans: list[tuple[int, int]], split: bool = False
) -> list[Finding]:
    """The findings of `detectors` in `text` within `_NEAR` characters of `spans` (with
    `split`, as their `split_valid` tests them)."""
    windows: list[list[int]] = []
    for start, end in spans:
        if windows and start - _NEAR <= windows[-1][1]:
            windows[-1][1] = min(len(text), end + _NEAR)
        else:
            windows.append([max(0, start - _NEAR), min(len(text), end + _NEAR)])
    found: list[tuple[int, int, Finding]] = []
    for rank, detector in enumerate(detectors):
        valid = detector.split_valid if split else detector.valid
        for low, high in windows:
            # With `pos`, a look-behind still sees the text before the window. (Numeric
            # detectors have no `finder` of their own: their pattern is the whole story.)
            for match in detector.pattern.finditer(text, low, high):
                start, end = detector.span(match)
                if end > start and (valid is None or valid(text[start:end])):
                    found.append((start, rank, Finding(start, end, detector.category)))
    return _without_overlaps(found)


# Categories whose value is a number: one whatever its separators (`4111 1111 ...` and
# `4111111111111111` are one card).
_NUMBERS = frozenset({"card", "phone", "ssn"})


def placeholder_key(category: str, value: str) -> str:
    """What tells two values of `category` apart: a number's digits, an IBAN's letters
    and digits, an address's or host's lower case, else the value."""
    if category in _NUMBERS:
        return "".join(c for c in value if c.isdigit())
    if category == "iban":
        return "".join(c for c in value if c.isalnum()).upper()
    if category in ("email", "host"):
        return value.lower()
    return value


def _keyed(read: Normalized, findings: list[Finding]) -> Iterator[Finding]:
    """`findings` in `read.text` as spans of the original text, keyed by their value."""
    text = read.text
    for f in findings:
        start, end = read.span(f.start, f.end)
        yield Finding(start, end, f.category, placeholder_key(f.category, text[f.start : f.end]))


def _union(found: list[Finding]) -> list[Finding]:
    """`found` in order, overlapping findings joined (the first one's category and key)."""
    if len(found) < 2:
        return found
    # Stable: at one start the longer first, and of equal ones the first found (an
    # encoded run before the readings of its text, the normalized reading before the
    # written one).
    found.sort(key=lambda f: (f.start, -f.end))
    kept: list[Finding] = []
    for finding in found:
        if kept and finding.start < kept[-1].end:
            if finding.end > kept[-1].end:
                kept[-1] = dataclasses.replace(kept[-1], end=finding.end)
            continue
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
        """`text` with each of `findings` (from `Scanner.find(text)` or
        `Scanner.find_deep(text)`) replaced; an encoded run by the placeholders of what
        it decodes to."""
        if not findings:
            return text
        parts = []
        position = 0
        for finding in findings:
            parts.append(text[position : finding.start])
            if finding.inner:
                parts.append(" ".join(self._placeholder(f) for f in finding.leaves()))
            else:
                parts.append(self._placeholder(finding, text[finding.start : finding.end]))
            position = finding.end
        parts.append(text[position:])
        return "".join(parts)

    def whole(self, category: str, value: str) -> str:
        """The placeholder of `value` as a whole (a secret by the name of its key)."""
        return self._placeholder(Finding(0, len(value), category, value))

    def _placeholder(self, finding: Finding, written: str = "") -> str:
        category = finding.category
        self.counts[category] += 1
        key = (category, written if finding.key is None else finding.key)
        placeholder = self._placeholders.get(key)
        if placeholder is None:
            self._numbers[category] += 1
            placeholder = f"[{category.upper()}_{self._numbers[category]}]"
            self._placeholders[key] = placeholder
        return placeholder
