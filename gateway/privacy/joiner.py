"""Numbers split across lines or table cells, read whole.

A card number written `4111 1111` on one line and `1111 1111` on the next, or a group
to a cell of a Markdown or HTML table (`| 4111 | 1111 | 1111 | 1111 |`,
`<td>4111</td><td>1111</td>...`), is the card to a model as much as on one line.
`join_split` reads the line breaks and cell boundaries inside such a number as one space
and keeps, as `gateway.privacy.normalizer` does, where each piece came from: a card
found there is a span of the original text, with every break and cell boundary that
split it, and is masked whole.

What joins: a line break, a Markdown cell's `|`, and the HTML tags of tables, lists and
paragraphs (`</td><td>`, `</tr><tr>`, `<br>`, `</p><p>`), with the blanks around them,
several in a row (`|\\n|` ends a table row and starts the next). Only a number that a
card could be is joined, and only where its pieces are not a list of figures:

- 13 to 19 digits in all, in groups of two digits at least, not part of a word or of a
  decimal number (a table or list of numbers is most often longer, and left as it is);
- split by one line break (`4111 1111` / `1111 1111`; a column of figures, one a line,
  has more);
- split by table cells, only when the number's cells are all its row holds (a row of
  figures has a label: `| Q1 | 4200 | 4350 | 4410 | 4520 |` is not joined).

The card detector then takes only what passes Luhn and starts and is as long as an
issuer's card numbers are (`patterns.card_issued`).

One pass, linear in the text: a search in C for a digit, a break and a digit; each
break is looked at once, and around each number at most a few hundred characters.
"""

from __future__ import annotations

import re

from gateway.privacy.normalizer import Normalized

_BLANKS = r"[ \t]{0,64}"
_TAG = r"<(?i:/?(?:td|th|tr|br|p|div|span|li|thead|tbody|table))\b[^<>\n]{0,64}>"
# Blanks, then breaks each followed by blanks: a blank is never a break, so there is one
# way to read a join (no backtracking into the blanks), and it is bounded. A group's
# separator may stand on either side of it (`4111-1111-` / `1111-1111`, an en dash, a dot,
# a slash), and an e-mail's quote marks after a break (`> 1111 1111`): the hostile reviews
# of issues 40 and 42 found each reach an external model. Line breaks are Unicode's too.
_SEPARATOR = "[-\u2010-\u2015\u2212./_]?"
_BREAK = rf"(?:\r\n|[\n\r\u2028\u2029]|\||{_TAG})"
_QUOTES = r"(?:>[ \t]{0,4}){0,8}"
_JOIN = rf"{_SEPARATOR}{_BLANKS}(?:{_BREAK}{_BLANKS}{_QUOTES}){{1,8}}{_SEPARATOR}"
# A digit, a join, a digit: where there is work.
_SPLIT = re.compile(rf"[0-9](?P<join>{_JOIN})(?=[0-9])")
# A join that is a table's (`<br>`, `</p><p>` and the like are line breaks).
_CELL = re.compile(r"\||<(?i:/?t[dhr])\b")
# Digit groups as the card pattern reads them, and such groups at the end of a text.
# Possessive (`*+`): a repeat that may backtrack keeps a mark per iteration, megabytes
# of them on a hostile `1 1 1 ...`; these never need to.
_GROUPS = re.compile(r"[0-9]++(?:[ -][0-9]++)*+")
_GROUPS_AT_END = re.compile(r"(?:[0-9]+[ -])*[0-9]+\Z")
# A number's groups and joins from a join's end on: a run that cannot be a card (too
# long, or of one-digit groups: a hostile `1|1|1|...`) is skipped to its end in C.
_REST = re.compile(rf"[0-9]++(?:(?:[ -]|{_JOIN})[0-9]++)*+")
# What may stand in a row beside a number's cells: blanks, `|`, tags. A row starts at a
# line's start or a `<tr>`, and ends at a line's end or a `</tr>`.
_CELL_SYNTAX = re.compile(rf"(?:[ \t|\r]|{_TAG})*")
_ROW_START = re.compile(r"\n|<tr\b[^<>\n]{0,64}>", re.IGNORECASE)
_ROW_END = re.compile(r"\r?\n|</tr\s*>", re.IGNORECASE)
# How far back the groups before a first join are looked for: a card's 19 digits and 18
# separators fit, and what does not fit is longer than a card.
_BACK = 40
# How far from a number its row's start and end are looked for.
_ROW = 256
_MIN_DIGITS, _MAX_DIGITS = 13, 19
_MIN_GROUP = 2


