"""What sensitive data looks like: one catalogue for log redaction and outbound masking.

Each `Detector` is a category and a regular expression whose `secret` group (the whole
match when it has none) is the sensitive part: a key name, a `Bearer ` scheme or a URL's
user stay, only the value goes. Checksums drop look-alikes (card numbers must pass Luhn,
IBANs their mod-97 check, SSNs the SSA's ranges).

`SECRETS` is what log redaction replaces; `PERSONAL` adds what must not leave the
cluster either (e-mail is in both); `host_detector` builds the internal host names of a
configured list of domain suffixes.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Detector:
    category: str
    pattern: re.Pattern[str]
    # A further test of the found text (a checksum); None: every match counts.
    valid: Callable[[str], bool] | None = None
    # Lower-case text that every match contains: a text with none of them is not
    # searched (substring tests cost a few percent of a regex search). Empty: always.
    markers: tuple[str, ...] = ()
    # A cheaper search that every text with a match passes, for patterns without markers.
    gate: re.Pattern[str] | None = None
    # Finds the matches itself, where `pattern.finditer` would be slow; None: finditer.
    finder: Callable[[str], Iterator[re.Match[str]]] | None = None
    # Finds numbers written in digit groups (cards, phones, SSNs, IBANs), each with seven
    # digits at least, none more than four characters from the next: the scanner tries
    # it only on a text that has such digits, and the outbound scan also reads numbers
    # with odd separators taken as spaces (`privacy.normalizer`).
    numeric: bool = False
    # The test of a number read across line breaks or table cells (`privacy.joiner`),
    # stricter than `valid`: a row of figures is a number that way too. None: this
    # detector does not read numbers across them.
    split_valid: Callable[[str], bool] | None = None

    def matches(self, text: str) -> Iterator[re.Match[str]]:
        """The matches of `pattern` in `text`, left to right, none overlapping."""
        return self.pattern.finditer(text) if self.finder is None else self.finder(text)

    def may_match(self, text: str, lowered: str) -> bool:
        """False only if `text` (and `lowered`, its lower case) cannot hold a match."""
        if self.markers:
            for marker in self.markers:
                if marker in lowered:
                    break
            else:
                return False
        return self.gate is None or self.gate.search(text) is not None

    def span(self, match: re.Match[str]) -> tuple[int, int]:
        """Where the sensitive part of `match` is, in the scanned text."""
        if "secret" not in self.pattern.groupindex or match["secret"] is None:
            return match.span()
        start, end = match.span("secret")
        text = match["secret"]
        # A quoted value: the value is inside its quotes (an unclosed one runs to the end).
        for quote in ('\\"', '"', "'"):
            if text.startswith(quote):
                closed = len(text) >= 2 * len(quote) and text.endswith(quote)
                return start + len(quote), end - (len(quote) if closed else 0)
        return start, end


# Key names whose value is a secret: `password`, `pwd`, `pw`, `passphrase`,
# `client_secret`, `AZURE_CLIENT_SECRET`, `access_token`, `x-api-key`, `AccountKey`,
# `Authorization`... A name must end with one of these words: `prompt_tokens` or
# `token_count` is not a secret.
SECRET_WORDS = (
    r"(?:secret|passw(?:or)?d|passphrase|pwd|pw|token|authorization"
    r"|(?:api|access|private|account|subscription)[_-]?key)(?:[_-]?key)?"
)
# `key=value`, `key: value`, `"key": "value"`, `'key': 'value'` and `\"key\": \"value\"`
# (JSON inside a JSON string). Names are matched whole: the lookbehind, not `\b`, which
# would not match after the `_` in `client_secret`. A quoted value runs to its closing
# quote (or the end of the line, when the text was cut off); `Authorization: Bearer X`
# keeps its scheme.
_KEY_VALUE = re.compile(
    rf"""(?ix)
    (?P<key>(?<![A-Za-z0-9_.-])[A-Za-z0-9_.-]*?{SECRET_WORDS})
    (?P<sep>\\?["']?[ \t]*[=:][ \t]*)
    (?:(?P<scheme>(?:bearer|basic|digest|token)[ \t]+)(?=[^\s,;"'`]{{6}})
      |(?!(?:bearer|basic|digest)[ \t]))
    (?P<secret>
        \\"(?:[^"\\]|\\(?!"))*(?:\\")?
      | "(?:[^"\\\n]|\\.)*"?
      | '(?:[^'\\\n]|\\.)*'?
      | [^\s,;"'`]+
    )
    """
)

# Every key name `SECRET_WORDS` matches ends with one of these (in lower case).
_SECRET_NAME_ENDINGS = (
    "secret", "password", "passwd", "passphrase", "pwd", "pw", "token", "authorization", "key",
)  # fmt: skip
_SEPARATOR = re.compile(r"[=:]")
_SECRET_NAME = re.compile(rf"(?i)[A-Za-z0-9_.-]*?{SECRET_WORDS}")


def is_secret_name(name: str) -> bool:
    """Whether a key named `name` holds a secret (`password`, `client_secret`,
    `x-api-key`), as the key/value pattern reads names: a JSON object's or a
    metadata entry's value under such a key is a secret whatever it looks like."""
    return _SECRET_NAME.fullmatch(name) is not None


