"""The Playground's embedding search (issue 21), through trainer_core/search.py and its child process: after a short
run on invented jargon, a held-out phrasing of a question finds its passage first with the tuned model, among the
run's own passages; the base model, which cannot know the words, does not rank it first for most queries. Bad
requests are named before a process starts."""
from __future__ import annotations

import pytest

from tests.methods.test_embedding_run import jargon_files, run_config
from tests.methods.test_embedding_train import jargon
from trainer_core import search
from trainer_core.jobspec import ModelSource
from trainer_core.methods.embedding import BUNDLED_MODEL
from trainer_core.protocol.status import RunStatus


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


@pytest.mark.train
@pytest.mark.subprocess
def test_the_tuned_model_finds_the_jargon_passage_the_base_cannot(studio, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    train, held_out = jargon_files(tmp_path)
    run_id = studio.start(run_config(train, held_out))
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"

    passages = search.run_passages(run_id)
    _, held = jargon()
    assert {row["passage"] for row in held} <= set(passages)
    sources = (ModelSource(model=BUNDLED_MODEL), ModelSource(run_id=run_id))
    firsts = {"base": 0, "tuned": 0}
    for row in held[:6]:
        rankings = search.search(search.Request(sources=sources, query=row["question"], passages=tuple(passages),
                                                labels=("base", "tuned")))
        assert [r.label for r in rankings] == ["base", "tuned"] and not any(r.error for r in rankings)
        for ranking in rankings:
            assert len(ranking.hits) == search.TOP_K and ranking.similarity == "cosine"
            firsts[ranking.label] += passages[ranking.hits[0].index] == row["passage"]
    print("\nfirst-ranked correct passage, 6 held-out queries:", firsts)
    assert firsts["tuned"] >= 5 and firsts["base"] <= 2
