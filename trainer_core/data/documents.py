"""Documents into chunks: the seed rows of a data recipe (each keeps its source file, page and chunk number).

``read_documents`` reads PDF (pypdf; page numbers kept), DOCX (the paragraphs of ``word/document.xml``, stdlib
only), HTML (visible text: script, style, noscript, template and title dropped), Markdown (kept as text, front
matter dropped) and plain text, from files or folders walked recursively in name order. A file it cannot use is a
``DocumentProblem`` naming the file and why, and reading goes on; files of other types are counted by suffix in
``DocumentsRead.skipped``; hidden files and folders (a leading dot) are passed over. Symbolic links that resolve
outside the folder given (or outside ``roots``, when given) are refused, never followed.

Each file's text is cut by ``chunking.chunk_segments``: at paragraph boundaries, then at sentence ends, to at most
``chunk_chars`` characters, each chunk beginning with about ``overlap_chars`` of the one before it; a chunk's page
is the page it begins on. Pure Python: the dashboard (previews) and the recipe's worker both import it.
"""
from __future__ import annotations

import codecs
import html.parser
import io
import os
import re
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import pypdf

from trainer_core.data.chunking import chunk_segments

SUPPORTED_SUFFIXES = (".pdf", ".docx", ".html", ".htm", ".md", ".markdown", ".txt")
BINARY_SHARE = 0.1  # control characters past this share of a text file: it is binary data, not text
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")  # removed from text; \t \n \v \f \r are whitespace
_LATIN1_CONTROL = re.compile(r"[\x01-\x08\x0e-\x1f\x7f-\x9f]")  # what binary bytes decode to (NUL left out: UTF-16)
_FRONT_MATTER = re.compile(r"\A(?:---[^\S\n]*\n.*?\n(?:---|\.\.\.)|\+\+\+[^\S\n]*\n.*?\n\+\+\+)[^\S\n]*(?:\n|\Z)",
                           re.DOTALL)


@dataclass(frozen=True)
class Chunk:
    source: str        # the file, relative to the folder given (posix); a file given alone: its name
    page: int | None   # 1-based page the chunk begins on (PDFs only)
    index: int         # the chunk's number within its file, from 0
    text: str

    def as_row(self) -> dict:
        return {"source": self.source, "page": self.page, "chunk": self.index, "text": self.text}


@dataclass(frozen=True)
class DocumentProblem:
    source: str
    message: str


class DocumentsRead(tuple):
    """``(chunks, problems)`` as a pair, plus ``skipped``: files left out for their type, counted by suffix."""

    def __new__(cls, chunks: list[Chunk], problems: list[DocumentProblem], skipped: Counter) -> DocumentsRead:
        read = super().__new__(cls, (chunks, problems))
        read.skipped = skipped
        return read

    @property
    def chunks(self) -> list[Chunk]:
        return self[0]

    @property
    def problems(self) -> list[DocumentProblem]:
        return self[1]


class _Unreadable(Exception):
    """Why one file gives no text (the message names no path: the problem's source does)."""


