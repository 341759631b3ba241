"""Personal data and denied phrases found in text, and the text with them redacted; pure, no I/O.

The built-in kinds (`KINDS`): `email`; `phone` (international with `+`, North American, and
national numbers with a trunk `0`; 9 to 15 digits); `card` (13 to 19 digits with the Luhn check
and a bank card's first digit, 2 to 6); `iban` (its country's length from ISO 13616's registry and
the mod-97 check); and the national ids of `NATIONAL_IDS`, each a shape and, where the format has
one, its check digit (the table the config extends: `redaction.national_ids`). A match that fails
its check is not personal data: `4111 1111 1111 1112` is a number, `4111 1111 1111 1111` a card.

    finder = Finder.of(["email", "card"], national_ids={})
    finder.find("mail me at a@b.org")        # [Span(11, 18, "email")]
    finder.redact("mail me at a@b.org")      # "mail me at [EMAIL]"

The same finder serves the `personal_data` guard and every place the gateway keeps text (the
access log's prompts, the audit trail's retained text, error bodies relayed from engines), so
what a guard would redact is what a log never holds. Microsoft Presidio (behind LiteLLM's PII
masking) finds more kinds with NLP models; these are the kinds a regex and a check digit find
with few false positives, in microseconds, with no model to serve.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

Fit = Callable[["re.Match[str]"], "tuple[int, int] | None"]


@dataclass(frozen=True, slots=True)
class Span:
    """Text [start, end) found as `kind`."""

    start: int
    end: int
    kind: str


@dataclass(frozen=True, slots=True)
class Pattern:
    """One kind: its regex, and what of a match it is (`fit`: the span, or None when its check
    fails). `needs` is a character every match contains (`@`): a text without it is not
    searched. `near_digits`: every match has a digit within `REACH` characters of each of its
    ends, so only the text around digits is searched (a built-in kind's shape; an operator's
    national id is searched whole)."""

    kind: str
    regex: re.Pattern[str]
    fit: Fit | None = None
    needs: str = ""
    near_digits: bool = False

    def spans(self, text: str, start: int = 0, end: int | None = None) -> Iterable[Span]:
        for m in self.regex.finditer(text, start, len(text) if end is None else end):
            se = m.span() if self.fit is None else self.fit(m)
            if se is not None and se[1] > se[0]:
                yield Span(se[0], se[1], self.kind)


# --- check digits ------------------------------------------------------------------------------

def luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


_VERHOEFF_D = (
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 4, 0, 6, 7, 8, 9, 5), (2, 3, 4, 0, 1, 7, 8, 9, 5, 6),
    (3, 4, 0, 1, 2, 8, 9, 5, 6, 7), (4, 0, 1, 2, 3, 9, 5, 6, 7, 8), (5, 9, 8, 7, 6, 0, 4, 3, 2, 1),
    (6, 5, 9, 8, 7, 1, 0, 4, 3, 2), (7, 6, 5, 9, 8, 2, 1, 0, 4, 3), (8, 7, 6, 5, 9, 3, 2, 1, 0, 4),
    (9, 8, 7, 6, 5, 4, 3, 2, 1, 0))
_VERHOEFF_P = (
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 5, 7, 6, 2, 8, 3, 0, 9, 4), (5, 8, 0, 3, 7, 9, 6, 1, 4, 2),
    (8, 9, 1, 6, 0, 4, 3, 5, 2, 7), (9, 4, 5, 3, 1, 2, 6, 8, 7, 0), (4, 2, 8, 6, 5, 7, 3, 9, 0, 1),
    (2, 7, 9, 3, 8, 0, 6, 4, 1, 5), (7, 0, 4, 6, 9, 1, 3, 2, 5, 8))


def verhoeff(digits: str) -> bool:
    """The Verhoeff check (India's Aadhaar number's last digit)."""
    c = 0
    for i, ch in enumerate(reversed(digits)):
        c = _VERHOEFF_D[c][_VERHOEFF_P[i % 8][ord(ch) - 48]]
    return c == 0


def _es_dni(s: str) -> bool:
    """Spain's DNI: eight digits and the letter of their remainder by 23."""
    return "TRWAGMYFPDXBNJZSQVHLCKE"[int(s[:8]) % 23] == s[-1]