def join_split(read: Normalized) -> Normalized:
    """`read` with the line breaks and cell boundaries inside each number that a card
    could be read as one space (see the module's docstring)."""
    text = read.text
    first = _SPLIT.search(text)
    if first is None:
        return read  # most texts: no digit on both sides of a break
    edits: list[tuple[int, int, str]] = []
    run: _Run | None = None
    split: re.Match[str] | None = first
    while split is not None:
        start, end = split.span("join")
        if run is not None and run.continues(text, start):
            run.add(text, start, end)
        else:
            if run is not None:
                edits.extend(run.edits(text))
            run = _Run.before(text, start, end)
        if not run.alive:
            rest = _REST.match(text, end)
            assert rest is not None  # `_SPLIT` looked ahead to a digit
            end, run = rest.end(), None
        split = _SPLIT.search(text, end)
    if run is not None:
        edits.extend(run.edits(text))
    if not edits:
        return read
    return Normalized.build(text, edits, read)


class _Run:
    """A number with a break in it: its digits so far, and the joins between its groups."""

    __slots__ = ("_alive", "_breaks", "_cells", "_digits", "_joins", "_last_end", "_start")

    def __init__(self, start: int) -> None:
        self._start = start
        self._last_end = start  # where the groups not yet counted start
        self._joins: list[tuple[int, int]] = []
        self._digits = 0
        self._alive = True
        self._breaks = 0  # joins that are line breaks only
        self._cells = False  # whether a join is a table's

    @classmethod
    def before(cls, text: str, start: int, end: int) -> _Run:
        """The run whose first join is `text[start:end]`."""
        low = max(0, start - _BACK)
        groups = _GROUPS_AT_END.search(text, low, start)
        assert groups is not None  # `_SPLIT` matched a digit right before the join
        run = cls(groups.start())
        # Groups that reach back as far as was looked are longer than a card (37
        # characters); a number glued to a word or a decimal point is not one.
        reaches_back = low > 0 and groups.start() == low
        run._alive = not reaches_back and _starts_number(text, groups.start())
        run.add(text, start, end)
        return run

    @property
    def alive(self) -> bool:
        """Whether the run may still be a card."""
        return self._alive

    def continues(self, text: str, start: int) -> bool:
        """Whether the join at `start` is in this run: only digit groups between the
        last join and it."""
        return _GROUPS.fullmatch(text, self._last_end, start) is not None

    def add(self, text: str, start: int, end: int) -> None:
        """The groups before the join `text[start:end]`, and the join."""
        self._count(text[self._last_end : start])
        if self._alive:
            self._joins.append((start, end))
            if _CELL.search(text, start, end) is not None:
                self._cells = True
            else:
                self._breaks += 1
        self._last_end = end

    def edits(self, text: str) -> list[tuple[int, int, str]]:
        """Each join as one space, if the run is a number that a card could be."""
        groups = _GROUPS.match(text, self._last_end)
        assert groups is not None  # `_SPLIT` looked ahead to a digit
        self._count(groups.group())
        end = groups.end()
        if not self._alive or self._digits < _MIN_DIGITS or not _ends_number(text, end):
            return []
        if self._cells:
            if not _fills_its_row(text, self._start, end):
                return []  # a row of figures, with its label
        elif self._breaks > 1:
            return []  # a column of figures
        return [(start, end, " ") for start, end in self._joins]

    def _count(self, groups: str) -> None:
        if not self._alive:
            return  # a run too long to be a card is walked to its end, not counted
        lengths = [len(group) for group in groups.replace("-", " ").split()]
        self._digits += sum(lengths)
        if self._digits > _MAX_DIGITS or any(n < _MIN_GROUP for n in lengths):
            self._alive = False
            self._joins = []


def _starts_number(text: str, start: int) -> bool:
    """Whether a number starting at `start` is not the end of a word or a decimal."""
    if start == 0:
        return True
    before = text[start - 1]
    if before.isalnum() or before == "_":
        return False
    return not (before in ".," and start > 1 and text[start - 2].isdigit())


def _ends_number(text: str, end: int) -> bool:
    """Whether a number ending at `end` is not the start of a word or a decimal."""
    if end == len(text):
        return True
    after = text[end]
    if after.isalnum() or after == "_":
        return False
    return not (after in ".," and end + 1 < len(text) and text[end + 1].isdigit())


def _fills_its_row(text: str, start: int, end: int) -> bool:
    """Whether `text[start:end]` is all its table row holds but for cell syntax: from
    the row's start (a line's, or a `<tr>`) and to its end, within `_ROW` characters."""
    low = max(0, start - _ROW)
    row_start = low if low == 0 else -1
    for boundary in _ROW_START.finditer(text, low, start):
        row_start = boundary.end()
    if row_start < 0 or _CELL_SYNTAX.fullmatch(text, row_start, start) is None:
        return False
    high = min(len(text), end + _ROW)
    after = _ROW_END.search(text, end, high)
    row_end = after.start() if after is not None else high if high == len(text) else -1
    return row_end >= 0 and _CELL_SYNTAX.fullmatch(text, end, row_end) is not None
