"""Text as the patterns should read it: the forms that hide sensitive data undone.

A model reads `AKIA<zero-width space>IOSFODNN7EXAMPLE`, `jane@example.com` with a
Cyrillic `a`, fullwidth digits or `\\u0041KIA...` as the secret they spell; a regular
expression does not. `normalize` rewrites a text for matching, in one pass that skips,
in C, from one character that may need it to the next:

- escapes decoded wherever they are: JSON's `\\uXXXX` (surrogate pairs joined) and `\\/`,
  `\\xHH`, HTML character references, numeric (`&#64;`, `&#x40;`, `&#0047`, as browsers
  read them: leading zeros, no `;`) and named (`&sol;`, `&commat;`, `&amp;`: HTML5's
  list), and percent-encoded UTF-8 (`%2F`, `%C3%A9`; `+` stays a `+`, as in base64); an
  escape that decodes to another (`%252F`, `&amp;#x2F;`) is decoded again, once;
- Unicode compatibility forms folded (NFKC: fullwidth letters and digits, mathematical
  alphanumerics, ligatures), and every decimal digit made ASCII;
- invisible characters removed: zero-width spaces and joiners, the soft hyphen, bidi
  controls, word joiners, tag characters (those spelling ASCII are decoded: "ASCII
  smuggling"), Hangul fillers, ASCII control characters; combining marks written over
  ASCII letters and digits;
- look-alike letters mapped: Cyrillic, Greek and a few Latin letters that read as a
  Latin one (Cyrillic `a`, Greek capital iota), and hyphens as `-`.

`group_digits` then reads the separators inside a number (dots, slashes, underscores,
dashes of any kind, several spaces) as one space, so the card, phone, SSN and IBAN
patterns see `4111.1111.1111.1111` or `123 / 45 / 6789` as the number it is.

Each result keeps where its pieces came from (`Normalized.span`): a finding in the
normalized text is a span of the original text, the whole of every character, escape
or separator it was read from, so masking replaces exactly what spelled it. Both passes
are linear: a text without anything to undo (most prose and code) is returned as it
came after one or two searches in C.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from html.entities import html5 as HTML5_ENTITIES

# Letters of other scripts that read as a Latin letter (escaped: the source shows
# them as the letters they imitate).
HOMOGLYPHS = {
    # Cyrillic: aehijlopcsyyxdqw
    **dict(
        zip(
            "\u0430\u0435\u04bb\u0456\u0458\u04cf\u043e\u0440\u0441\u0455\u0443\u04af"
            "\u0445\u0501\u051b\u051d",
            "aehijlopcsyyxdqw",
            strict=True,
        )
    ),
    # Cyrillic capitals: ABEHIJKMOPCSTXYYQWI
    **dict(
        zip(
            "\u0410\u0412\u0415\u041d\u0406\u0408\u041a\u041c\u041e\u0420\u0421\u0405"
            "\u0422\u0425\u0423\u04ae\u051a\u051c\u04c0",
            "ABEHIJKMOPCSTXYYQWI",
            strict=True,
        )
    ),
    # Greek capitals: ABEZHIKMNOPTYXCJ
    **dict(
        zip(
            "\u0391\u0392\u0395\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4"
            "\u03a5\u03a7\u03f9\u037f",
            "ABEZHIKMNOPTYXCJ",
            strict=True,
        )
    ),
    # Greek: oavpikuxcj
    **dict(
        zip(
            "\u03bf\u03b1\u03bd\u03c1\u03b9\u03ba\u03c5\u03c7\u03f2\u03f3",
            "oavpikuxcj",
            strict=True,
        )
    ),
    # Armenian oh; dotless i and j, script g, Latin alpha and iota: oijgai
    **dict(
        zip(
            "\u0585\u0131\u0237\u0261\u0251\u0269",
            "oijgai",
            strict=True,
        )
    ),
}
# Hyphens read as `-`. Not the en and em dashes nor the minus sign: prose is full of
# them (`3-8 s` with an en dash), and a text with a character to rewrite is read twice (as written
# too); between digits they are separators (below).
DASHES = "\u2010\u2011\u2012\ufe58\ufe63\uff0d"
# Blank letters: they render as nothing (or a space) but are not format characters.
BLANKS = "\u115f\u1160\u3164\uffa0\u2800"
# Zero-width joiners join emoji and Persian letters: removed only after ASCII.
JOINERS = "\u200c\u200d"

# Separators a number may be written with, between two digits.
_SEPARATOR = (
    r"[ \t\u00a0\u2000-\u200a\u202f\u205f\u3000.\-/_\u00b7\u2022\u2219\u22c5\u2027'"
    r"\u2013\u2014\u2015\u2212]"
)
# A number with a separator other than one space or one `-`: only then is there work.
_ODD_SEPARATOR = re.compile(rf"[0-9](?![ -][0-9]){_SEPARATOR}{{1,3}}[0-9]")
# A number, at least 8 characters long (the lookahead, in C, skips the many short ones:
# `1.5`, `404/408`).
_NUMBER = re.compile(rf"[0-9](?=(?:[0-9]|{_SEPARATOR}){{7}})[0-9]*(?:{_SEPARATOR}{{1,3}}[0-9]+)+")
_GROUP_SEPARATOR = re.compile(rf"{_SEPARATOR}{{1,3}}")
# Card numbers have 13 to 19 digits, phone numbers 7 to 15, SSNs 9: a run of digit
# groups beyond that is a table or a list of values, not one number.
_MIN_DIGITS, _MAX_DIGITS = 7, 19

_ASCII_SPOTS = re.compile(r"[\\%&\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CONTROLS = "\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f"
_ASTRAL = "\\U00010000-\\U0010ffff"
# The scripts with look-alike letters (Greek, Cyrillic, fullwidth forms), and what
# separates their words: a run of look-alikes reaches across them.
_RUN_BLOCKS = (*range(0x370, 0x400), *range(0x400, 0x530), *range(0xFF00, 0xFFF0))
_RUN_PUNCTUATION = " \n,.!?;:()'\"-"
_ESCAPES = (
    r"(?P<pair>\\+u[dD][89abAB][0-9a-fA-F]{2}\\+u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|\\+u(?P<u>[0-9a-fA-F]{4})"
    r"|\\+x(?P<x>[0-9a-fA-F]{2})"
    r"|\\+(?P<slash>/)"
    # As `html.unescape` reads them: leading zeros, the `;` optional; a number too long
    # to be a character is left as written.
    r"|&#(?:0*(?P<dec>[0-9]{1,7})(?![0-9])|[xX]0*(?P<hex>[0-9a-fA-F]{1,6})(?![0-9a-fA-F]));?"
    r"|&(?P<named>[A-Za-z][A-Za-z0-9]{1,31};)"
    r"|(?P<percent>(?:%[0-9A-Fa-f]{2})+)"
)
# What an escape may decode to that starts another escape: then the text is read again.
_ESCAPE_STARTS = re.compile(r"[%&\\]")


class Normalized:
    """A text rewritten for matching (`text`), and where each of its pieces came from.

    The changes are kept as edits, sorted: `text[starts[i]:ends[i]]` was read from
    `source[from_starts[i]:from_ends[i]]`; everything between edits is as it was. An
    edit is aligned when it maps character for character (a run of look-alike letters).
    """

    __slots__ = ("_aligned", "_ends", "_from_ends", "_from_starts", "_parent", "_starts", "text")

    def __init__(self, text: str, parent: Normalized | None = None) -> None:
        self.text = text
        self._parent = parent
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._from_starts: list[int] = []
        self._from_ends: list[int] = []
        self._aligned: list[bool] = []

    @property
    def changed(self) -> bool:
        """Whether this text differs from the one it was read from."""
        return bool(self._starts)

    def edited(self) -> list[tuple[int, int]]:
        """Where this text differs from the one it was read from: its edits' spans."""
        return list(zip(self._starts, self._ends, strict=True))

    def span(self, start: int, end: int) -> tuple[int, int]:
        """Where `text[start:end]` came from in the original text (through every pass):
        the whole of each escape, character or separator that spelled a piece of it."""
        if self._starts:
            start, end = self._back_start(start), self._back_end(end)
        if self._parent is not None:
            return self._parent.span(start, end)
        return start, end

    def _back_start(self, position: int) -> int:
        i = bisect_right(self._starts, position) - 1
        if i < 0:
            return position
        if position < self._ends[i]:
            if self._aligned[i]:
                return self._from_starts[i] + position - self._starts[i]
            return self._from_starts[i]
        return position - self._ends[i] + self._from_ends[i]

    def _back_end(self, end: int) -> int:
        last = end - 1  # the last character of the span
        i = bisect_right(self._starts, last) - 1
        if i < 0:
            return end
        if last < self._ends[i]:
            if self._aligned[i]:
                return self._from_starts[i] + last - self._starts[i] + 1
            return self._from_ends[i]
        return last - self._ends[i] + self._from_ends[i] + 1

    @classmethod
    def build(
        cls, source: str, edits: Iterable[tuple[int, int, str]], parent: Normalized | None
    ) -> Normalized:
        """`source` with each edit (start, end, replacement), in order, applied."""
        pieces: list[str] = []
        new = cls("", parent)
        position = 0  # in source
        length = 0  # of the new text so far
        for start, end, replacement in edits:
            if start > position:
                pieces.append(source[position:start])
                length += start - position
            pieces.append(replacement)
            new._starts.append(length)
            length += len(replacement)
            new._ends.append(length)
            new._from_starts.append(start)
            new._from_ends.append(end)
            new._aligned.append(len(replacement) == end - start)
            position = end
        pieces.append(source[position:])
        new.text = "".join(pieces)
        return new


