"""User text is text: the one helper for putting user-provided text into Streamlit markdown.

Run names, model and dataset names, dataset values, column names, subsets, paths and error messages
that quote them are written into ``st.markdown``/``st.caption``/``st.warning``/... through ``safe``.
It backslash-escapes (CommonMark renders an escaped character literally) every character that could
start markdown, HTML, math or a Streamlit directive: ``\\ ` * [ ] < ~ $ |``, ``&`` before an entity,
``_`` unless inside a word, ``:`` unless followed by a space (``:red[..]``, ``:material/x:`` and ``http:`` need one that is not),
``@`` (e-mail autolinks), the dot of ``www.`` (autolinks), and the markers that only count at the start
of a line (``# > - + =`` and ``1.``). A zero-width space after the first colon of ``:name:`` keeps
Streamlit's emoji-shortcode plugin from turning it into an emoji. Line breaks stay line breaks.
Everything else (``. , ( ) ' " -`` in prose) is left as it is, so messages read the same in the source.
"""
from __future__ import annotations

import re

_INLINE = re.compile(r"""[\\`*\[\]<~$|@]|&(?=#?\w+;)|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|:(?=\S)|(?<=www)\.""", re.IGNORECASE)
_LINE_START = re.compile(r"^([#>+=-]|\d+[.)])")
_SHORTCODE = re.compile(r"(\\:)(?=[\w+-]+\\?:)")  # after escaping, ":smile:" reads "\:smile\:"
ZWSP = "\u200b"


def _escape_line(line: str) -> str:
    line = _INLINE.sub(lambda m: "\\" + m.group(0), line.strip())
    line = _LINE_START.sub(lambda m: m.group(0)[:-1] + "\\" + m.group(0)[-1], line)
    return _SHORTCODE.sub(r"\1" + ZWSP, line)


def safe(value: object, limit: int | None = None) -> str:
    """``value`` as markdown that renders exactly as the text it is; cut to ``limit`` characters with "…"."""
    text = "" if value is None else str(value)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "  \n".join(_escape_line(line) for line in lines)  # stripped: indentation never makes a code block


def code(value: object, limit: int | None = None) -> str:
    """``value`` shown as inline code (paths, column names): a backtick run longer than any inside it."""
    text = "" if value is None else str(value).replace("\n", " ")
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""  # CommonMark strips one space each side
    return f"{fence}{pad}{text}{pad}{fence}"
