"""A data recipe as a job, end to end with real workers, NeMo Data Designer in its venv and a deterministic teacher
(tests/support/fake_teacher.py): documents become a versioned dataset whose repeats and invalid rows are set aside
with their reasons and counted; Stop keeps the rows made, resume continues them with no row lost or doubled (also
after kill -9); db rebuild restores the job; a teacher that is down or answers garbage, and unreadable documents,
are named."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.support import wait_until
from tests.support.fake_teacher import FakeTeacher, fact_document, fact_files, question
from trainer_core.config import ConfigError
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.recipes import launch, store

@pytest.fixture
def teacher(monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")  # the fake teacher listens on loopback
    with FakeTeacher() as fake:
        yield fake


def docs_spec(folder: Path, teacher: FakeTeacher, **over) -> launch.RecipeSpec:
    fields = {"starter": "docs-qa", "documents": str(folder), "chunk_chars": 200, "overlap_chars": 0,
              "num_rows": 12, "batch_size": 4, "dataset_name": "gazetteer",
              "models": [{"alias": "teacher", "url": teacher.url, "model": "teacher", "max_parallel_requests": 2}]}
    return launch.from_fields({**launch.starters.spec_fields("docs-qa"), **fields, **over})


def finished(orch, job_id: str, timeout: float = 300):
    wait_until(lambda: orch.get_run(job_id).status.is_terminal(), timeout=timeout, what=f"recipe job {job_id} to end")
    return orch.get_run(job_id)


def test_documents_become_a_versioned_dataset_with_repeats_set_aside(studio, teacher, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    chosen = fact_document(docs / "gazetteer.md", 6, filler=False)  # 6 facts in 2 chunks of 200 characters at most
    (docs / "broken.pdf").write_bytes(b"%PDF-1.4 this is no pdf")
    (docs / "empty.txt").write_text("")
    job_id = launch.start(studio, docs_spec(docs, teacher))
    run = finished(studio, job_id)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.kind is JobKind.RECIPE and run.steps_done == 12
    (version,) = store.published()
    assert (version.name, version.version) == ("gazetteer", 1)
    rows = [json.loads(line) for line in version.data_path.read_text().splitlines()]
    # 12 records over the chunks in turn: the teacher asks about each fact of a chunk in turn, so once every fact
    # is asked, its answers repeat: 6 kept, 6 exact repeats set aside
    assert sorted(r["messages"][0]["content"] for r in rows) == sorted(question(a, e) for a, e, _ in chosen)
    seeds = {s["chunk"]: s for s in map(json.loads, (paths.run_dir(job_id) / "seeds.jsonl").read_text().splitlines())}
    assert len(seeds) == 2 and all(r["provenance"]["source"] == "gazetteer.md" for r in rows)
    assert all(r["messages"][1]["content"] in seeds[r["provenance"]["chunk"]]["text"] for r in rows)  # cites its chunk
    card = version.card
    assert (card["made"], card["kept"], card["rejected"]) == (12, 6, 6)
    assert card["rejected_by_reason"] == {"exact duplicate": 6}
    assert card["tokens"]["input"] > 0 and card["tokens"]["output"] > 0 and card["job_id"] == job_id
    rejected = [json.loads(line) for line in (version.folder / "rejected.jsonl").read_text().splitlines()]
    assert len(rejected) == 6 and all("duplicate" in r["reason"] for r in rejected)
    assert "sk-" not in (version.folder / "card.json").read_text()
    problems = {p["source"]: p["message"] for p in card["sources"]["problems"]}
    assert set(problems) == {"broken.pdf", "empty.txt"}
    timeline = [(e.kind, e.message) for e in studio.events(job_id)]
    print(timeline)
    assert ("warning", "documents: broken.pdf: not a readable PDF (PdfStreamError: Stream has ended unexpectedly)") \
        in timeline and ("warning", "documents: empty.txt: no text found") in timeline
    assert ("artifact", f"dataset gazetteer v1: {version.data_path} ({version.data_path.stat().st_size:,} bytes, "
                        f"sha256 {card['sha256'][:12]}…)") in timeline
    # the same recipe again is version 2, not a change to version 1
    again = launch.start(studio, docs_spec(docs, teacher))
    assert finished(studio, again).status is RunStatus.COMPLETED
    assert [p.name for p in store.versions("gazetteer")] == ["v1", "v2"]
    assert (store.versions("gazetteer")[0] / "data.jsonl").read_bytes() == version.data_path.read_bytes()


def test_stop_publishes_what_was_made_and_resume_continues_without_doubles(studio, teacher, tmp_path):
    docs = tmp_path / "docs"
    fact_files(docs, 40)  # a chunk per fact: each asked once, so every record is a new fact
    teacher.hold_after = 13  # the 4th batch waits (the first request is Data Designer's health check)
    job_id = launch.start(studio, docs_spec(docs, teacher, num_rows=40, batch_size=4, dataset_name="long"))
    run_dir = paths.run_dir(job_id)
    wait_until(lambda: len(store.processed(run_dir)) == 3, timeout=240, what="three batches")
    studio.stop(job_id)
    run = finished(studio, job_id)
    assert run.status is RunStatus.STOPPED, run.error
    (first,) = store.published()
    assert first.card["stopped"] is True and (first.card["made"], first.card["kept"]) == (12, 12)
    teacher.release.set()
    resumed = launch.resume(studio, job_id)
    assert finished(studio, resumed).status is RunStatus.COMPLETED
    final = store.published()[0]
    rows = [json.loads(line)["messages"][0]["content"] for line in final.data_path.read_text().splitlines()]
    assert final.card["made"] == 40 and len(rows) == 40 and len(set(rows)) == 40  # 40 facts: none lost, none twice


def test_kill_9_then_resume_loses_and_doubles_nothing(studio, teacher, tmp_path):
    docs = tmp_path / "docs"
    fact_files(docs, 32)
    teacher.hold_after = 9  # the 3rd batch waits: the worker is killed mid-generation
    job_id = launch.start(studio, docs_spec(docs, teacher, num_rows=32, batch_size=4, dataset_name="killed"))
    run_dir = paths.run_dir(job_id)
    wait_until(lambda: len(store.processed(run_dir)) == 2, timeout=240, what="two batches")
    pid = int(studio.get_run(job_id).pid or 0)
    assert pid > 0
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    run = finished(studio, job_id)
    assert run.status is RunStatus.FAILED
    assert store.published() == []  # a killed job publishes nothing; its 8 rows wait in its folder
    teacher.release.set()
    resumed = launch.resume(studio, job_id)
    assert finished(studio, resumed).status is RunStatus.COMPLETED, studio.get_run(resumed).error
    final = store.published()[0]
    rows = [json.loads(line)["messages"][0]["content"] for line in final.data_path.read_text().splitlines()]
    assert final.card["made"] == 32 and len(rows) == 32 and len(set(rows)) == 32


def test_a_teacher_that_is_down_or_answers_garbage_is_named(studio, teacher, tmp_path):
    docs = tmp_path / "docs"
    chosen = fact_files(docs, 8)
    teacher.garbage_for = chosen[1][1]  # the second fact's entity: its record never gets JSON back
    job_id = launch.start(studio, docs_spec(docs, teacher, num_rows=8, batch_size=4, dataset_name="partly"))
    run = finished(studio, job_id)
    assert run.status is RunStatus.COMPLETED, run.error
    (aside,) = list(store.rejected_rows(paths.run_dir(job_id)))
    assert aside["reason"].startswith("teacher: no usable answer for this record (Non-retryable failure on qa[rg=0, "
                                      "row=1]: Cause: The model output from "
                                      "'teacher' could not be parsed into the requested format")
    assert store.published()[0].card["rejected_by_reason"] == {"teacher": 1}
    teacher.garbage_for = ""
    teacher.mode = "garbage"
    job_id = launch.start(studio, docs_spec(docs, teacher, num_rows=4, batch_size=4, dataset_name="garbage"))
    run = finished(studio, job_id)
    # every answer unusable: no record made; the job fails with Data Designer's reason, naming the model and column
    assert run.status is RunStatus.FAILED
    assert run.error.startswith("recipe: ModelGenerationValidationFailureError: Cause: The model output from 'teacher' "
                                "could not be parsed into the requested format while running generation for column "
                                "'qa'."), run.error
    url = teacher.url
    teacher.down()
    job_id = launch.start(studio, docs_spec(docs, teacher, num_rows=4, batch_size=4, dataset_name="down"))
    run = finished(studio, job_id)
    assert run.status is RunStatus.FAILED
    assert run.error.startswith(f"models[0].url: the endpoint at {url} does not answer")


def test_bad_recipes_are_refused_naming_the_field(studio, teacher, tmp_path):
    def problems(**over) -> dict[str, str]:
        with pytest.raises(ConfigError) as caught:
            launch.start(studio, docs_spec(tmp_path, teacher, **over))
        return {e.field: e.message for e in caught.value.errors}

    bad_schema = {"columns": [{"name": "qa", "column_type": "llm-structured", "model_alias": "teacher",
                               "prompt": "x", "output_format": {"type": "objekt"}}]}
    assert problems(recipe=bad_schema)["recipe.columns[0].output_format"].startswith("not a valid JSON schema (")
    assert "is none of the recipe's models" in problems(recipe={"columns": [
        {"name": "a", "column_type": "llm-text", "model_alias": "nobody", "prompt": "x"}]})[
        "recipe.columns[0].model_alias"]
    assert "lowercase letters" in problems(dataset_name="../etc")["dataset_name"]
    assert "outside the allowed folders" in problems(documents="/etc")["documents"]
    assert "none of the recipe's columns" in problems(output={"prompt": "{{ nothing }}"})["output.prompt"]
    assert problems(models=[{"alias": "teacher", "url": "ftp://x", "model": "m"}])["models[0].url"].startswith(
        "the base URL")


def test_an_external_teachers_key_reaches_only_the_teacher(studio, tmp_path, monkeypatch):
    key = "sk-teacher-secret-4f1d9c"
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_KEY_ENVS", "TEACHER_API_KEY")
    monkeypatch.setenv("TEACHER_API_KEY", key)
    fact_files(tmp_path / "docs", 4)
    with FakeTeacher(api_key=key) as teacher:
        spec = docs_spec(tmp_path / "docs", teacher, num_rows=4, dataset_name="keyed",
                         models=[{"alias": "teacher", "url": teacher.url, "model": "teacher",
                                  "key_env": "TEACHER_API_KEY"}])
        job_id = launch.start(studio, spec)
        run = finished(studio, job_id)
        assert run.status is RunStatus.COMPLETED, run.error
        assert {r.get("model") for r in teacher.requests} == {"teacher"}  # every request carried the key (else 401)
    written = [p for root in (paths.run_dir(job_id), store.dataset_folder("keyed")) for p in root.rglob("*")
               if p.is_file()] + list(paths.data_root().glob("studio.db*"))
    assert written and not [p for p in written if key.encode() in p.read_bytes()]
    monkeypatch.delenv("TEACHER_API_KEY")  # a key variable the admin did not declare is refused, naming the fix
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_KEY_ENVS", "")
    with pytest.raises(ConfigError) as caught:
        launch.start(studio, spec)
    assert caught.value.errors[0].field == "models[0].key_env"
    assert "is not declared for judging" in caught.value.errors[0].message


def test_what_a_recipe_may_not_reach_is_refused(studio, teacher, tmp_path):
    from tests.support.factories import finished_run

    def problems(**over) -> dict[str, str]:
        with pytest.raises(ConfigError) as caught:
            launch.start(studio, docs_spec(tmp_path, teacher, **over))
        return {e.field: e.message for e in caught.value.errors}

    seeded = {"seed_config": {"source": {"seed_type": "local", "path": "/etc/passwd"}}, "columns": [
        {"name": "a", "column_type": "llm-text", "model_alias": "teacher", "prompt": "x"}]}
    assert problems(recipe=seeded)["recipe.seed_config"].endswith("seed rows come from `documents` or `seed_dataset`")
    custom = {"columns": [{"name": "a", "column_type": "custom", "generator_function": "os.system"}]}
    assert "is not offered" in problems(recipe=custom)["recipe.columns[0].column_type"]
    finished_run(studio.store, "20261208-000000-aaaaaa", "someone's run")
    run_folder = str(paths.run_dir("20261208-000000-aaaaaa"))
    assert "which is not user data" in problems(documents=run_folder)["documents"]
    assert "which is not user data" in problems(documents=str(paths.data_root() / "studio.db"))["documents"]
    assert problems(resume_from="20261208-000000-aaaaaa")["resume_from"] == (
        "'20261208-000000-aaaaaa' is not a recipe job of this studio: give the id of the stopped or failed recipe job")


def test_a_restart_adopts_the_job_and_db_rebuild_restores_it(studio, teacher, tmp_path):
    from db.store import Store
    from trainer_core.jobs import rebuild
    from trainer_core.jobs.orchestrator import Orchestrator

    fact_files(tmp_path / "docs", 8)
    teacher.hold_after = 5  # the health check and the first batch answer; the second batch waits
    job_id = launch.start(studio, docs_spec(tmp_path / "docs", teacher, num_rows=8, batch_size=4, dataset_name="kept"))
    wait_until(lambda: len(store.processed(paths.run_dir(job_id))) == 1, timeout=240, what="the first batch")
    url = studio.store.url
    studio.close()  # the server goes away; the worker waits on its teacher
    second = Orchestrator(Store(url))  # the next server adopts it
    try:
        teacher.release.set()
        wait_until(lambda: second.get_run(job_id).status.is_terminal(), timeout=240, what="the adopted job")
        run = second.get_run(job_id)
        assert run.status is RunStatus.COMPLETED and run.steps_done == 8, run.error
        before = (run, [(e.kind, e.message) for e in second.events(job_id)])
    finally:
        second.close()
    db_file = Path(url[len("sqlite:///"):])
    Store(url).engine.dispose()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_file}{suffix}").unlink(missing_ok=True)
    report = rebuild.rebuild(url)
    assert job_id in report.runs
    rebuilt = Store(url)
    after = rebuilt.get_run(job_id)
    assert (after.kind, after.status, after.steps_done, after.dataset) == (
        JobKind.RECIPE, RunStatus.COMPLETED, 8, "recipes/kept ← docs-qa")
    assert [(e.kind, e.message) for e in rebuilt.get_events(job_id)] == before[1]


def test_a_model_the_studio_serves_is_the_teacher(studio, tmp_path, monkeypatch):
    """The recipe names the bundled model: a serve job is started for it (here a stand-in whose endpoint is the test
    teacher) and the job's key, which exists only in memory, reaches the Data Designer child through the environment."""
    from trainer_core.config import BUNDLED_MODEL
    from trainer_core.jobs.orchestrator import Orchestrator
    from trainer_core.serving import endpoint as endpoint_file
    from trainer_core.specs.model_source import ModelSource

    key, serve_id, started = "playground-key-7c1e", "20261208-090000-5e5e5e", []
    source = ModelSource(model=BUNDLED_MODEL).key

    def start_server(orch, sources, actor=None, **options):
        started.append(([s.key for s in sources], options))
        paths.run_dir(serve_id).mkdir(parents=True)
        endpoint_file.write(paths.run_dir(serve_id), teacher.url, [{"name": "smollm2", "label": "bundled",
                                                                     "source_key": source}], "fake", os.getpid())
        return serve_id, key

    monkeypatch.setattr(Orchestrator, "start_server", start_server)
    fact_files(tmp_path / "docs", 4)
    with FakeTeacher(model="smollm2", api_key=key) as teacher:
        spec = docs_spec(tmp_path / "docs", teacher, num_rows=4, dataset_name="served",
                         models=[{"alias": "teacher", "source": source}])
        job_id = launch.start(studio, spec)
        run = finished(studio, job_id)
        assert run.status is RunStatus.COMPLETED, run.error
        assert {r.get("model") for r in teacher.requests} == {"smollm2"}  # its served name, with the key (else 401)
    assert started == [([source], {"purpose": "playground", "tied": False, "idle_timeout_s": 600,
                                   "name": "Teacher · served"})]
    card = store.published()[0].card
    assert card["served_by"] == serve_id and card["models"][0]["source"] == source
    written = [p for p in paths.run_dir(job_id).rglob("*") if p.is_file()] + list(paths.data_root().glob("studio.db*"))
    assert not [p for p in written if key.encode() in p.read_bytes()]