def normalize(text: str) -> Normalized:
    """`text` with escapes decoded, compatibility forms folded, invisible characters
    removed and look-alike letters mapped (see the module's docstring)."""
    if text.isascii() and _ASCII_SPOTS.search(text) is None:
        return Normalized(text)  # nothing to undo: most prose and code
    edits = _rewrites(text)
    if not edits:
        return Normalized(text)
    normalized = Normalized.build(text, edits, None)
    if _ESCAPE_STARTS.search("".join([replacement for _, _, replacement in edits])):
        # An escape decoded to the start of another (`%252F` to `%2F`, `&amp;#47;` to
        # `&#47;`): the text is read once more, no more (each level is a pass).
        again = _rewrites(normalized.text)
        if again:
            return Normalized.build(normalized.text, again, normalized)
    return normalized


def _rewrites(text: str) -> list[tuple[int, int, str]]:
    """The edits (start, end, replacement) that normalize `text`, in order."""
    tables = _tables()
    table = tables.table
    edits: list[tuple[int, int, str]] = []
    # Combining marks are a script's own (Hindi vowel signs) unless written over ASCII:
    # only a text that has one there looks at marks at all.
    marked = (
        tables.marks.search(text) is not None and tables.marks_over_ascii.search(text) is not None
    )
    candidates = tables.candidates_and_marks if marked else tables.candidates
    # A search for one character class skips, in C, to the next character that may
    # start something to rewrite; only there are the alternatives tried (tried at every
    # position, they cost several times the scan itself).
    find, rewrite = candidates.search, tables.rewrite.match
    position = 0
    while (candidate := find(text, position)) is not None:
        start = candidate.start()
        match = rewrite(text, start)
        if match is None:
            position = start + 1  # `%` without hex digits after it, an emoji
            continue
        end = position = match.end()
        kind = match.lastgroup
        if kind in ("aligned", "expanding"):
            edits.append((start, end, match.group().translate(table)))
        elif kind in ("removed", "controls"):
            edits.append((start, end, ""))
        elif kind == "marks":
            # Over ASCII they hide a letter's identity (`A` + U+0301); over another
            # script's letters they are that script's own (Hindi vowel signs).
            if start > 0 and "!" <= text[start - 1] <= "~":
                edits.append((start, end, ""))
        elif kind == "astral":
            replacement = table.get(ord(match.group()))
            if replacement is not None:
                edits.append((start, end, replacement))
        elif kind == "percent":
            edits.extend(_percent(match.group(), start, table))
        elif kind == "named":
            named = HTML5_ENTITIES.get(match["named"])
            if named is not None:  # `&copy;` is one, `&ab;` is not
                edits.append((start, end, named.translate(table)))
        else:
            edits.append((start, end, _unescape(match, table)))
    return edits


