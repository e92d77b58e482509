"""`python -m trainer_core feedback ...` (issue 34): import ratings and votes made elsewhere (each bad line named, the
good ones kept), export DPO/KTO data (a viewer's token refused), and print agreement and the judge's calibration."""
from __future__ import annotations

import json

from db import users
from db.entities import RunRecord
from db.store import Store
from trainer_core import __main__ as cli
from trainer_core.auth.access import Actor, Role
from trainer_core.feedback import calibration, export
from trainer_core.protocol.status import JobKind, RunStatus

JUDGE = [9.0 if i % 2 else 2.0 for i in range(24)]


def eval_job(store: Store) -> None:
    store.create_run(RunRecord(id="eval-1", name="eval", status=RunStatus.COMPLETED, kind=JobKind.EVAL))
    for index, score in enumerate(JUDGE):
        store.save_eval_sample("eval-1", index, prompt=f"q{index}", answer=f"a{index}", judge=score)


def test_import_then_agreement_then_export(home, tmp_path, capsys):
    store = Store()
    eval_job(store)
    store.engine.dispose()
    sample = calibration.rating_sample(list(range(24)), "eval-1")
    lines = [json.dumps({"job_id": "eval-1", "index": i, "scale": "pass_fail", "value": int(JUDGE[i] >= 6)})
             for i in sample[:20]]
    lines += [json.dumps({"prompt": "What is 2+2?", "answer_a": "4", "answer_b": "5", "label": "a_better"}),
              json.dumps({"prompt": "Hi", "answer_a": "Hello!", "label": "up"}),
              json.dumps({"job_id": "eval-1", "index": 99, "scale": "score5", "value": 3}),  # no such answer
              json.dumps({"prompt": "Hi", "answer_a": "Hello!", "label": "maybe"}),
              "{not json", ""]
    ratings = tmp_path / "ratings.jsonl"
    ratings.write_text("\n".join(lines) + "\n")
    assert cli.main(["feedback", "import", str(ratings)]) == 2
    out, err = capsys.readouterr()
    assert out.strip() == f"recorded 20 rating(s) and 2 vote(s) as {Actor.local().name}"
    assert err.splitlines() == [
        "refused: line 23: eval job 'eval-1' has no answer number 99: rate one of its scored answers",
        "refused: line 24: label is one of a_better, b_better, tie, both_bad, up, down, edit, not 'maybe'",
        "refused: line 25: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"]

    assert cli.main(["feedback", "agreement", "--eval", "eval-1", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["votes"], found["people"], found["conflicts"], found["agreement"]) == (2, 1, 0, None)
    assert found["judge"]["pass_fail"]["status"] == "calibrated" and found["judge"]["pass_fail"]["n"] == 20
    assert found["judge"]["score5"]["status"] == "uncalibrated"
    assert cli.main(["feedback", "agreement", "--label", "up"]) == 0
    assert capsys.readouterr().out.startswith("1 vote(s) by 1 person(s); agreement — (0 of 0 pairs")

    assert cli.main(["feedback", "export", "--format", "dpo"]) == 0
    out = capsys.readouterr().out
    assert f"wrote 1 row(s) from 1 vote(s): {export.folder() / 'feedback-dpo-v1.jsonl'} (version 1)" in out
    assert "left out 1: thumbs (no second answer to pair with)" in out
    assert cli.main(["feedback", "export", "--format", "kto", "--since", "2000-01-01"]) == 0
    assert export.versions("kto") == [1] and len((export.folder() / "feedback-kto-v1.jsonl").read_text().splitlines()) == 3


def test_a_viewer_token_cannot_export_and_a_bad_date_is_named(home, monkeypatch, capsys):
    store = Store()
    users.ensure_user(store, "val", Role.VIEWER)
    token = users.create_token(store, "val", label="laptop")
    store.engine.dispose()
    monkeypatch.setenv("FINETUNE_STUDIO_TOKEN", token)
    assert cli.main(["feedback", "export", "--format", "dpo"]) == 2
    assert capsys.readouterr().err.startswith("refused: val is a viewer: exporting feedback writes a dataset")
    assert cli.main(["feedback", "agreement", "--since", "yesterday"]) == 2
    assert capsys.readouterr().err.strip() == "error: 'yesterday' is not a date: write YYYY-MM-DD"
    assert cli.main(["feedback", "agreement", "--eval", "nope"]) == 2
    assert "has no answers scored by the LLM judge" in capsys.readouterr().err