_KEY_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")


def _key_value_matches(text: str) -> Iterator[re.Match[str]]:
    """`_KEY_VALUE.finditer(text)`, several times faster: the pattern is tried only at the
    start of a key that ends with a secret name right before a separator, not at every
    word (separators are rare in prose, words are not)."""
    end = 0
    for separator in _SEPARATOR.finditer(text):
        key_end = separator.start()
        if key_end < end:
            continue  # inside the previous match
        while key_end > end and text[key_end - 1] in " \t":
            key_end -= 1
        if key_end > end and text[key_end - 1] in "\"'":
            key_end -= 1
        if key_end > end and text[key_end - 1] == "\\":
            key_end -= 1
        start = key_end
        while start > end and text[start - 1] in _KEY_CHARS:
            start -= 1
        if start == key_end or not text[start:key_end].lower().endswith(_SECRET_NAME_ENDINGS):
            continue
        match = _KEY_VALUE.match(text, start)
        if match is not None:
            yield match
            end = match.end()


# Not a letter or digit before: `\b` would not match after `_` (`KEY_sk-...`).
_START = r"(?<![A-Za-z0-9])"

# Provider keys, by their prefixes: OpenAI-style and gateway keys (sk-..., sk-proj-...),
# Stripe (sk_live_...), GitHub, Slack, Hugging Face, AWS access key ids, Google API keys.
_PROVIDER_KEYS = (
    r"(?:sk|pk|rk)-[A-Za-z0-9_-]{4,}",
    r"(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{8,}",
    r"(?:gh[pousr]|github_pat)_[A-Za-z0-9_]{10,}",
    r"xox[abposr]-[A-Za-z0-9-]{10,}",
    r"hf_[A-Za-z0-9]{20,}",
    r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])",
    r"AIza[A-Za-z0-9_-]{30,}",
)
_PROVIDER_MARKERS = (
    "sk-", "pk-", "rk-", "_live_", "_test_", "ghp_", "gho_", "ghs_", "ghu_", "ghr_",
    "github_pat", "xox", "hf_", "akia", "asia", "aiza",
)  # fmt: skip
_SECRET_NAME_MARKERS = ("secret", "passw", "passphrase", "pw", "token", "authoriz", "key")