def group_digits(normalized: Normalized) -> Normalized:
    """`normalized` with the separators inside each number read as one space, where the
    number is one that a card, phone, SSN or IBAN could be: 7 to 19 digits, and not a
    decimal number (one `.`) or a list of them (`.` and spaces)."""
    text = normalized.text
    if _ODD_SEPARATOR.search(text) is None:
        return normalized
    edits: list[tuple[int, int, str]] = []
    for number in _NUMBER.finditer(text):
        digits = sum(map(str.isdigit, number.group()))
        if not _MIN_DIGITS <= digits <= _MAX_DIGITS:
            continue
        separators = list(_GROUP_SEPARATOR.finditer(number.group()))
        written = [s.group() for s in separators]
        if all(s in (" ", "-") for s in written):
            continue  # the patterns read it as it is
        if written == ["."] or ("." in written and any(s.isspace() for s in written)):
            continue  # 3.14159265358979, or 0.25 0.5 0.75: decimals, not digit groups
        offset = number.start()
        edits.extend(
            (offset + s.start(), offset + s.end(), " ")
            for s in separators
            if s.group() not in (" ", "-")
        )
    if not edits:
        return normalized
    return Normalized.build(text, edits, normalized)


def _unescape(match: re.Match[str], table: dict[int, str]) -> str:
    if match["pair"] is not None:
        high, low = (int(half, 16) for half in re.findall(r"[0-9a-fA-F]{4}", match["pair"]))
        char = chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
    elif match["slash"] is not None:
        return "/"
    else:
        code = (
            int(match["dec"])
            if match["dec"] is not None
            else int(match["u"] or match["x"] or match["hex"], 16)
        )
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            return ""  # not a character: a lone surrogate hides nothing
        if 0x80 <= code <= 0x9F and match["x"] is None and match["u"] is None:
            # An HTML reference to a C1 control is read as Windows-1252 (`&#150;` is an
            # en dash), as browsers and `html.unescape` read it.
            return bytes([code]).decode("cp1252", "ignore").translate(table)
        char = chr(code)
    return char.translate(table)