def read_documents(paths: Path | list[Path], *, chunk_chars: int = 1500, overlap_chars: int = 200,
                   max_files: int = 2000, max_file_bytes: int = 50_000_000,
                   roots: list[Path] | None = None) -> DocumentsRead:
    """Every supported file under ``paths`` (files or folders), chunked; see the module docstring."""
    for name, value, low in (("chunk_chars", chunk_chars, 1), ("overlap_chars", overlap_chars, 0),
                             ("max_files", max_files, 1), ("max_file_bytes", max_file_bytes, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer of at least {low}, not {value!r}")
    if overlap_chars >= chunk_chars:
        raise ValueError(f"overlap_chars ({overlap_chars}) must be smaller than chunk_chars ({chunk_chars})")
    found: list[tuple[str, Path]] = []
    problems: list[DocumentProblem] = []
    skipped: Counter = Counter()
    for given in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        _collect(Path(given), roots, found, problems, skipped, max_files + 1)
    if len(found) > max_files:
        problems.append(DocumentProblem(found[max_files][0], f"more than {max_files:,} documents (max_files): the "
                                                             f"first {max_files:,} in name order were read"))
        del found[max_files:]
    chunks: list[Chunk] = []
    for source, path in found:
        try:
            segments = _read(path, max_file_bytes)
        except _Unreadable as exc:
            problems.append(DocumentProblem(source, str(exc)))
            continue
        texts = chunk_segments(segments, chunk_chars, overlap_chars)
        chunks += [Chunk(source, page, index, text) for index, (page, text) in enumerate(texts)]
    return DocumentsRead(chunks, problems, skipped)


# ---------------------------------------------------------------------- finding the files
def _inside(path: Path, bounds: list[Path]) -> bool:
    return any(path == bound or bound in path.parents for bound in bounds)


def _collect(given: Path, roots: list[Path] | None, found: list, problems: list, skipped: Counter, limit: int) -> None:
    """Add the files of one path given (a file or a folder) to ``found``, up to ``limit`` of them."""
    resolved = given.expanduser().resolve()
    bounds = [Path(root).expanduser().resolve() for root in roots] if roots is not None else None
    name = given.name or str(given)
    if bounds is not None and not _inside(resolved, bounds):
        problems.append(DocumentProblem(name, f"{given} resolves outside the allowed folders: not read"))
    elif resolved.is_dir():
        _walk(given, Path(), bounds or [resolved], found, problems, skipped, limit, {resolved})
    elif resolved.is_file():
        _add(given, name, found, skipped)
    else:
        problems.append(DocumentProblem(name, f"{given} is not a file or folder"))


def _walk(folder: Path, rel: Path, bounds: list[Path], found: list, problems: list, skipped: Counter, limit: int,
          seen: set[Path]) -> None:
    try:
        entries = sorted(folder.iterdir(), key=lambda entry: entry.name)
    except OSError as exc:
        source = rel.as_posix() if rel.parts else folder.name
        problems.append(DocumentProblem(source, f"the folder cannot be listed ({exc.strerror})"))
        return
    for entry in entries:
        if len(found) >= limit:
            return
        source = (rel / entry.name).as_posix()
        if entry.name.startswith("."):
            continue
        if entry.is_symlink():
            try:
                target = entry.resolve()
            except (OSError, RuntimeError):  # RuntimeError: a loop of links (Python < 3.13)
                problems.append(DocumentProblem(source, "a symbolic link that leads back to itself: not followed"))
                continue
            if not _inside(target, bounds):
                problems.append(DocumentProblem(source, "a symbolic link to a place outside the folder: not followed"))
                continue
            if not target.exists():
                problems.append(DocumentProblem(source, "a symbolic link to nothing (its target is gone)"))
                continue
            if entry.is_dir() and target in seen:
                continue  # a link back to a folder already walked (or to one of its parents)
        if entry.is_dir():
            seen.add(entry.resolve())
            _walk(entry, rel / entry.name, bounds, found, problems, skipped, limit, seen)
        elif entry.is_file():
            _add(entry, source, found, skipped)


def _add(path: Path, source: str, found: list, skipped: Counter) -> None:
    if path.suffix.lower() in SUPPORTED_SUFFIXES:
        found.append((source, path))
    else:
        skipped[path.suffix.lower() or "(none)"] += 1


# ---------------------------------------------------------------------- reading one file
def _read(path: Path, max_file_bytes: int) -> list[tuple[int | None, str]]:
    """(page, text) segments of one file; _Unreadable says why there are none."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise _Unreadable(f"cannot be read ({exc.strerror})") from None
    if size > max_file_bytes:
        raise _Unreadable(f"{size:,} bytes: over the limit of {max_file_bytes:,} (max_file_bytes)")
    suffix = path.suffix.lower()
    try:
        if suffix == ".pdf":
            segments = _pdf_pages(path)
        else:
            data = path.read_bytes()
            text = _docx_text(data, max_file_bytes) if suffix == ".docx" else _decode(data)
            if suffix in (".html", ".htm"):
                text = _html_text(text)
            elif suffix in (".md", ".markdown"):
                text = _FRONT_MATTER.sub("", text, count=1)
            segments = [(None, text)]
    except OSError as exc:
        raise _Unreadable(f"cannot be read ({exc.strerror or exc})") from None
    segments = [(page, _CONTROL.sub("", text)) for page, text in segments]
    if not any(text.strip() for _, text in segments):
        scanned = " (a scanned PDF needs OCR first)" if suffix == ".pdf" else ""
        raise _Unreadable(f"no text found{scanned}")
    return segments


def _pdf_pages(path: Path) -> list[tuple[int | None, str]]:
    try:
        reader = pypdf.PdfReader(path)
        if reader.is_encrypted and not _opens_without_password(reader):
            raise _Unreadable("the PDF is encrypted (it needs a password): save a copy without one")
        return [(number, page.extract_text() or "") for number, page in enumerate(reader.pages, 1)]
    except _Unreadable:
        raise
    except Exception as exc:  # noqa: BLE001 - pypdf on a damaged file raises far more than PdfReadError; one file
        raise _Unreadable(f"not a readable PDF ({type(exc).__name__}: {str(exc)[:200]})") from None  # fails, not all


def _opens_without_password(reader: pypdf.PdfReader) -> bool:
    """An owner-password-only PDF opens with the empty user password."""
    try:
        return bool(reader.decrypt(""))
    except (pypdf.errors.PyPdfError, NotImplementedError, ValueError):  # e.g. AES without the cryptography package
        return False


def _decode(data: bytes) -> str:
    """UTF-16 by its byte order mark, else UTF-8, else Latin-1; binary data (control characters) is _Unreadable."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            raise _Unreadable("not valid UTF-16 text, though it begins with a UTF-16 byte order mark") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    controls = len(_LATIN1_CONTROL.findall(text))
    if text and controls > BINARY_SHARE * len(text):
        raise _Unreadable(f"binary data, not text ({controls / len(text):.0%} control characters)")
    return text


def _docx_text(data: bytes, max_bytes: int) -> str:
    """The paragraphs of word/document.xml, one per line pair; tables' cells are paragraphs too."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            info = archive.getinfo("word/document.xml")
            if info.file_size > max_bytes:  # a zip bomb unpacks small files into gigabytes
                raise _Unreadable(f"word/document.xml unpacks to {info.file_size:,} bytes: over the limit of "
                                  f"{max_bytes:,} (max_file_bytes)")
            xml = archive.read(info)
    except zipfile.BadZipFile:
        raise _Unreadable("not a DOCX file (not a zip archive)") from None
    except KeyError:
        raise _Unreadable("not a DOCX file (it has no word/document.xml)") from None
    if b"<!DOCTYPE" in xml or b"<!ENTITY" in xml:  # Word never writes them; entity expansion is how XML bombs work
        raise _Unreadable("word/document.xml declares a DOCTYPE or entities, which Word never writes: not read")
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        raise _Unreadable(f"word/document.xml is not well-formed XML ({exc})") from None
    paragraphs: list[list[str]] = []
    stack = [(root, None)]  # (element, the paragraph's text parts it adds to): no recursion on deep XML
    while stack:
        element, parts = stack.pop()
        name = element.tag.rpartition("}")[2]
        if name == "p":
            parts = []
            paragraphs.append(parts)  # filled as its children are visited (in document order, below)
        elif name == "t" and parts is not None:
            parts.append(element.text or "")
        elif name == "tab" and parts is not None:
            parts.append("\t")
        elif name in ("br", "cr") and parts is not None:
            parts.append("\n")
        stack.extend((child, parts) for child in reversed(element))
    return "\n\n".join("".join(parts) for parts in paragraphs)


class _VisibleText(html.parser.HTMLParser):
    HIDDEN = frozenset({"script", "style", "noscript", "template", "title"})
    BLOCKS = frozenset({"p", "div", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "tr",
                        "table", "section", "article", "header", "footer", "nav", "aside", "main", "pre",
                        "blockquote", "figure", "figcaption", "hr", "form", "fieldset", "address", "details"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in self.HIDDEN:
            self.hidden += 1
        elif tag == "br":
            self.parts.append("\n")
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")
        elif tag in ("td", "th"):
            self.parts.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.HIDDEN:
            self.hidden = max(0, self.hidden - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


def _html_text(text: str) -> str:
    parser = _VisibleText()
    parser.feed(text)
    parser.close()
    return "".join(parser.parts)
