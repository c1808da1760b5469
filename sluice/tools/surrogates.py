"""Lone UTF-16 surrogates in a model's JSON, mended to U+FFFD.

JSON escapes characters as UTF-16: "\\ud83d\\ude00" is one emoji, and a model
may write half of such a pair ("\\ud83d" alone). Decoded, that half is a lone
surrogate, which no UTF-8 encoder takes (orjson refuses it: the response would
be a 500) and strict JSON parsers refuse. It stands for no character, so it
becomes U+FFFD, as a broken UTF-8 byte does when text is decoded:
- in a decoded string (a call's name), the lone surrogate becomes "\\ufffd";
- in verbatim JSON text (a call's arguments), the escape "\\ud83d" becomes the
  escape "\\ufffd": the same length, so every position in the text stays put.
Streamed text is mended as it grows: an escape cut by the end of the text, or a
high surrogate that the next escape may still pair, is undecided and held
back (`mend_escapes` with `is_decided` false returns the decided part only),
so what goes out is a prefix of the mended whole.
"""

from __future__ import annotations

import re

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_REPLACEMENT_ESCAPE = "\\ufffd"
# One escape, read left to right so that "\\\\" pairs are never split: a
# surrogate pair, a high surrogate that ends the text (maybe cut before its
# pair), a lone surrogate, an escape cut by the end, or any other escape.
_ESCAPE = re.compile(
    r"""\\(?:
      u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}
    | (?P<high>u[dD][89abAB][0-9a-fA-F]{2})
      (?P<cut>\\(?:u(?:[dD](?:[c-fC-F][0-9a-fA-F]?)?)?)?)?\Z
    | (?P<lone>u[dD][89a-fA-F][0-9a-fA-F]{2})
    | (?P<partial>(?:u[0-9a-fA-F]{0,3})?\Z)
    | .)""",
    re.DOTALL | re.VERBOSE,
)


def mend_decoded(text: str) -> str:
    """A decoded JSON string with each lone surrogate replaced by U+FFFD."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def mend_escapes(json_text: str, is_decided: bool) -> str:
    """Verbatim JSON text (starting outside an escape) with each lone surrogate
    escape replaced by "\\ufffd". Not `is_decided` (more text may follow): the
    text up to where an escape at its end is still undecided."""
    pieces: list[str] = []
    position = 0
    for escape in _ESCAPE.finditer(json_text):
        is_open = escape["partial"] is not None or escape["high"] is not None
        if is_open and not is_decided:
            pieces.append(json_text[position : escape.start()])
            return "".join(pieces)
        if escape["lone"] is None and escape["high"] is None:
            continue
        pieces.append(json_text[position : escape.start()])
        pieces.append(_REPLACEMENT_ESCAPE + (escape["cut"] or ""))
        position = escape.end()
    pieces.append(json_text[position:])
    return "".join(pieces)
