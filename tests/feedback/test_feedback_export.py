"""Votes exported as DPO and KTO datasets (issue 34): which votes make which rows, versioned files with their lineage
in the data root, the studio's own loader reading them as pairs and kto data, and viewers refused."""
from __future__ import annotations

import json

import pytest

from trainer_core.auth.access import Actor, Role
from trainer_core.config import TrainConfig
from trainer_core.data import formats, loading, preference
from trainer_core.data.readers import read_rows
from trainer_core.feedback import agreement, export, votes
from trainer_core.feedback.service import Feedback, FeedbackRefused
from trainer_core.feedback.votes import FeedbackError, Model

ANN = Actor("ann", Role.OPERATOR)
BOB = Actor("bob", Role.OPERATOR)
VAL = Actor("val", Role.VIEWER)
MODELS = [Model("base:m", "Base"), Model("run:r1", "tuned", run_id="r1")]


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


@pytest.fixture
def voted(home, store):
    feedback = Feedback(store)
    ids = {}
    ids["pair"] = feedback.vote(ANN, votes.PAIR, votes.B_BETTER, ask("Q1"), ["meh", "great"], MODELS).id
    ids["agree"] = feedback.vote(BOB, votes.PAIR, votes.A_BETTER, ask("Q1"), ["great", "meh"], MODELS).id
    feedback.vote(ANN, votes.PAIR, votes.A_BETTER, ask("Q2"), ["x", "y"], MODELS)  # a conflict: left out
    feedback.vote(BOB, votes.PAIR, votes.B_BETTER, ask("Q2"), ["x", "y"], MODELS)
    ids["both_bad"] = feedback.vote(ANN, votes.PAIR, votes.BOTH_BAD, ask("Q3"), ["bad1", "bad2"], MODELS).id
    ids["tie"] = feedback.vote(ANN, votes.PAIR, votes.TIE, ask("Q4"), ["t1", "t2"], MODELS).id
    ids["edit"] = feedback.vote(ANN, votes.EDIT, votes.EDITED, ask("Q5"), ["draft"], MODELS[1:], edited="final").id
    ids["up"] = feedback.vote(BOB, votes.SINGLE, votes.UP, ask("Q6"), ["good one"], MODELS[1:]).id
    ids["withdrawn"] = feedback.vote(BOB, votes.PAIR, votes.A_BETTER, ask("Q7"), ["w1", "w2"], MODELS).id
    feedback.withdraw(BOB, ids["withdrawn"])
    return feedback, ids


def test_dpo_rows_are_the_agreed_winners_and_the_edits(voted):
    feedback, ids = voted
    built = export.dpo_rows(feedback.all_votes())
    assert sorted(built.rows, key=lambda r: r["prompt"][0]["content"]) == [
        {"prompt": ask("Q1"), "chosen": assistant("great"), "rejected": assistant("meh")},
        {"prompt": ask("Q5"), "chosen": assistant("final"), "rejected": assistant("draft")}]
    assert sorted(built.vote_ids) == sorted([ids["pair"], ids["agree"], ids["edit"]])
    assert built.left_out == {"conflicting votes (people picked opposite answers)": 2,
                              "ties and both-bad (no better answer)": 2, "thumbs (no second answer to pair with)": 1}


def test_kto_rows_label_each_answer(voted):
    feedback, ids = voted
    built = export.kto_rows(feedback.all_votes())
    shown = sorted((r["prompt"][0]["content"], r["completion"][0]["content"], r["label"]) for r in built.rows)
    assert shown == [("Q1", "great", True), ("Q1", "meh", False), ("Q3", "bad1", False), ("Q3", "bad2", False),
                     ("Q5", "draft", False), ("Q5", "final", True), ("Q6", "good one", True)]
    assert ids["withdrawn"] not in built.vote_ids and ids["tie"] not in built.vote_ids
    assert built.left_out == {"conflicting votes (people picked opposite answers)": 2, "ties": 1}


def test_exports_are_versioned_files_with_lineage_that_the_loader_reads_as_pairs_and_kto(voted):
    feedback, ids = voted
    first = feedback.export(ANN, "dpo")
    second = feedback.export(ANN, "dpo", agreement.Filters(voters=("ann",)))
    kto = feedback.export(ANN, "kto")
    assert (first.version, second.version, kto.version) == (1, 2, 1)
    assert first.path.name == "feedback-dpo-v1.jsonl" and first.path.parent == export.folder()
    assert export.versions("dpo") == [1, 2]
    card = export.lineage(second.path)
    assert card["vote_ids"] == second.vote_ids and card["filters"] == {"voters": ["ann"]}
    assert card["exported_by"] == "ann" and card["rows"] == second.rows == 3  # her Q1 and Q2 picks (bob is filtered
    # out, so Q2 is no conflict) and her edit

    rows = read_rows(first.path)
    assert preference.detect_shape(rows)[0] == "pairs" and preference.detect_shape(read_rows(kto.path))[0] == "kto"
    for path, method, shape, count in ((first.path, "dpo", "pairs", 2), (kto.path, "kto", "kto", 7)):
        cfg = TrainConfig(method=method, local_datasets=[str(path)])
        data = loading.load_local(cfg.local_datasets, cfg)
        assert (data.format, len(data.rows), data.dropped) == (shape, count, {})
        assert preference.is_conversational(data.rows)
        assert loading.check_data(cfg) == []
    sft = TrainConfig(method="sft", local_datasets=[str(first.path)])  # the form says what trains it
    assert "dpo" in " ".join(e.message for e in loading.check_data(sft))
    assert formats.columns_of(rows) == ["prompt", "chosen", "rejected"]


def test_a_viewer_cannot_export_and_nothing_to_export_is_said(voted, store):
    feedback, _ = voted
    with pytest.raises(FeedbackRefused, match="val is a viewer: exporting feedback writes a dataset to train on"):
        feedback.export(VAL, "dpo")
    with pytest.raises(FeedbackError, match=r"no vote makes a DPO row \(1 thumbs"):
        feedback.export(ANN, "dpo", agreement.Filters(labels=("up",)))
    with pytest.raises(FeedbackError, match="unknown export format 'csv'"):
        feedback.export(ANN, "csv")
    assert export.versions("dpo") == []