def _percent(run: str, start: int, table: dict[int, str]) -> list[tuple[int, int, str]]:
    """Percent-encoded UTF-8, one edit per character (so a finding maps to just its
    own bytes); bytes that are not UTF-8 are left as written (`%FF`), the characters
    around them decoded."""
    raw = bytes.fromhex(run.replace("%", ""))
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return _percent_in_part(raw, start, table)
    edits = []
    position = start
    for char in decoded:
        width = 3 * len(char.encode("utf-8"))
        edits.append((position, position + width, char.translate(table)))
        position += width
    return edits


def _percent_in_part(raw: bytes, start: int, table: dict[int, str]) -> list[tuple[int, int, str]]:
    """`_percent` of bytes that are not all UTF-8: each character that is, decoded."""
    edits = []
    i = 0
    while i < len(raw):
        lead = raw[i]
        width = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        try:
            char = raw[i : i + width].decode("utf-8")
        except UnicodeDecodeError:
            i += 1  # not a character's first byte, or one cut short: as written
            continue
        position = start + 3 * i
        edits.append((position, position + 3 * width, char.translate(table)))
        i += width
    return edits


@dataclass(frozen=True, slots=True)
class _Tables:
    # What each character reads as ("": nothing), whatever plane it is in.
    table: dict[int, str]
    # Any character that may start something to rewrite: other than a combining mark,
    # and with them; a combining mark over an ASCII character.
    candidates: re.Pattern[str]
    candidates_and_marks: re.Pattern[str]
    marks: re.Pattern[str]
    marks_over_ascii: re.Pattern[str]
    # What to rewrite there, by kind.
    rewrite: re.Pattern[str]


