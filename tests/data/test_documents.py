"""Documents into chunks for a data recipe (trainer_core/data/documents.py, chunking.py): every format read from real
files made here, unreadable files named with the reason while reading goes on, links out of the folder refused, and
chunk sizes and overlaps exact."""
from __future__ import annotations

import codecs
import zipfile
from collections import Counter
from pathlib import Path

import pypdf
import pytest

from trainer_core.data.chunking import chunk_segments
from trainer_core.data.documents import Chunk, DocumentProblem, read_documents

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def make_pdf(pages: list[str]) -> bytes:
    """A valid PDF whose pages show ``pages`` (lines split on \\n) in Helvetica, its cross-reference table computed."""
    count, font = len(pages), 3 + 2 * len(pages)
    objects = ["<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{' '.join(f'{3 + 2 * i} 0 R' for i in range(count))}] /Count {count} >>"]
    for i, text in enumerate(pages):
        ops = "BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({line}) Tj T*" for line in text.split("\n")) + " ET"
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 {font} 0 R "
                       f">> >> /Contents {4 + 2 * i} 0 R >>")
        objects.append(f"<< /Length {len(ops)} >>\nstream\n{ops}\nendstream")
    objects.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    return out + f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()


def make_docx(path: Path, body: str) -> None:
    """A .docx as Word writes one (content types, relationships, the document part) with ``body`` as w:body."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", (
            '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
            'content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.'
            'relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/'
            'document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main'
            '+xml"/></Types>'))
        archive.writestr("_rels/.rels", (
            '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/'
            '2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
            'relationships/officeDocument" Target="word/document.xml"/></Relationships>'))
        archive.writestr("word/document.xml", f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
                                              f'<w:document xmlns:w="{W}"><w:body>{body}</w:body></w:document>')


def texts(chunks: list[Chunk]) -> list[str]:
    return [chunk.text for chunk in chunks]


def test_a_two_page_pdf_keeps_its_page_numbers(tmp_path):
    pages = ["First page. It has two sentences.", "Second page here.\nAnd a line."]
    (tmp_path / "guide.pdf").write_bytes(make_pdf(pages))
    assert [p.extract_text() for p in pypdf.PdfReader(tmp_path / "guide.pdf").pages] == [
        "First page. It has two sentences.\n", "Second page here.\nAnd a line.\n"]  # the file is a real PDF

    chunks, problems = read_documents(tmp_path, chunk_chars=40, overlap_chars=0)
    assert problems == []
    assert [c.as_row() for c in chunks] == [
        {"source": "guide.pdf", "page": 1, "chunk": 0, "text": "First page. It has two sentences."},
        {"source": "guide.pdf", "page": 2, "chunk": 1, "text": "Second page here.\nAnd a line."}]
    # with overlap, the second chunk begins on page 1 (the end of the first) and says so
    chunks, _ = read_documents(tmp_path / "guide.pdf", chunk_chars=40, overlap_chars=10)
    assert [(c.page, c.text) for c in chunks] == [(1, "First page. It has two sentences."),
                                                  (1, "sentences.\n\nSecond page here."),
                                                  (2, "page here.\nAnd a line.")]


def test_a_docx_gives_its_paragraphs_and_table_cells_in_order(tmp_path):
    make_docx(tmp_path / "notes.docx", (
        "<w:p><w:r><w:t>Intro </w:t></w:r><w:r><w:t>text.</w:t></w:r></w:p>"
        "<w:p><w:r><w:t>Name</w:t><w:tab/><w:t>Value</w:t><w:br/><w:t>next line</w:t></w:r></w:p>"
        "<w:tbl><w:tr><w:tc><w:p><w:r><w:t>cell one</w:t></w:r></w:p></w:tc>"
        "<w:tc><w:p><w:r><w:delText>deleted</w:delText><w:t>cell two</w:t></w:r></w:p></w:tc></w:tr></w:tbl>"))
    chunks, problems = read_documents(tmp_path)
    assert problems == []
    assert [c.as_row() for c in chunks] == [{"source": "notes.docx", "page": None, "chunk": 0,
                                             "text": "Intro text.\n\nName Value\nnext line\n\ncell one\n\ncell two"}]


def test_html_gives_its_visible_text_only_and_markdown_loses_its_front_matter(tmp_path):
    (tmp_path / "page.html").write_text(
        "<html><head><title>Tab title</title><style>p { color: red }</style>"
        "<script>var secret = 'not text';</script></head><body><h1>Heading</h1><p>Caf&eacute; &amp; tea.<br>"
        "Second line.</p><noscript>enable js</noscript><ul><li>one</li><li>two</li></ul></body></html>",
        encoding="utf-8")
    (tmp_path / "readme.md").write_text("---\ntitle: x\ntags: [a]\n---\n# Title\n\nSome *text* here.\n\n- a\n- b\n",
                                        encoding="utf-8")
    chunks, problems = read_documents(tmp_path)
    assert problems == []
    assert [(c.source, c.text) for c in chunks] == [
        ("page.html", "Heading\n\nCafé & tea.\nSecond line.\n\none\n\ntwo"),
        ("readme.md", "# Title\n\nSome *text* here.\n\n- a\n- b")]


def test_text_loses_nul_and_control_characters_and_old_encodings_are_read(tmp_path):
    (tmp_path / "nul.txt").write_bytes(b"Hel\x00lo\x00 wor\x01ld.\x00\x00\n")
    (tmp_path / "latin.txt").write_bytes("Caf\xe9 cr\xe8me.".encode("latin-1"))
    (tmp_path / "wide.txt").write_bytes(codecs.BOM_UTF16_LE + "Wide text.".encode("utf-16-le"))
    chunks, problems = read_documents(tmp_path)
    assert problems == []
    assert [(c.source, c.text) for c in chunks] == [("latin.txt", "Café crème."), ("nul.txt", "Hello world."),
                                                    ("wide.txt", "Wide text.")]


def test_unreadable_files_are_named_with_the_reason_and_reading_goes_on(tmp_path):
    (tmp_path / "a_good.txt").write_text("Fine text.", encoding="utf-8")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\ngarbage garbage\n")
    (tmp_path / "plain.pdf").write_bytes(make_pdf(["Secret page."]))
    writer = pypdf.PdfWriter(clone_from=tmp_path / "plain.pdf")
    writer.encrypt("secret")
    writer.write(tmp_path / "locked.pdf")
    (tmp_path / "plain.pdf").unlink()
    (tmp_path / "blank.pdf").write_bytes(make_pdf([""]))
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "spaces.md").write_text("---\ntitle: only front matter\n---\n \n\t\n", encoding="utf-8")
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "fake.docx").write_bytes(b"not a zip")
    with zipfile.ZipFile(tmp_path / "nodoc.docx", "w") as archive:
        archive.writestr("word/other.xml", "<x/>")
    (tmp_path / "z_big.txt").write_text("x" * 2000, encoding="utf-8")

    chunks, problems = read_documents(tmp_path, max_file_bytes=1500)
    assert [c.as_row() for c in chunks] == [{"source": "a_good.txt", "page": None, "chunk": 0, "text": "Fine text."}]
    assert problems == [
        DocumentProblem("binary.txt", "binary data, not text (23% control characters)"),
        DocumentProblem("blank.pdf", "no text found (a scanned PDF needs OCR first)"),
        DocumentProblem("broken.pdf", "not a readable PDF (PdfStreamError: Stream has ended unexpectedly)"),
        DocumentProblem("empty.txt", "no text found"),
        DocumentProblem("fake.docx", "not a DOCX file (not a zip archive)"),
        DocumentProblem("locked.pdf", "the PDF is encrypted (it needs a password): save a copy without one"),
        DocumentProblem("nodoc.docx", "not a DOCX file (it has no word/document.xml)"),
        DocumentProblem("spaces.md", "no text found"),
        DocumentProblem("z_big.txt", "2,000 bytes: over the limit of 1,500 (max_file_bytes)")]


def test_a_docx_that_unpacks_past_the_limit_or_declares_entities_is_refused(tmp_path):
    make_docx(tmp_path / "bomb.docx", "<w:p><w:r><w:t>" + "a" * 5000 + "</w:t></w:r></w:p>")
    with zipfile.ZipFile(tmp_path / "entities.docx", "w") as archive:
        archive.writestr("word/document.xml", '<!DOCTYPE d [<!ENTITY a "aaaa">]><d>&a;</d>')
    _, problems = read_documents(tmp_path, max_file_bytes=3000)
    assert [p.source for p in problems] == ["bomb.docx", "entities.docx"]
    assert problems[0].message.startswith("word/document.xml unpacks to 5,")
    assert problems[0].message.endswith("bytes: over the limit of 3,000 (max_file_bytes)")
    assert problems[1].message == ("word/document.xml declares a DOCTYPE or entities, which Word never writes: "
                                   "not read")


def test_folders_are_walked_in_name_order_and_other_files_are_counted(tmp_path):
    for name in ("b/z.txt", "b/a.md", "a/deep/c.htm", "top.txt", "data.csv", "b/image.png", "Makefile",
                 ".hidden.txt", ".git/config.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"Text of {name}.", encoding="utf-8")
    read = read_documents(tmp_path)
    assert [c.source for c in read.chunks] == ["a/deep/c.htm", "b/a.md", "b/z.txt", "top.txt"]
    assert read.problems == []
    assert read.skipped == Counter({".csv": 1, ".png": 1, "(none)": 1})


def test_links_out_of_the_folder_are_refused_and_links_inside_it_are_read(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("Not to be read.", encoding="utf-8")
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "sub" / "real.txt").write_text("Real text.", encoding="utf-8")
    (docs / "leak.txt").symlink_to(outside / "secret.txt")
    (docs / "leakdir").symlink_to(outside)
    (docs / "loop").symlink_to(docs)
    (docs / "same.txt").symlink_to(docs / "sub" / "real.txt")
    (docs / "gone.txt").symlink_to(docs / "missing.txt")
    (docs / "ring1").symlink_to(docs / "ring2")
    (docs / "ring2").symlink_to(docs / "ring1")

    chunks, problems = read_documents(docs)
    assert [(c.source, c.text) for c in chunks] == [("same.txt", "Real text."), ("sub/real.txt", "Real text.")]
    assert problems == [DocumentProblem("gone.txt", "a symbolic link to nothing (its target is gone)"),
                        DocumentProblem("leak.txt", "a symbolic link to a place outside the folder: not followed"),
                        DocumentProblem("leakdir", "a symbolic link to a place outside the folder: not followed"),
                        DocumentProblem("ring1", "a symbolic link that leads back to itself: not followed"),
                        DocumentProblem("ring2", "a symbolic link that leads back to itself: not followed")]
    # roots widen the bound to the allowed folders, and a folder outside them is not read at all
    chunks, problems = read_documents(docs, roots=[tmp_path])
    assert [c.source for c in chunks] == ["leak.txt", "leakdir/secret.txt", "same.txt", "sub/real.txt"]
    chunks, problems = read_documents(outside, roots=[docs])
    assert chunks == [] and problems == [DocumentProblem("outside", f"{outside} resolves outside the allowed "
                                                                    "folders: not read")]


def test_more_files_than_max_files_reads_the_first_ones_and_says_so(tmp_path):
    for name in "abc":
        (tmp_path / f"{name}.txt").write_text(f"File {name}.", encoding="utf-8")
    chunks, problems = read_documents([tmp_path], max_files=2)
    assert texts(chunks) == ["File a.", "File b."]
    assert problems == [DocumentProblem("c.txt", "more than 2 documents (max_files): the first 2 in name order "
                                                 "were read")]


def test_chunks_are_cut_at_sentences_within_the_size_and_overlap_by_whole_sentences():
    text = " ".join(f"Sentence number {n:02d}." for n in range(8))  # 19 characters each, 159 in all
    chunks = chunk_segments([(None, text)], 60, 20)
    assert chunks == [(None, "Sentence number 00. Sentence number 01. Sentence number 02."),
                      (None, "Sentence number 02. Sentence number 03. Sentence number 04."),
                      (None, "Sentence number 04. Sentence number 05. Sentence number 06."),
                      (None, "Sentence number 06. Sentence number 07.")]
    assert chunk_segments([(None, text)], 60, 0) == [
        (None, "Sentence number 00. Sentence number 01. Sentence number 02."),
        (None, "Sentence number 03. Sentence number 04. Sentence number 05."),
        (None, "Sentence number 06. Sentence number 07.")]


def test_paragraphs_are_kept_whole_where_they_fit_and_whitespace_is_normalised():
    text = "  First   paragraph\there.  \r\n\r\n\n Second\u00a0one.\n  Its second line.\f\fThird."
    assert chunk_segments([(None, text)], 52, 10) == [  # the first chunk is 51 characters
        (None, "First paragraph here.\n\nSecond one.\nIts second line."), (None, "line.\n\nThird.")]


def test_a_sentence_longer_than_a_chunk_is_cut_at_spaces_or_hard_and_still_overlaps():
    words = " ".join(f"w{n:02d}" for n in range(30))  # 119 characters, no sentence end
    chunks = chunk_segments([(3, words)], 40, 10)
    assert [text for _, text in chunks] == [
        "w00 w01 w02 w03 w04 w05 w06",  # at most 40 - 10 - 1 = 29 new characters a chunk, cut at a space
        "w05 w06 w07 w08 w09 w10 w11 w12 w13",
        "w12 w13 w14 w15 w16 w17 w18 w19 w20",
        "w19 w20 w21 w22 w23 w24 w25 w26 w27",
        "w26 w27 w28 w29"]
    assert {page for page, _ in chunks} == {3}
    chunks = chunk_segments([(None, "x" * 70)], 40, 10)
    assert [text for _, text in chunks] == ["x" * 29, "x" * 39, "x" * 22]  # no space: hard cuts, 10 overlap
    assert all(len(text) <= 40 for _, text in chunks)


@pytest.mark.parametrize("arguments, message", [
    ({"chunk_chars": 0}, "chunk_chars must be an integer of at least 1, not 0"),
    ({"overlap_chars": -1}, "overlap_chars must be an integer of at least 0, not -1"),
    ({"chunk_chars": 100, "overlap_chars": 100}, "overlap_chars (100) must be smaller than chunk_chars (100)"),
    ({"max_files": 0}, "max_files must be an integer of at least 1, not 0"),
    ({"max_file_bytes": 1.5}, "max_file_bytes must be an integer of at least 1, not 1.5"),
])
def test_bad_arguments_are_refused_naming_the_argument(tmp_path, arguments, message):
    with pytest.raises(ValueError) as caught:
        read_documents(tmp_path, **arguments)
    assert str(caught.value) == message
