"""Text as the patterns read it (gateway.privacy.normalizer): each hiding form undone,
and every piece of the normalized text traced back to what spelled it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.privacy.normalizer import Normalized, group_digits, normalize

ZWSP, SOFT_HYPHEN, BIDI_OVERRIDE, ZWJ = "\u200b", "\u00ad", "\u202e", "\u200d"
CYRILLIC_A, CYRILLIC_ES, GREEK_ALPHA, GREEK_KAPPA = "\u0430", "\u0441", "\u0391", "\u039a"


def fullwidth(text: str) -> str:
    return "".join(chr(ord(c) - 0x21 + 0xFF01) for c in text)


@pytest.mark.parametrize(
    ("written", "read"),
    [
        # Invisible characters, anywhere.
        (f"AKIA{ZWSP}IOSF{SOFT_HYPHEN}ODNN{BIDI_OVERRIDE}7", "AKIAIOSFODNN7"),
        ("AKIA\u2060IOSF\ufeffODNN", "AKIAIOSFODNN"),  # word joiner, BOM
        ("a\x00b\x1bc", "abc"),  # control characters; tab and newline stay
        ("a\tb\nc", "a\tb\nc"),
        # Tag characters spell ASCII (hidden text a model reads): decoded.
        ("".join(chr(0xE0000 + ord(c)) for c in "AKIA"), "AKIA"),
        # Zero-width joiners and combining marks: over ASCII only.
        (f"sk{ZWJ}-proj", "sk-proj"),
        ("A\u0301KIA", "AKIA"),
        ("\u0928\u092e\u0938\u094d\u0924\u0947", "\u0928\u092e\u0938\u094d\u0924\u0947"),  # Hindi
        # Compatibility forms: fullwidth, mathematical letters, ligatures, digits.
        (fullwidth("AKIA@example.com"), "AKIA@example.com"),
        ("\U0001d400\U0001d40a\U0001d408\U0001d400", "AKIA"),
        ("\ufb01le", "file"),
        ("\u0664\u0661\u0661\u0661", "4111"),  # Arabic-Indic digits
        # Look-alike letters.
        (f"j{CYRILLIC_A}ne@ex{CYRILLIC_A}mple.{CYRILLIC_ES}om", "jane@example.com"),
        (f"{GREEK_ALPHA}{GREEK_KAPPA}IA", "AKIA"),
        ("sk\u2010proj", "sk-proj"),  # a hyphen that is not `-`
        # Escapes.
        ("\\u0041KIA", "AKIA"),
        ("\\\\u0041KIA", "AKIA"),  # escaped twice (JSON in a JSON string)
        ("\\ud83d\\ude00", "\U0001f600"),  # a surrogate pair
        ("\\ud800x", "x"),  # a lone surrogate is not a character
        ("https:\\/\\/host", "https://host"),
        ("\\x41KIA", "AKIA"),
        ("&#65;KIA &#x40;", "AKIA @"),
        ("jane%40example.com %C3%A9", "jane@example.com \u00e9"),
        ("100%zz", "100%zz"),  # not an escape
        ("50%FF", "50%FF"),  # not UTF-8: left as written
        ("%2F%FF%41", "/%FFA"),  # ...and the characters around it decoded
        ("a+b%2Bc", "a+b+c"),  # `+` is not a space: base64 keys hold it
        # HTML character references as browsers read them (issue 40): named, numeric
        # with leading zeros or without their `;`, C1 numbers as Windows-1252.
        ("a&sol;b&#x2F;c&#47;d&#0000047;e&#47f&#x2FK", "a/b/c/d/e/f/K"),
        ("jane&commat;example&period;com &lt;&gt;&quot;&amp;", 'jane@example.com <>"&'),
        ("&#150;", "\u2013"),
        ("AT&T, R&D, &ab; &#99999999999;", None),  # not references: as written
        # An escape that decodes to another is decoded again, once.
        ("a%252Fb a&amp;#x2F;b a&amp;sol;b %5Cu0041", "a/b a/b a/b A"),
        ("%25252F", "%2F"),
        # What prose is full of is left as it is.
        ("caf\u00e9 \u2014 3\u20138 s \u2026 \u201cquoted\u201d \u00a0", None),
        # Russian: its look-alike letters read as Latin ones (for matching only).
        ("\u041f\u0440\u0438\u0432\u0435\u0442", "\u041fp\u0438\u0432e\u0442"),
    ],
)
def test_each_hiding_form_is_undone(written: str, read: str | None) -> None:
    assert normalize(written).text == (written if read is None else read)


def test_a_text_with_nothing_to_undo_is_returned_as_it_is() -> None:
    for text in ("plain ASCII prose, code(); x = {'a': 1}", "caf\u00e9 \u2014 \u4eca\u65e5\u306f"):
        normalized = normalize(text)
        assert normalized.text is text and not normalized.changed


@pytest.mark.parametrize(
    ("written", "found"),
    [
        # Every character that spelled the finding is in its span, the invisible ones
        # between its letters included, nothing around it.
        (f"key AKIA{ZWSP}IOSFODNN7EXAMPLE now", f"AKIA{ZWSP}IOSFODNN7EXAMPLE"),
        (f"mail j{CYRILLIC_A}ne@example.com now", f"j{CYRILLIC_A}ne@example.com"),
        ("key \\u0041KIAIOSFODNN7EXAMPLE now", "\\u0041KIAIOSFODNN7EXAMPLE"),
        ("mail jane%40example.com now", "jane%40example.com"),
        ("mail jane&commat;example.com now", "jane&commat;example.com"),
        ("mail jane%2540example.com now", "jane%2540example.com"),
        ("mail jane&amp;#64;example.com now", "jane&amp;#64;example.com"),
        (f"key {fullwidth('AKIAIOSFODNN7EXAMPLE')} now", fullwidth("AKIAIOSFODNN7EXAMPLE")),
        ("key \U0001d400KIAIOSFODNN7EXAMPLE now", "\U0001d400KIAIOSFODNN7EXAMPLE"),
    ],
)
def test_a_span_of_the_normalized_text_is_the_whole_of_what_spelled_it(
    written: str, found: str
) -> None:
    normalized = normalize(written)
    plain = found.replace(ZWSP, "")
    for old, new in [
        *((CYRILLIC_A, "a"), ("\\u0041", "A"), ("%2540", "@"), ("%40", "@")),
        *(("&commat;", "@"), ("&amp;#64;", "@"), ("\U0001d400", "A")),
    ]:
        plain = plain.replace(old, new)
    plain = normalize(plain).text  # fullwidth
    start = normalized.text.index(plain)
    begin, end = normalized.span(start, start + len(plain))
    assert written[begin:end] == found


def test_a_span_inside_a_run_of_look_alikes_maps_letter_for_letter() -> None:
    written = "\u0410\u0412\u0421\u0415 \u041e\u0420"  # ABCE OP, in Cyrillic
    normalized = normalize(written)
    assert normalized.text == "ABCE OP"
    assert normalized.span(1, 3) == (1, 3)
    assert normalized.span(5, 7) == (5, 7)


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("4111.1111.1111.1111", "4111 1111 1111 1111"),
        ("4111 . 1111 / 1111 _ 1111", "4111 1111 1111 1111"),
        ("4111\u00b71111\u00b71111\u00b71111", "4111 1111 1111 1111"),
        ("4111\u20131111\u20141111\u22121111", "4111 1111 1111 1111"),  # dashes of any kind
        ("4111\u00a01111  1111\t1111", "4111 1111 1111 1111"),
        ("123.45.6789", "123 45 6789"),
        ("555.123.4567", "555 123 4567"),
        ("555-123.4567", "555-123 4567"),  # one space or one `-` stays as written
        # Not a card, phone or SSN: as written.
        ("3.14159265358979", None),  # a decimal number
        ("0.30000000000000004", None),
        ("0.1 0.2 0.3 0.4 0.5 0.6 0.7", None),  # a list of decimals
        ("12.99 15.49 20.00 8.50", None),
        ("10.0.1.5", None),  # too few digits for any of them
        ("1.2.3.4.5.6.7.8.9.0.1.2.3.4.5.6.7.8.9.0", None),  # too many
        ("4111 1111 1111 1111", None),  # nothing to do
    ],
)
def test_separators_inside_a_number_read_as_spaces(written: str, read: str | None) -> None:
    grouped = group_digits(normalize(written))
    assert grouped.text == (written if read is None else read)
    begin, end = grouped.span(0, len(grouped.text))
    assert (begin, end) == (0, len(written))


def test_digit_groups_map_back_through_both_passes() -> None:
    written = f"card {fullwidth('4111')}.1111{ZWSP}.1111.1111 ok"
    grouped = group_digits(normalize(written))
    assert grouped.text == "card 4111 1111 1111 1111 ok"
    begin, end = grouped.span(5, 24)
    assert written[begin:end] == f"{fullwidth('4111')}.1111{ZWSP}.1111.1111"


# Pieces of every form: escapes (escaped twice too), separators, invisible, look-alike,
# compatibility, combining and astral characters.
PIECES = ["a", "1", ".", " ", "\\", "u", "0", "%", "4", "&", "#", ";", ZWSP, CYRILLIC_A]
PIECES += ["\uff21", "\ufb01", "\u0301", "\U0001d400", "&amp;", "&sol;", "%25", "%2F", "\n"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40).map("".join))
def test_spans_are_ordered_and_inside_the_text(written: str) -> None:
    read = group_digits(normalize(written))
    previous = 0
    for position in range(len(read.text)):
        begin, end = read.span(position, position + 1)
        assert 0 <= begin < end <= len(written)
        assert begin >= previous  # the mapping keeps the order of the text
        previous = begin


def test_spans_of_an_unchanged_text_are_themselves() -> None:
    read = Normalized("abc")
    assert read.span(1, 2) == (1, 2) and not read.changed
