"""User text is text: a matrix of hostile payloads (markdown images and links, bare URLs, HTML, entities,
emoji shortcodes, Streamlit colour/icon directives, math, emphasis, very long strings) is put into every
user-controlled field (run name, model, dataset and subset, phase, error, owner, output folder, alert
and warning messages, dataset column names and values, preview reasons) and every page is rendered
with AppTest. Every markdown body the app sends is parsed with a CommonMark parser (with autolinks):
no link, image or HTML may appear, each payload must read back verbatim as text, and no shortcode,
directive or math delimiter may survive unescaped.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time

import psutil
import pytest
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest

from db.entities import RunRecord
from db.store import Store
from tests.support.apptest import fake_preview, fakes, open_new_run, use_local_file  # noqa: F401 (fixture)
from tests.support.apptest import APP, TIMEOUT
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus
from ui.state import get_orchestrator
from ui.text import ZWSP, code, safe

PAYLOADS = {
    "image": "![leak](http://attacker.example/leak.png)",
    "links": "[click](https://attacker.example/a) <https://attacker.example/b> www.attacker.example x@attacker.example",
    "html": "<img src=x onerror=alert(1)><b>bold</b> &lt;i&gt; &#x3C;script&#x3E;",
    "emoji": ":smile: :+1: :red[red] :material/star: :rainbow-badge[b]",
    "markup": "$x^2$ *em* __strong__ _u_ `code` ~~gone~~ | a | b |",
    "lines": "# heading\n- item\n1. first\n> quote\n---",
}
LONG = "L" * 3000 + PAYLOADS["image"]
# Unescaped forms that Streamlit's own markdown plugins (emoji, directives, math) would interpret;
# CommonMark (the parser below) does not know them, so they are checked on the source.
INTERPRETED_BY_STREAMLIT = re.compile(r"(?<!\\):(smile|\+1|red\[|material/|rainbow-badge\[)|(?<!\\)\$x")
PARSER = MarkdownIt("commonmark", {"linkify": True}).enable(["linkify", "strikethrough", "table"])
# Never produced by the app's own markdown; block-level and emphasis interpretations of a payload (a heading,
# a list, *em*) are caught by the verbatim check instead (they would eat the markers).
FORBIDDEN_TOKENS = {"link_open", "image", "html_inline", "html_block", "table_open"}
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)  # literal in every renderer: skipped by the source check


def rendered_text(source: str) -> tuple[str, set[str]]:
    """The plain text a CommonMark renderer shows for ``source``, and the token types it produced."""
    text, kinds = [], set()
    for block in PARSER.parse(source):
        kinds.add(block.type)
        for token in block.children or []:
            kinds.add(token.type)
            if token.type in ("text", "code_inline"):
                text.append(token.content)
            elif token.type in ("softbreak", "hardbreak"):
                text.append("\n")
        if block.type in ("code_block", "fence", "html_block"):
            text.append(block.content)
    return "".join(text).replace(ZWSP, ""), kinds


def markdown_bodies(at: AppTest) -> list[str]:
    """Every string the page sends to the browser as markdown (bodies and widget labels)."""
    bodies = []
    for kind in ("markdown", "caption", "warning", "error", "info", "success", "title", "header", "subheader",
                 "toast"):
        bodies += [e.value for e in at.get(kind)]
    for kind in ("checkbox", "button", "expander", "metric", "radio", "selectbox", "multiselect", "text_input"):
        bodies += [e.label for e in at.get(kind) if getattr(e, "label", None)]
    return bodies


def assert_nothing_interpreted(at: AppTest, expected: list[str], where: str) -> None:
    assert not at.exception, f"{where}: {at.exception}"
    bodies = markdown_bodies(at)
    found = {payload: False for payload in expected}
    for body in bodies:
        text, kinds = rendered_text(body)
        for payload in found:
            if not found[payload] and _lines(payload) in _lines(text):
                found[payload] = True
        if any(p.split("\n")[0][:20] in text for p in PAYLOADS.values()) or "LLLL" in text:
            assert not (kinds & FORBIDDEN_TOKENS), f"{where}: {body!r} renders {kinds & FORBIDDEN_TOKENS}"
            assert not INTERPRETED_BY_STREAMLIT.search(CODE_SPAN.sub("", body)), \
                f"{where}: unescaped shortcode/directive in {body!r}"
    missing = [p for p, ok in found.items() if not ok]
    assert not missing, f"{where}: payloads not shown verbatim as text: {missing}\nbodies: {bodies}"


def _lines(text: str) -> str:
    return "\n".join(line.strip() for line in text.split("\n"))


# ====================================================================== the helper itself
@pytest.mark.parametrize("name", [*PAYLOADS, "long"])
def test_safe_renders_every_payload_as_its_own_text(name):
    payload = PAYLOADS.get(name, LONG)
    source = safe(payload)
    text, kinds = rendered_text(source)
    assert _lines(text) == _lines(payload)
    assert kinds <= {"paragraph_open", "paragraph_close", "inline", "text", "softbreak", "hardbreak"}
    assert not INTERPRETED_BY_STREAMLIT.search(source)


def test_safe_cuts_long_text_and_code_keeps_backticks_literal():
    assert rendered_text(safe(LONG, limit=80))[0] == "L" * 79 + "…"
    text, kinds = rendered_text(code("a `b` ``c``"))
    assert text == "a `b` ``c``" and "code_inline" in kinds and not kinds & FORBIDDEN_TOKENS


# ====================================================================== every page
PAYLOAD_RUN = "20250101-000000-aaaaaa"
OTHER_RUN = "20250101-000001-bbbbbb"
BUSY_RUN = "20251231-000000-cccccc"
QUEUED_RUN = "20251231-000001-dddddd"


@pytest.fixture
def hostile(app_home):
    """Runs whose every text field is a payload; one 'training' in this very process (so it is the active
    run in the sidebar and on Live, and is never failed by the orchestrator)."""
    store = Store()
    now = time.time()
    text = dict(model=PAYLOADS["links"], dataset=PAYLOADS["markup"] + " [" + PAYLOADS["emoji"] + "]",
                method=PAYLOADS["html"], owner=PAYLOADS["emoji"], output_dir=PAYLOADS["links"], devices="cpu")
    store.create_run(RunRecord(id=PAYLOAD_RUN, name=PAYLOADS["image"], status=RunStatus.FAILED.value, created_at=now - 30,
                         started_at=now - 30, finished_at=now - 20, error=PAYLOADS["lines"] + "\n" + PAYLOADS["html"],
                         **text))
    store.create_run(RunRecord(id=OTHER_RUN, name=LONG, status=RunStatus.STOPPED.value, created_at=now - 10,
                         parent_run_id=PAYLOAD_RUN, resumed_from_step=3, **text))
    store.create_run(RunRecord(id=BUSY_RUN, name=PAYLOADS["emoji"], status=RunStatus.RUNNING.value, created_at=now,
                         phase=PAYLOADS["image"], pid=os.getpid(), pid_started_at=psutil.Process().create_time(),
                         **text))
    store.create_run(RunRecord(id=QUEUED_RUN, name=PAYLOADS["markup"], status=RunStatus.QUEUED.value, created_at=now,
                         queue_position=1.0, **text))  # waits behind the busy run (same device)
    for run_id in (PAYLOAD_RUN, OTHER_RUN, BUSY_RUN, QUEUED_RUN):
        paths.run_dir(run_id).mkdir(parents=True, exist_ok=True)
        store.add_event(run_id, "alert", PAYLOADS["image"] + " " + PAYLOADS["emoji"])
        store.add_event(run_id, "warning", PAYLOADS["html"])
    yield store
    store.engine.dispose()


def signed_in_app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    return at


def test_sidebar_history_and_compare_show_payloads_as_text(hostile):
    at = signed_in_app()
    sidebar = [e.value for e in at.sidebar.markdown]
    assert any(rendered_text(b)[0].startswith(PAYLOADS["emoji"]) for b in sidebar), sidebar
    assert_nothing_interpreted(at, [PAYLOADS["emoji"]], "sidebar")

    at.switch_page("pages/history.py").run()
    assert_nothing_interpreted(at, [PAYLOADS["markup"], PAYLOADS["links"], PAYLOADS["html"]], "History (queue)")
    at.selectbox(key="history_pick").set_value(PAYLOAD_RUN).run()
    next(b for b in at.button if b.label == "Delete").click().run()
    assert_nothing_interpreted(at, [PAYLOADS["image"], PAYLOADS["links"]], "History (delete dialog)")
    at.selectbox(key="history_pick").set_value(OTHER_RUN).run()
    next(b for b in at.button if b.label == "Resume").click().run()
    assert_nothing_interpreted(at, [LONG], "History (resume dialog)")
    next(b for b in at.button if b.label == "Resume now").click().run()
    assert_nothing_interpreted(at, [LONG], "History (resume refused)")

    at.switch_page("pages/compare.py")
    at.query_params["run"] = [PAYLOAD_RUN, OTHER_RUN]
    at.run()
    assert_nothing_interpreted(at, [], "Compare")


def test_run_details_and_live_show_payloads_as_text(hostile):
    at = signed_in_app()
    at.switch_page("pages/run.py")
    at.query_params["run"] = PAYLOAD_RUN
    at.run()
    details = [PAYLOADS["image"], PAYLOADS["links"], PAYLOADS["html"], PAYLOADS["emoji"],
               PAYLOADS["lines"] + "\n" + PAYLOADS["html"], PAYLOADS["image"] + " " + PAYLOADS["emoji"]]
    assert_nothing_interpreted(at, details, "Run details (failed run)")
    at.query_params["run"] = OTHER_RUN
    at.run()
    assert_nothing_interpreted(at, [LONG, PAYLOADS["image"]], "Run details (resumed run)")

    at.switch_page("pages/live.py").run()  # the active run: the busy one
    assert_nothing_interpreted(at, [PAYLOADS["emoji"], PAYLOADS["image"], PAYLOADS["links"]], "Live")


def test_live_warnings_show_as_text(hostile):
    """Warnings reach a snapshot only while the pump follows a run, so render_live gets one directly."""
    snapshot = dataclasses.replace(get_orchestrator().snapshot(PAYLOAD_RUN), warnings=tuple(PAYLOADS.values()))

    def page(snapshot):
        from ui.views import render_live
        render_live(snapshot)

    at = AppTest.from_function(page, args=(snapshot,), default_timeout=TIMEOUT).run()
    assert_nothing_interpreted(at, list(PAYLOADS.values()), "render_live warnings")


def test_new_run_shows_hostile_columns_values_and_preview_reasons_as_text(fakes, tmp_path):
    data = tmp_path / "hostile.jsonl"
    columns = [PAYLOADS["image"], PAYLOADS["emoji"]]
    data.write_text("".join('{"%s": "v", "%s": "w"}\n' % tuple(c.replace('"', '\\"') for c in columns)
                            for _ in range(3)))
    fakes.result = dataclasses.replace(fake_preview(), format_reason=PAYLOADS["links"], tokenizer=PAYLOADS["markup"],
                                       dropped={PAYLOADS["html"]: 2, PAYLOADS["image"]: 1})
    at = use_local_file(open_new_run(), data)
    assert_nothing_interpreted(at, [], "New run (columns)")
    captions = [rendered_text(c)[0] for c in (e.value for e in at.caption)]
    assert any(PAYLOADS["image"] in c and PAYLOADS["emoji"] in c for c in captions), captions
    next(b for b in at.button if b.label == "Preview data").click().run()
    assert_nothing_interpreted(at, [PAYLOADS["links"], PAYLOADS["html"], PAYLOADS["image"]], "New run (preview)")