def _fr_nir(s: str) -> bool:
    """France's NIR (sécurité sociale): the key is 97 less the first 13 digits mod 97 (Corsica's
    2A and 2B counted as 19 and 18)."""
    body = s[:13].replace("2A", "19").replace("2B", "18")
    return body.isdigit() and 97 - int(body) % 97 == int(s[13:])


def _br_cpf(s: str) -> bool:
    """Brazil's CPF: two mod-11 check digits; eleven equal digits are not a CPF."""
    d = [ord(c) - 48 for c in s]
    if len(set(d)) == 1:
        return False
    for n in (9, 10):
        if sum(d[i] * (n + 1 - i) for i in range(n)) * 10 % 11 % 10 != d[n]:
            return False
    return True


def _us_ssn(s: str) -> bool:
    """A US SSN as issued: no area 000, 666 or 9xx, no group 00, no serial 0000."""
    return s[:3] not in ("000", "666") and s[0] != "9" and s[3:5] != "00" and s[5:] != "0000"


def _uk_nino(s: str) -> bool:
    """A UK NINO's prefix: never BG, GB, NK, KN, TN, NT or ZZ."""
    return s[:2] not in ("BG", "GB", "NK", "KN", "TN", "NT", "ZZ")


def _iban_ok(compact: str) -> bool:
    moved = compact[4:] + compact[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


CHECKS: dict[str, Callable[[str], bool]] = {"luhn": luhn, "verhoeff": verhoeff, "es_dni": _es_dni,
                                            "fr_nir": _fr_nir, "br_cpf": _br_cpf, "us_ssn": _us_ssn,
                                            "uk_nino": _uk_nino}
"""Checks a national id may name (`redaction.national_ids[].check`): check digits, or the numbers
a format never issues; read on the match's letters and digits alone (separators removed)."""

# IBAN lengths by country (the SWIFT IBAN registry).
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29, "BY": 28,
    "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18,
    "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22,
    "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20,
    "LU": 20, "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15,
    "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24, "SC": 31, "SE": 24, "SI": 19,
    "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}

_SEPARATORS = re.compile(r"[\s.-]")


def _checked(check: Callable[[str], bool]) -> Fit:
    def fit(m: re.Match[str]) -> tuple[int, int] | None:
        return m.span() if check(_SEPARATORS.sub("", m.group())) else None
    return fit


def _card(m: re.Match[str]) -> tuple[int, int] | None:
    digits = _SEPARATORS.sub("", m.group())
    return m.span() if 13 <= len(digits) <= 19 and "2" <= digits[0] <= "6" and luhn(digits) else None


def _phone(m: re.Match[str]) -> tuple[int, int] | None:
    return m.span() if 9 <= sum(c.isdigit() for c in m.group()) <= 15 else None


def _iban(m: re.Match[str]) -> tuple[int, int] | None:
    """The country's length of letters and digits from the match's start (a match runs on
    greedily, into whatever follows), if they pass mod 97."""
    text = m.group()
    length = IBAN_LENGTHS.get(text[:2])
    if length is None:
        return None
    taken, end = 0, 0
    for i, ch in enumerate(text):
        if ch != " ":
            taken += 1
            if taken == length:
                end = i + 1
                break
    if not end or not _iban_ok(text[:end].replace(" ", "")):
        return None
    return m.start(), m.start() + end


# Each regex starts with a character class, so the regex engine skips ahead to where a match can
# start (a regex that starts with a lookbehind is tried at every position: four times slower on
# prose). "Not after P" is therefore written after the first character X, as `X(?<!P.)`: the
# lookbehind spans the character before X and X itself.
_EMAIL = re.compile(r"[A-Za-z0-9._%+-](?<![\w.%+-].)[A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9-]{1,63}\.){1,8}[A-Za-z]{2,24}"
                    r"(?![\w-])", re.ASCII)
_NOT_A_TAIL = r"(?<![\w+.-].)(?<!\d[ .-].)"  # not inside a word, nor the tail of a longer run of digit groups
_PHONE = re.compile(
    r"(?:"
    r"\+" + _NOT_A_TAIL + r"\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}"  # international: +44 20 7946 0958, +1 (415) 555-0100
    r"|\(" + _NOT_A_TAIL + r"\d{3}\) ?\d{3}[ .-]\d{4}"  # North American, area code in parentheses: (415) 555-0100
    r"|\d" + _NOT_A_TAIL + r"\d{2}[.-]\d{3}[.-]\d{4}"  # North American: 415-555-0100, 415.555.0100
    r"|0" + _NOT_A_TAIL + r"[1-9]\d{0,3}(?:[ .-]\d{2,8}){1,4}"  # national, its trunk 0: 020 7946 0958, 030 1234567
    r")(?![\w])", re.ASCII)
_CARD = re.compile(r"\d(?<![\d.-].)(?:[ -]?\d){12,18}(?![\d-])", re.ASCII)
_IBAN = re.compile(r"[A-Z](?<![A-Za-z0-9].)[A-Z]\d{2}(?: ?[A-Z0-9]){11,34}", re.ASCII)


NATIONAL_IDS: dict[str, tuple[str, str | None]] = {
    # name: (regex, check) -- the shapes that say "an id" with few false positives
    "us_ssn": (r"\d(?<![\d-].)\d{2}-\d{2}-\d{4}(?![\d-])", "us_ssn"),
    "uk_nino": (r"[A-CEGHJ-PR-TW-Z](?<![A-Za-z0-9].)[A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D](?![A-Za-z0-9])",
                "uk_nino"),
    "ca_sin": (r"\d(?<![\d-].)\d{2}[ -]\d{3}[ -]\d{3}(?![\d-])", "luhn"),
    "es_dni": (r"\d(?<![A-Za-z0-9].)\d{7}-?[A-HJ-NP-TV-Z](?![A-Za-z0-9])", "es_dni"),
    "fr_nir": (r"[12](?<!\d.) ?\d{2} ?(?:0[1-9]|1[0-2]|[2-9]\d) ?(?:\d{2}|2A|2B) ?\d{3} ?\d{3} ?\d{2}(?!\d)", "fr_nir"),
    "br_cpf": (r"\d(?<![\d.].)\d{2}\.\d{3}\.\d{3}-\d{2}(?![\d-])", "br_cpf"),
    "in_aadhaar": (r"[2-9](?<![\d-].)\d{3} ?\d{4} ?\d{4}(?![\d-])", "verhoeff"),
}
"""The built-in national ids: name -> (regex, check). `redaction.national_ids` adds to it or
replaces an entry of the same name."""

KINDS: tuple[str, ...] = ("email", "phone", "card", "iban", "national_id")


def _builtin(kind: str) -> Pattern:
    if kind == "email":
        return Pattern("email", _EMAIL, needs="@")
    if kind == "phone":
        return Pattern("phone", _PHONE, _phone, near_digits=True)
    if kind == "card":
        return Pattern("card", _CARD, _card, near_digits=True)
    if kind == "iban":
        return Pattern("iban", _IBAN, _iban, near_digits=True)
    raise ValueError(f"unknown personal data kind {kind!r} (known: {', '.join(KINDS)})")


def national_id(name: str, regex: str, check: str | None, builtin: bool = False) -> Pattern:
    """One national id's pattern; an unknown check names the known ones. A built-in one is ASCII
    and searched near digits only; an operator's as written, over the whole text."""
    if check is not None and check not in CHECKS:
        raise ValueError(f"unknown check {check!r} (known: {', '.join(sorted(CHECKS))})")
    return Pattern(name, re.compile(regex, re.ASCII if builtin else 0),
                   None if check is None else _checked(CHECKS[check]), near_digits=builtin)


class Finder:
    """Finds the spans of several patterns in a text (see the module docstring)."""

    __slots__ = ("patterns",)

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        self.patterns = tuple(patterns)

    @classmethod
    def of(cls, kinds: Iterable[str], national_ids: Mapping[str, tuple[str, str | None]] | None = None) -> Finder:
        """The built-in `kinds`; `national_id` stands for every entry of the national ids (the
        built-in table with `national_ids` over it). The ids go first: of two equal spans the
        first pattern's kind is kept, and `046 454 286` is a Canadian SIN (its Luhn check holds)
        before it is a phone number."""
        kinds = list(kinds)
        out: list[Pattern] = []
        if "national_id" in kinds:
            table = {**NATIONAL_IDS, **(national_ids or {})}
            out.extend(national_id(name, rx, check, builtin=(rx, check) == NATIONAL_IDS.get(name))
                       for name, (rx, check) in table.items())
        out.extend(_builtin(kind) for kind in kinds if kind != "national_id")
        return cls(out)

    @classmethod
    def denying(cls, name: str, regexes: Iterable[str]) -> Finder:
        """An operator's deny patterns, each a Python regex (`(?i)` for any case), found as `name`."""
        return cls([Pattern(name, re.compile(rx)) for rx in regexes])

    def find(self, text: str) -> list[Span]:
        """Every match, by start; where two overlap the longer is kept."""
        found: list[Span] = []
        regions: list[tuple[int, int]] | None = None
        for p in self.patterns:
            if p.needs and p.needs not in text:
                continue
            if not p.near_digits:
                found.extend(p.spans(text))
                continue
            if regions is None:
                regions = near_digits(text)
            for a, b in regions:
                found.extend(p.spans(text, a, b))
        if len(found) < 2:
            return found
        found.sort(key=lambda s: (s.start, s.start - s.end))
        kept: list[Span] = []
        for s in found:
            if not kept or s.start >= kept[-1].end:
                kept.append(s)
            elif s.end > kept[-1].end and s.end - s.start > kept[-1].end - kept[-1].start:
                kept[-1] = s  # (sorted by start: only the last kept can overlap)
        return kept

    def redact(self, text: str) -> str:
        return redact(text, self.find(text))


REACH = 40  # a built-in kind's match has a digit within this many characters of each end
_DIGITS = re.compile(r"[0-9]+")  # (the built-in kinds are ASCII: their digits are these)


def near_digits(text: str) -> list[tuple[int, int]]:
    """The parts of `text` within `REACH` characters of a digit, merged: all a built-in kind can
    be in. Every built-in kind but e-mail has digits, and a regex whose first item is a
    lookbehind is tried at every position: prose (most of a prompt) costs one scan for digits
    instead of one per kind. A text without a digit at all costs a `str.find` per digit."""
    out: list[tuple[int, int]] = []
    if not any(d in text for d in "0123456789"):
        return out
    n = len(text)
    for m in _DIGITS.finditer(text):
        a, b = max(0, m.start() - REACH), min(n, m.end() + REACH)
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def label(kind: str) -> str:
    """What a span of `kind` becomes in redacted text."""
    return f"[{kind.upper()}]"


def redact(text: str, spans: Sequence[Span]) -> str:
    """`text` with each span (sorted, not overlapping) replaced by its label."""
    if not spans:
        return text
    out: list[str] = []
    pos = 0
    for s in spans:
        out.append(text[pos:s.start])
        out.append(label(s.kind))
        pos = s.end
    out.append(text[pos:])
    return "".join(out)