SECRETS: tuple[Detector, ...] = (
    # PEM private keys: from BEGIN to END, or to the end of a text cut off before END.
    Detector(
        "private_key",
        re.compile(
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----.*?"
            r"(?:-----END[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\Z)",
            re.S,
        ),
        markers=("private key",),
    ),
    # Passwords in URLs: scheme://user:password@host, user possibly empty
    # (`redis://:pw@host`) or an e-mail address. The password runs to the last `@`
    # before the host, first trying without `/` (`https://u:pw@host/a@b`), then with it
    # (`u:p/w@rd@host`; at most 256 characters: an unbounded run to the end of the text
    # is quadratic). Not a host's port (`https://h:443/p@v2`), nor an IPv6 host
    # (`http://[::1]:80/a@b`).
    Detector(
        "password",
        re.compile(
            r"(?i)(?<![A-Za-z0-9+.-])[a-z][a-z0-9+.-]*://(?!\[)[^\s:/?#\"'<>`]*"
            r":(?!\d{1,5}(?:[/?#\s]|$))(?P<secret>[^\s/\"'<>`]*|[^\s?#\"'<>`]{0,256})@"
        ),
        markers=("://",),
    ),
    # Authorization headers and bearer tokens (`Bearer KEY`, a placeholder, stays).
    Detector(
        "token",
        re.compile(rf"(?i){_START}(?:bearer|basic)\s+(?P<secret>[A-Za-z0-9._~+/=-]{{6,}})"),
        markers=("bearer", "basic"),
    ),
    Detector(
        "api_key",
        re.compile(rf"{_START}(?:{'|'.join(_PROVIDER_KEYS)})"),
        markers=_PROVIDER_MARKERS,
    ),
    # Google OAuth access tokens.
    Detector("token", re.compile(rf"{_START}ya29\.[A-Za-z0-9._-]{{10,}}"), markers=("ya29.",)),
    # JSON Web Tokens without their `Bearer`: header.payload.signature.
    Detector(
        "jwt",
        re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
        markers=("eyj",),
    ),
    # Azure SAS signatures (`...&sig=...`); AccountKey= is a secret name below.
    Detector(
        "token", re.compile(rf"(?i){_START}sig=(?P<secret>[^\s&\"'<>`,;]+)"), markers=("sig=",)
    ),
    # Secrets given as key=value, key: value, or JSON / Python dict entries.
    Detector(
        "password",
        _KEY_VALUE,
        markers=_SECRET_NAME_MARKERS,
        finder=_key_value_matches,
    ),
    # A bare AWS secret access key: 40 characters of base64 with upper and lower case
    # letters and a digit (a git hash is lower-case hex: not one). After an `=` too: a
    # query string's `?q=KEY` (base64's own `=` only ever ends a run, never starts one).
    Detector(
        "api_key",
        re.compile(
            r"(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{0,39}[A-Z])(?=[A-Za-z0-9/+]{0,39}[a-z])"
            r"(?=[A-Za-z0-9/+]{0,39}[0-9])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"
        ),
        gate=re.compile(r"[A-Za-z0-9/+]{40}"),
    ),
)


def may_hold_secret(text: str) -> bool:
    """False only if no shape of `SECRETS` (nor an e-mail address) can be in `text`."""
    lowered = text.lower()
    return "@" in lowered or any(d.may_match(text, lowered) for d in SECRETS)


# E-mail addresses. Tried only where a local part starts (not at every `\b` in it:
# quadratic on `x.x.x...@`).
EMAIL = Detector(
    "email",
    re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b"),
    markers=("@",),
)


def luhn_valid(text: str) -> bool:
    """Whether the digits of `text` pass the Luhn check (payment card numbers do)."""
    digits = [int(c) for c in text if c.isdecimal()]
    total = 0
    for i, digit in enumerate(reversed(digits)):
        if i % 2:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


# The numbers card issuers give, by their first digits (inclusive, as text) and lengths:
# Visa, Mastercard, American Express, Diners Club, JCB; Discover, UnionPay and Maestro
# start with 6, Maestro with 50 and 56 to 59 too.
_ISSUERS: tuple[tuple[str, str, frozenset[int]], ...] = (
    ("4", "4", frozenset({13, 16, 19})),
    ("51", "55", frozenset({16})),
    ("2221", "2720", frozenset({16})),
    ("34", "34", frozenset({15})),
    ("37", "37", frozenset({15})),
    ("300", "305", frozenset(range(14, 20))),
    ("36", "36", frozenset(range(14, 20))),
    ("38", "39", frozenset(range(14, 20))),
    ("3528", "3589", frozenset(range(16, 20))),
    ("6", "6", frozenset(range(13, 20))),
    ("50", "50", frozenset(range(13, 20))),
    ("56", "59", frozenset(range(13, 20))),
)


