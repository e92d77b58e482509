"""The Playground's embedding search (issue 21), through trainer_core/tryout/search.py and its child process: after a short
run on invented jargon, a held-out phrasing of a question finds its passage first with the tuned model, among the
run's own passages; the base model, which cannot know the words, does not rank it first for most queries. Bad
requests are named before a process starts."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.methods.test_embedding_run import jargon_files, run_config
from tests.support.data_rows import jargon
from trainer_core.tryout import search
from trainer_core.specs.model_source import ModelSource
from trainer_core.methods.embedding import BUNDLED_MODEL
from trainer_core.protocol.status import RunStatus
from tests.support import ROOT
from tests.support.apptest import open_page
from ui.state import get_orchestrator


def test_a_request_is_checked_before_any_process_starts():
    base = (ModelSource(model=BUNDLED_MODEL),)
    with pytest.raises(search.SearchError, match="query: type what to search for"):
        search.search(search.Request(sources=base, query=" ", passages=("a",)))
    with pytest.raises(search.SearchError, match="passages: none to search"):
        search.search(search.Request(sources=base, query="q", passages=()))
    with pytest.raises(search.SearchError, match="no NUL"):
        search.search(search.Request(sources=base, query="q", passages=("a\x00b",)))
    too_many = tuple(f"p{i}" for i in range(search.PASSAGES_MAX + 1))
    with pytest.raises(search.SearchError, match="more than the 2,000"):
        search.search(search.Request(sources=base, query="q", passages=too_many))
    assert search.pasted_passages("one\n\n two \none\n") == ["one", "two"]


def test_the_search_child_runs_on_the_cpu_without_secrets(monkeypatch):
    """Hostile review (issue 31 #8): on a CUDA host each click loaded models onto a GPU a training run had reserved;
    the Playground's search is no job the queue gives a device, so its child sees no GPU (as Speak's)."""
    sent = {}

    def child(argv, input, env, **kwargs):  # plays the child: one ranking per source
        sent.update(json.loads(input), argv=argv, env=env)
        return subprocess.CompletedProcess(argv, 0, json.dumps({"rankings": [
            {"label": "base", "similarity": "cosine", "hits": [{"index": 0, "score": 0.5}]}]}) + "\n", "")

    monkeypatch.setattr(subprocess, "run", child)
    monkeypatch.setenv("FINETUNE_STUDIO_SANDBOX", "off")  # the sandbox's own tests run it; this one reads the env
    monkeypatch.delenv("FINETUNE_STUDIO_FORCE_CPU", raising=False)  # a CUDA host's server: not forced itself
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    rankings = search.search(search.Request(sources=(ModelSource(model=BUNDLED_MODEL),), query="q", passages=("a",)))
    assert rankings == [search.Ranking(label="base", hits=(search.Hit(0, 0.5),), similarity="cosine")]
    assert sent["env"]["FINETUNE_STUDIO_FORCE_CPU"] == "1" and sent["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert "HF_TOKEN" not in sent["env"] and not any("hf_secret" in a for a in sent["argv"])


def test_a_second_search_while_one_runs_is_refused_naming_why(monkeypatch):
    """Each search loads every model it compares in a child: one at a time per server (hostile review: concurrent
    clicks each loaded their models), as Speak."""
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a second search started a child"))
    assert search._BUSY.acquire(blocking=False)
    try:
        with pytest.raises(search.SearchError, match="^another search is running on this server: try again when "
                                                     "it ends$"):
            search.search(search.Request(sources=(ModelSource(model=BUNDLED_MODEL),), query="q", passages=("a",)))
    finally:
        search._BUSY.release()


@pytest.mark.train
@pytest.mark.subprocess
def test_the_tuned_model_finds_the_jargon_passage_the_base_cannot(app_home, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(ROOT / ".test-cache" / "models"))  # as the studio fixture
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    studio = get_orchestrator()
    train, held_out = jargon_files(tmp_path)
    run_id = studio.start(run_config(train, held_out))
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"

    passages = search.run_passages(run_id)
    _, held = jargon()
    assert {row["passage"] for row in held} <= set(passages)
    sources = (ModelSource(model=BUNDLED_MODEL), ModelSource(run_id=run_id))
    firsts = {"base": 0, "tuned": 0}
    for row in held[:4]:
        rankings = search.search(search.Request(sources=sources, query=row["question"], passages=tuple(passages),
                                                labels=("base", "tuned")))
        assert [r.label for r in rankings] == ["base", "tuned"] and not any(r.error for r in rankings)
        for ranking in rankings:
            assert len(ranking.hits) == search.TOP_K and ranking.similarity == "cosine"
            firsts[ranking.label] += passages[ranking.hits[0].index] == row["passage"]
    print("\nfirst-ranked correct passage, 4 held-out queries:", firsts)
    assert firsts["tuned"] >= 3 and firsts["base"] <= 1

    # the same search on the Playground's Search mode, as a user does it: the run's own passages, base | final
    at = open_page("pages/playground.py")
    at.button_group(key="pg_mode").set_value("Search").run()
    assert at.selectbox(key="pge_run").value == run_id
    at.text_input(key="pge_query").input(held[0]["question"]).run()
    next(b for b in at.button if b.label == "Search").click().run(timeout=180)
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    labels = [m.value for m in at.markdown if m.value.startswith("**")]
    tables = [d.value for d in at.dataframe if "passage" in d.value.columns]
    assert len(tables) == 2 and labels[0].startswith("**Base") and "jargon retriever" in labels[1]
    assert tables[1]["passage"].iloc[0] == held[0]["passage"]  # the tuned model's first hit
    assert list(tables[1]["rank"]) == [1, 2, 3, 4, 5]


def test_the_search_mode_says_how_to_get_an_embedding_run_when_there_is_none(app_home):
    at = open_page("pages/playground.py")
    at.button_group(key="pg_mode").set_value("Search").run()
    assert not at.exception, at.exception
    assert any(i.value.startswith("No embedding run yet: train one with method embedding") for i in at.info)
