"""The Data page (issue 33) through AppTest, with the deterministic teacher: a starter's preview shows each record's
source, verdict and the estimate; Generate starts a recipe job that Recipe jobs follows; Datasets shows the published
version's card, rows, set-aside rows and the runs trained on it; New run offers it as 'Made by a recipe'. The CLI
makes, lists and shows the same dataset."""
from __future__ import annotations

import json

import pytest

from tests.support import apptest, wait_until
from tests.support.factories import insert_finished_run
from tests.support.fake_teacher import FakeTeacher, fact_files, question
from trainer_core import __main__ as cli
from trainer_core.recipes import store
from ui import data_recipes as dr
from ui import form
from ui.state import get_orchestrator

PAGE = "pages/data.py"


@pytest.fixture
def teacher(monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")
    with FakeTeacher() as fake:
        yield fake


def fill(at, teacher, docs) -> None:
    at.text_input(key="data_path").set_value(str(docs))
    at.radio(key="data_teacher_kind").set_value("external")
    at.run()
    at.text_input(key="data_url").set_value(teacher.url)
    at.text_input(key="data_model").set_value("teacher")
    at.number_input(key="data_rows").set_value(6)
    at.number_input(key="data_batch").set_value(3)
    at.text_input(key="data_name").set_value("page-made")


def button(at, label: str):
    return next(b for b in at.button if b.label == label)


def test_preview_generate_and_the_dataset_it_publishes(app_home, teacher, tmp_path):
    chosen = fact_files(tmp_path / "docs", 6)
    at = apptest.open_page(PAGE, timeout=120)
    assert at.selectbox(key="data_starter").value == "docs-qa"
    fill(at, teacher, tmp_path / "docs")
    button(at, "Preview").click()
    at.run(timeout=300)
    assert not at.exception and not at.error, [e.value for e in at.error]
    frame = at.dataframe[0].value
    assert list(frame["verdict"]) == ["kept"] * 5
    assert [json.loads(row)["messages"][0]["content"] for row in frame["row"]] == [question(a, e) for a, e, _ in chosen[:5]]
    assert list(frame["source"]) == [f"source fact-{i:03d}.md, chunk 0" for i in range(5)]
    assert any("The full job (6 records): about" in c.value for c in at.caption)

    button(at, "Generate").click()
    at.run(timeout=120)
    assert any("started" in s.value for s in at.success)
    orch = get_orchestrator()
    job = next(r for r in orch.store.list_runs() if r.kind.value == "recipe")
    wait_until(lambda: orch.get_run(job.id).status.is_terminal(), timeout=300, what="the recipe job")
    (version,) = store.published()
    insert_finished_run(orch.store, "20261208-120000-abcdef", "on the recipe", [2.0, 1.0], dataset="page-made@v1")
    at = apptest.open_page(PAGE, timeout=120)
    jobs_text = " ".join(m.value for m in at.markdown)
    assert "6/6 records · 6 kept · 0 set aside" in jobs_text
    assert "Runs trained on it:** on the recipe" in jobs_text.replace("\\", "")
    rows, aside = (t.value for t in at.dataframe[1:3])
    assert len(rows) == 6 and aside.empty
    at = apptest.open_page("pages/run.py", detail_run_id=job.id)  # Run details of the recipe job
    assert any(f"Published page-made@v1: 6 rows kept of 6 ({version.ref}); runs trained on it: on the recipe"
               in c.value.replace("\\", "") for c in at.caption), [c.value for c in at.caption]
    assert dr.lineage({"local_datasets": [str(version.data_path)]}) == [
        f"Data: page-made@v1, made by the recipe job {job.id} (docs-qa; teacher: teacher at {teacher.url}; 6 rows "
        "kept of 6)"]
    at = apptest.open_new_run(**{form.K + "dataset_source": "recipe"})
    picker = at.selectbox(key=form.K + "recipe_dataset")
    assert picker.options == ["—", "page-made@v1 · 6 rows · docs-qa"]
    picker.set_value(version.ref).run()
    assert not at.exception
    state = {form.K + "dataset_source": "recipe", form.K + "recipe_dataset": version.ref}
    assert form.dataset_values(state) == ({"hf_dataset": "", "local_datasets": [version.ref]}, [])


def test_the_cli_generates_lists_and_shows(home, teacher, tmp_path, capsys):
    fact_files(tmp_path / "docs", 4)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"starter: docs-qa\ndataset_name: cli-made\ndocuments: {tmp_path / 'docs'}\nnum_rows: 4\n"
                      f"batch_size: 2\nmodels: [{{alias: teacher, url: '{teacher.url}', model: teacher}}]\n")
    assert cli.main(["data", "generate", "--recipe", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "dataset recipes/cli-made/v1/data.jsonl: 4 rows kept of 4 made (0 set aside: )" in out
    assert cli.main(["data", "list"]) == 0
    assert "cli-made@v1" in capsys.readouterr().out
    assert cli.main(["data", "show", "cli-made"]) == 0
    assert "# cli-made v1" in capsys.readouterr().out
    assert cli.main(["data", "generate", "--starter", "docs-qa", "--set", "dataset_name=Bad Name"]) == 2
    assert "error: dataset_name: a name for the dataset" in capsys.readouterr().err


def test_a_running_recipes_pace_reads_its_live_state():
    import pandas as pd

    from trainer_core.jobs.live import LiveSnapshot
    from trainer_core.protocol.status import RunStatus

    live = LiveSnapshot(run_id="r", name="r", status=RunStatus.RUNNING, step=30, total_steps=100, started_at=100.0,
                        tokens_per_s=812.4, eta_s=70.2, metrics=pd.DataFrame({"step": [10, 30], "rows_per_s": [None, 1.5]}))
    assert dr.rate_text(live) == "1.50 records/s · 812 teacher tokens/s · ETA 70 s"
    early = LiveSnapshot(run_id="r", name="r", status=RunStatus.RUNNING, step=12, total_steps=100, started_at=100.0)
    assert dr.rate_text(early, now=106.0) == "2.00 records/s"
    assert dr.rate_text(None) == ""
