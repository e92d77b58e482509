"""One document's text cut into overlapping chunks, for a data recipe's seed rows (``documents.read_documents``).

A document is (page, text) segments. Its text is cut at paragraph boundaries (a blank line), then at sentence ends,
into chunks of at most ``chunk_chars`` characters; a sentence too long to fit beside the overlap is cut at its last
space before the limit (hard, where it has none). Each chunk after the first begins with about
``overlap_chars`` of the one before it: whole sentences when they give at least half of that, else the last
characters from a word's start. Whitespace is normalised: spaces collapsed inside a line, blank lines between
paragraphs. A chunk's page is the page it begins on.
"""
from __future__ import annotations

import re

_PARAGRAPH = re.compile(r"\n[^\S\n]*\n\s*")
_SENTENCE_END = re.compile(r"(?:(?<=[.!?\u3002\uff01\uff1f])|(?<=[.!?][\"')\]\u201d\u2019]))\s+")
Piece = tuple[int | None, str, str]  # (page, text, the separator before it: "\n\n", "\n" or " ")


def _pieces(segments: list[tuple[int | None, str]], longest: int) -> list[Piece]:
    """(page, text, separator before it) per sentence, whitespace normalised; a sentence over ``longest`` is cut."""
    pieces = []
    for page, text in segments:
        for paragraph in _PARAGRAPH.split(text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n\n")):
            lines = [" ".join(line.split()) for line in paragraph.split("\n")]
            paragraph = "\n".join(line for line in lines if line)
            separator, start = "\n\n", 0
            for end in [*_SENTENCE_END.finditer(paragraph), None]:
                sentence = paragraph[start:end.start() if end else len(paragraph)]
                for number, (part, joint) in enumerate(_cut(sentence, longest)):
                    pieces.append((page, part, joint if number else separator))
                if end:
                    separator, start = ("\n" if "\n" in end.group() else " "), end.end()
    return pieces


def _cut(sentence: str, longest: int) -> list[tuple[str, str]]:
    """(part, separator before it) of ``sentence`` in parts of at most ``longest`` characters, each cut at the last
    space or line break before the limit, or hard where there is none (joined again by ""); the first's is ""."""
    parts: list[tuple[str, str]] = []
    joint, start = "", 0  # an offset, not a slice of what is left: a 50 MB line would be copied once per part
    while len(sentence) - start > longest:
        limit = start + longest + 1
        space = max(sentence.rfind(" ", start, limit), sentence.rfind("\n", start, limit))
        at = space if space > start else start + longest
        parts.append((sentence[start:at], joint))
        joint = sentence[at] if space > start else ""
        start = at + 1 if space > start else at
    return parts + [(sentence[start:], joint)] if start < len(sentence) else parts


def _joined(pieces: list[Piece]) -> str:
    return "".join((separator if i else "") + text for i, (_, text, separator) in enumerate(pieces))


def _overlap(chunk: list[Piece], overlap_chars: int) -> list[Piece]:
    """The end of ``chunk`` that begins the next one: whole sentences up to ``overlap_chars`` when they give at least
    half of it, else the last ``overlap_chars`` characters from a word's start."""
    if not overlap_chars:
        return []
    kept: list = []
    for piece in reversed(chunk):
        if len(_joined([piece, *kept])) > overlap_chars:
            break
        kept.insert(0, piece)
    if 2 * len(_joined(kept)) >= overlap_chars:
        return kept
    text = _joined(chunk)
    tail = text[-overlap_chars:]
    if len(text) > overlap_chars and not text[-overlap_chars - 1].isspace() and " " in tail:
        tail = tail[tail.index(" "):]  # begin at a word, not inside one
    return [(chunk[-1][0], tail.strip(), " ")] if tail.strip() else []


def chunk_segments(segments: list[tuple[int | None, str]], chunk_chars: int,
                   overlap_chars: int) -> list[tuple[int | None, str]]:
    """(page, text) chunks of one file's (page, text) segments; see the module docstring."""
    longest = max(chunk_chars // 2, chunk_chars - overlap_chars - 1)  # a cut sentence's part leaves room to overlap
    chunks: list[tuple[int | None, str]] = []
    current: list = []
    fresh = False  # whether ``current`` holds more than the overlap carried from the chunk before
    for piece in _pieces(segments, longest):
        if current and len(_joined([*current, piece])) > chunk_chars:
            if fresh:
                chunks.append((current[0][0], _joined(current)))
                current, fresh = _overlap(current, overlap_chars), False
            while current and len(_joined([*current, piece])) > chunk_chars:
                current = current[1:]
        current.append(piece)
        fresh = True
    if fresh:
        chunks.append((current[0][0], _joined(current)))
    return chunks
