"""Minerva-style normalisation of a final math answer, in time linear in its length.

Two answers are judged equal when their normalised forms are equal strings. The steps follow
Lewkowycz et al. 2022 ("Minerva", Appendix D.1), as used by the DAPO reference scorer
(verl ``verl/utils/reward_score/math_dapo.py``): keep what follows the last ``=``; drop articles,
spaces, ``\\$`` and a list of unit words; unwrap ``$...$``, ``\\text{}``, ``\\textbf{}``,
``\\overline{}`` and ``\\boxed{}``; expand the shorthand ``\\frac12`` -> ``\\frac{1}{2}`` and
``\\sqrt2`` -> ``\\sqrt{2}``; drop thousands commas from numbers.

Where the reference is plainly wrong this module does better (each case has a test in
tests/reward/test_reward_math_dapo.py and a line in docs/reward.md):

* Numbers compare by value, not by spelling: ``025`` == ``25``, ``+7`` == ``7``, ``-0`` == ``0``,
  ``5.0`` == ``5``, ``.5`` == ``0.5``, ``-1,000`` == ``-1000``. Only ASCII digits count as digits
  (the reference's ``str.isdigit`` also accepts ``²``).
* Commas are removed only from well-formed thousands groups: ``1,000`` == ``1000`` but ``1,2``
  (two answers) no longer equals ``12``.
* A trailing full stop is dropped: ``Answer: 42.`` is ``42``.
* ``\\dfrac`` and ``\\tfrac`` are ``\\frac``; ``\\left`` / ``\\right`` sizing is dropped; the Unicode
  minus sign U+2212 is ``-``.
* The articles ``a`` / ``an`` are dropped only as whole words (the reference also cut the ``a `` in
  ``Tina `` or ``\\theta a``).
* Every step runs in linear time, so a ground truth of any length is safe; the reference's
  ``$...$`` and ``\\text{}`` regular expressions are quadratic on hostile input.
"""

from __future__ import annotations

import re

# Minerva's replacement table (Appendix D.1), applied in this order after the article rule.
_SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
    # Ours (see module docstring): display-size fractions are fractions; U+2212 is a minus sign.
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("\u2212", "-"),
)

# Units and filler words Minerva deletes wherever they occur.
REMOVED_EXPRESSIONS: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
)

_ARTICLE = re.compile(r"\b(?:an|a) ")
_SIZING = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_FRAC_SHORTHAND = re.compile(r"(frac)([^{])(.)")
_SQRT_SHORTHAND = re.compile(r"(sqrt)([^{])")
_NUMERAL = re.compile(r"(?P<sign>[+-]?)(?P<int>[0-9]{1,3}(?:,[0-9]{3})+|[0-9]*)(?:\.(?P<frac>[0-9]*))?", re.ASCII)


def normalize_final_answer(answer: str) -> str:
    """Return the Minerva normal form of ``answer`` (see the module docstring for the rules)."""
    s = answer.split("=")[-1]
    s = _ARTICLE.sub("", s)
    for before, after in _SUBSTITUTIONS:
        s = s.replace(before, after)
    s = _SIZING.sub("", s)
    for expression in REMOVED_EXPRESSIONS:
        s = s.replace(expression, "")
    s = first_inline_math_per_line(s)
    for command in ("\\text{", "\\textbf{", "\\overline{"):
        s = unwrap_command_lazy(s, command)
    s = unwrap_boxed_greedy(s)
    s = _FRAC_SHORTHAND.sub(r"frac{\2}{\3}", s)
    s = _SQRT_SHORTHAND.sub(r"sqrt{\2}", s)
    s = s.replace("$", "").strip()
    s = s.rstrip(".").strip()
    return canonical_numeral(s)


def canonical_numeral(s: str) -> str:
    """Write a plain decimal numeral in one canonical spelling; return any other string unchanged.

    ``-0,025.50`` is not a numeral (bad grouping) and is returned as is; ``+1,025.50`` becomes
    ``1025.5``; ``-0.0`` becomes ``0``. Never converts to ``int`` (no digit-count limit).
    """
    m = _NUMERAL.fullmatch(s)
    if m is None:
        return s
    if not m.group("int") and not m.group("frac"):
        return s  # no digit at all: "", "+", "-.", "."
    integer = m.group("int").replace(",", "").lstrip("0")
    fraction = (m.group("frac") or "").rstrip("0")
    value = (integer or "0") + ("." + fraction if fraction else "")
    negative = m.group("sign") == "-" and value != "0"
    return ("-" if negative else "") + value


def first_inline_math_per_line(s: str) -> str:
    """Replace each line holding two or more ``$`` by ``$content$`` of its first ``$...$`` pair.

    Equals ``re.sub(r"(.*?)(\\$)(.*?)(\\$)(.*)", "$\\3$", s)`` (``.`` stops at newlines) in linear time.
    """
    if s.count("$") < 2:
        return s
    lines = s.split("\n")
    for k, line in enumerate(lines):
        i = line.find("$")
        if i < 0:
            continue
        j = line.find("$", i + 1)
        if j >= 0:
            lines[k] = "$" + line[i + 1 : j] + "$"
    return "\n".join(lines)


def unwrap_command_lazy(s: str, opener: str) -> str:
    """Replace each ``opener`` + X + ``}`` by X, X the shortest run up to the next ``}`` on that line.

    Equals ``re.sub(re.escape(opener) + r"(.*?)\\}", r"\\1", s)`` in linear time: the positions of the
    next ``}`` and the next newline are cached, so no character is scanned more than a few times.
    """
    if opener not in s:
        return s
    out: list[str] = []
    pos = 0
    close = newline = -2  # cached: first "}" / "\n" at or after the last start searched (-1: none)
    while True:
        i = s.find(opener, pos)
        if i < 0:
            break
        start = i + len(opener)
        if close != -1 and close < start:
            close = s.find("}", start)
        if close < 0:
            break  # no "}" after here, so no later opener can match either
        if newline != -1 and newline < start:
            newline = s.find("\n", start)
        if 0 <= newline < close:
            # Every opener before this newline fails; resume after it.
            out.append(s[pos : newline + 1])
            pos = newline + 1
            continue
        out.append(s[pos:i])
        out.append(s[start:close])
        pos = close + 1
    out.append(s[pos:])
    return "".join(out)


def unwrap_boxed_greedy(s: str) -> str:
    """Replace ``\\boxed{`` + X + ``}`` by X, X running to the LAST ``}`` of that line.

    Equals ``re.sub(r"(\\\\boxed\\{)(.*)(\\})", r"\\2", s)`` in linear time.
    """
    opener = "\\boxed{"
    if opener not in s:
        return s
    out: list[str] = []
    pos = 0
    while True:
        i = s.find(opener, pos)
        if i < 0:
            break
        start = i + len(opener)
        line_end = s.find("\n", start)
        if line_end < 0:
            line_end = len(s)
        close = s.rfind("}", start, line_end)
        if close < 0:
            out.append(s[pos:line_end])
            pos = line_end
            continue
        out.append(s[pos:i])
        out.append(s[start:close])
        pos = close + 1
    out.append(s[pos:])
    return "".join(out)