def card_issued(text: str) -> bool:
    """Whether the digits of `text` pass Luhn and start and are as long as an issuer's
    card numbers (`_ISSUERS`): the test of a number read across lines or table cells,
    where a row of figures passes Luhn one time in ten."""
    digits = "".join(c for c in text if c.isdigit())
    return luhn_valid(digits) and any(
        low <= digits[: len(low)] <= high and len(digits) in lengths
        for low, high, lengths in _ISSUERS
    )


def iban_valid(text: str) -> bool:
    """Whether `text` (spaces allowed) passes the IBAN mod-97 check (ISO 13616)."""
    compact = text.replace(" ", "").upper()
    rearranged = compact[4:] + compact[:4]
    number = "".join(str(int(c, 36)) for c in rearranged)
    return int(number) % 97 == 1


def ssn_valid(text: str) -> bool:
    """Whether `text` is a number the SSA issues: area not 000, 666 or 9xx, group not 00,
    serial not 0000."""
    digits = "".join(c for c in text if c.isdigit())
    area, group, serial = digits[:3], digits[3:5], digits[5:]
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


# The patterns below begin with the character class of their first character, and only
# then look behind it: a pattern that begins with a look-behind is tried at every
# position of the text, one that begins with a class is searched for that class (about
# twice as fast on prose).
PERSONAL: tuple[Detector, ...] = (
    EMAIL,
    # 13 to 19 digits, in groups split by spaces or dashes, that pass Luhn; across line
    # breaks and table cells, that an issuer gives too.
    Detector(
        "card",
        re.compile(r"\d(?<![\d-]\d)(?:[ -]?\d){12,18}(?![\d-])"),
        valid=luhn_valid,
        numeric=True,
        split_valid=card_issued,
    ),
    # Country code, check digits, then 11 to 30 letters or digits (grouped by 4 on paper).
    Detector(
        "iban",
        re.compile(r"[A-Z](?<![A-Za-z0-9][A-Z])[A-Z]\d{2}(?: ?[A-Z0-9]){11,30}(?![A-Za-z0-9])"),
        valid=iban_valid,
        numeric=True,
    ),
    # Phone numbers: +CC and 7 to 14 more digits, or a national number written in groups
    # ((555) 123-4567, 030 1234 5678, 555-123-4567); plain digit runs are not phones, nor
    # are dotted quads (IP addresses), dates, or a part of a longer run of digit groups.
    Detector(
        "phone",
        re.compile(
            r"(?:\+(?<![\w+.]\+)(?<!\d[ -]\+)\d{1,3}[ -]?(?:\(\d{1,4}\)[ -]?)?\d{1,4}"
            r"(?:[ -]?\d{2,4}){1,4}"
            r"|\((?<![\w+.]\()(?<!\d[ -]\()\d{2,4}\)[ -]?\d{3,4}[ -]?\d{3,4}"
            r"|\d(?<![\w+.]\d)(?<!\d[ -]\d)\d{2,3}[ -]\d{3,4}[ -]\d{3,5})(?![\w-]|[ .-]\d)"
        ),
        valid=lambda text: 7 <= sum(c.isdigit() for c in text) <= 15,
        numeric=True,
    ),
    # US social security numbers written in their groups (123-45-6789, 123 45 6789),
    # not a part of a longer run of groups; nine digits alone are not one.
    Detector(
        "ssn",
        re.compile(
            r"\d(?<![\w+.]\d)(?<!\d[ -]\d)\d{2}(?P<sep>[ -])\d{2}(?P=sep)\d{4}(?![\w-]|[ .-]\d)"
        ),
        valid=ssn_valid,
        numeric=True,
    ),
)


def host_detector(domain_suffixes: tuple[str, ...]) -> Detector | None:
    """Host names under any of `domain_suffixes` (`corp.example.com` finds
    `db1.corp.example.com`, and the suffix itself); None for no suffixes."""
    suffixes = tuple(s.strip(".").lower() for s in domain_suffixes if s.strip("."))
    if not suffixes:
        return None
    alternatives = "|".join(re.escape(s) for s in suffixes)
    return Detector(
        "host",
        re.compile(rf"(?i)(?<![A-Za-z0-9.-])(?:[a-z0-9-]+\.)*(?:{alternatives})(?![A-Za-z0-9-])"),
        markers=suffixes,
    )