@functools.cache
def _tables() -> _Tables:
    """The character map and the expressions that find what to rewrite. Built once, from
    this Python's Unicode database (about 0.1 s: `warm_up` does it at startup)."""
    aligned: dict[int, str] = {}
    expanding: dict[int, str] = {}
    removed: set[int] = set()
    marks: set[int] = set()
    for code in (*range(0x80, 0x20000), *range(0xE0000, 0xE01F0)):
        char = chr(code)
        category = unicodedata.category(char)
        if 0xE0020 <= code <= 0xE007E:
            aligned[code] = chr(code - 0xE0000)  # a tag character spells an ASCII one
        elif char in JOINERS or category in ("Mn", "Me"):
            marks.add(code)
        elif category == "Cf" or char in BLANKS:
            removed.add(code)
        else:
            folded = _fold(char)
            if folded == char:
                continue
            if len(folded) == 1:
                aligned[code] = folded
            else:
                expanding[code] = folded
    # Escapes decode to any character: the table maps the invisible ones to nothing too.
    controls = [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]
    table = {**aligned, **expanding, **dict.fromkeys([*removed, *controls], "")}
    # The classes hold the basic plane only, and every other character is one range:
    # a class with ranges above it is checked range by range for each character, many
    # times slower. Those characters (emoji, mathematical letters, tags) are rare, and
    # looked up in the table one by one.
    bmp = 0x10000
    first = [c for c in (*aligned, *expanding, *removed) if c < bmp]
    others = {*expanding, *removed, *marks}
    runs = [c for c in (*aligned, *_RUN_BLOCKS) if c < bmp and c not in others]
    bmp_marks = [c for c in marks if c < bmp]
    candidates = _char_class(first, f"\\\\%&{_CONTROLS}{_ASTRAL}")
    candidates_and_marks = _char_class([*first, *bmp_marks], f"\\\\%&{_CONTROLS}{_ASTRAL}")
    marks_over_ascii = f"[!-~]{_char_class(bmp_marks)}"
    rewrite = "|".join(
        [
            # From a look-alike letter on, through the letters of its script that read
            # as themselves, spaces and punctuation: a Russian paragraph is one edit,
            # translated in C, not one edit a letter.
            f"(?P<aligned>{_char_class([c for c in aligned if c < bmp])}"
            f"{_char_class(runs, _RUN_PUNCTUATION)}*)",
            f"(?P<removed>{_char_class([c for c in removed if c < bmp])}+)",
            f"(?P<expanding>{_char_class([c for c in expanding if c < bmp])})",
            f"(?P<marks>{_char_class(bmp_marks)}+)",
            f"(?P<controls>[{_CONTROLS}]+)",
            f"(?P<astral>[{_ASTRAL}])",
            _ESCAPES,
        ]
    )
    return _Tables(
        table,
        re.compile(candidates),
        re.compile(candidates_and_marks),
        re.compile(_char_class(bmp_marks)),
        re.compile(marks_over_ascii),
        re.compile(rewrite),
    )


def warm_up() -> None:
    """Build the tables now rather than on the first text that needs them."""
    _tables()


def _fold(char: str) -> str:
    """What `char` reads as, if that is something a pattern looks for: an ASCII letter or
    digit, or one ASCII punctuation character (a fullwidth `@` or `/`); else `char`
    itself."""
    if char in HOMOGLYPHS:
        return HOMOGLYPHS[char]
    if char in DASHES:
        return "-"
    if unicodedata.category(char) == "Nd":
        return str(unicodedata.digit(char))
    compatible = unicodedata.normalize("NFKC", char)
    if compatible == char:
        return char
    folded = "".join(
        HOMOGLYPHS.get(c, "-" if c in DASHES else c)
        for c in compatible
        if unicodedata.category(c) not in ("Mn", "Me", "Cf")
    )
    if any(c.isascii() and c.isalnum() for c in folded):
        return folded
    if len(folded) == 1 and folded.isascii() and folded.isprintable() and not folded.isspace():
        return folded
    return char  # spaces, ellipses, symbols: they hide nothing a pattern looks for


def _char_class(codes: Iterable[int], more: str = "") -> str:
    """A character class of `codes`, as ranges (and `more`, as written)."""
    ordered = sorted(codes)
    ranges: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        first, last = ordered[i], ordered[j]
        ranges.append(f"\\U{first:08x}" if first == last else f"\\U{first:08x}-\\U{last:08x}")
        i = j + 1
    return "[" + "".join(ranges) + more + "]"
