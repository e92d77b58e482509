"""Model sources and the generic job path (Orchestrator.submit) that serve, eval and export jobs share."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest

from tests.support import fake, wait_until
from tests.support.factories import run_folder
from trainer_core.specs import jobspec, model_source
from trainer_core.config import BUNDLED_MODEL, ConfigError
from trainer_core.jobs.launcher import WorkerLauncher
from trainer_core.specs.model_source import ModelSource, SourceError, resolve
from trainer_core.specs.jobspec import JobSpec
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus, read_kind


# ====================================================================== sources
@pytest.mark.parametrize("source", [ModelSource(model=BUNDLED_MODEL), ModelSource(run_id="20260101-000000-abc123"),
                                    ModelSource(run_id="r1", checkpoint=40)])
def test_source_key_round_trips(source):
    assert ModelSource.from_key(source.key) == source
    assert ModelSource.from_dict(source.to_dict()) == source


@pytest.mark.parametrize("key", ["", "run:", "run:../etc", "run:a@b", "base:", "model:x", "run:a\x00"])
def test_bad_source_keys_say_what_is_accepted(key):
    with pytest.raises(SourceError, match="base:<model>, run:<id> or run:<id>@<step>"):
        ModelSource.from_key(key)


def test_a_base_source_needs_no_run(home):
    resolved = resolve(ModelSource(model=BUNDLED_MODEL))
    assert resolved.adapter_dir is None and resolved.model_dir is None
    assert resolved.base_model == BUNDLED_MODEL and resolved.served_name == "smollm2-135m-instruct"


def test_final_adapter_and_checkpoints_resolve_to_their_folders(home):
    run_folder("r1", steps=(10, 20), name="Support tone v2")
    final = resolve(ModelSource(run_id="r1"))
    assert final.adapter_dir == paths.run_dir("r1") / "adapter" and final.model_dir is None
    assert final.served_name == "support-tone-v2" and final.label == "Support tone v2 · final"
    step = resolve(ModelSource(run_id="r1", checkpoint=20))
    assert step.adapter_dir == paths.run_dir("r1") / "checkpoints" / "checkpoint-20"
    assert step.served_name == "support-tone-v2-step20"
    assert model_source.checkpoint_steps("r1") == [10, 20]


def test_a_checkpoint_still_being_saved_is_no_source(home):
    """Its weights are written before trainer_state.json: until that is whole, eval, export or serve would read a
    checkpoint that is still being written (or that a killed save left half-written)."""
    run_folder("saving", steps=(10,))
    saving = paths.run_dir("saving") / "checkpoints" / "checkpoint-20"
    saving.mkdir()
    (saving / "adapter_config.json").write_text("{}")
    with pytest.raises(SourceError, match=r"no checkpoint at step 20: its checkpoints are at steps 10") as info:
        resolve(ModelSource(run_id="saving", checkpoint=20))
    assert info.value.field == "checkpoint"


def test_a_full_fine_tune_resolves_to_its_model_folder(home):
    run_folder("full1", lora=False)
    resolved = resolve(ModelSource(run_id="full1"))
    assert resolved.model_dir == paths.run_dir("full1") / "model" and resolved.adapter_dir is None


def test_a_weights_folder_replaced_by_a_link_out_of_the_run_is_refused(home, tmp_path):
    """Hostile review: a run's adapter/ (or a checkpoint) swapped for a symlink to another folder still resolved,
    so a serve or export job loaded whatever it pointed at."""
    run_folder("linked", steps=(10,))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "adapter_config.json").write_text("{}")
    for inside in (paths.run_dir("linked") / "adapter", paths.run_dir("linked") / "checkpoints" / "checkpoint-10"):
        for item in inside.iterdir():
            item.unlink()
        inside.rmdir()
        inside.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(SourceError, match=r"its weights folder .* outside the job's folder") as final:
        resolve(ModelSource(run_id="linked"))
    assert final.value.field == "run"
    with pytest.raises(SourceError) as step:
        resolve(ModelSource(run_id="linked", checkpoint=10))
    assert step.value.field == "checkpoint"


def test_a_weights_file_replaced_by_a_link_out_of_the_run_is_refused(home, tmp_path):
    """Hostile review (tts export): with the folder checked, one file in it (the weights) swapped for a symlink out of
    the run was still loaded. A link that stays inside the run is fine."""
    run_folder("filelink", steps=(10,))
    outside = tmp_path / "other.safetensors"
    outside.write_bytes(b"not yours")
    checkpoint = paths.run_dir("filelink") / "checkpoints" / "checkpoint-10"
    (checkpoint / "nested").mkdir()
    (checkpoint / "nested" / "adapter_model.safetensors").symlink_to(outside)
    with pytest.raises(SourceError, match=r"a file in its weights folder .* outside the job's folder") as info:
        resolve(ModelSource(run_id="filelink", checkpoint=10))
    assert info.value.field == "checkpoint"
    adapter = paths.run_dir("filelink") / "adapter"
    (adapter / "tokenizer.json").write_text("{}")
    (adapter / "vocab.json").symlink_to(adapter / "tokenizer.json")  # inside the run: allowed
    assert resolve(ModelSource(run_id="filelink")).adapter_dir == adapter


def test_missing_pieces_are_named_with_the_fix(home):
    run_folder("nofinal", final=False, steps=(5,))
    with pytest.raises(SourceError, match=r"no saved adapter yet .*pick one of its checkpoints \(5\)"):
        resolve(ModelSource(run_id="nofinal"))
    with pytest.raises(SourceError, match=r"no checkpoint at step 7: its checkpoints are at steps 5") as info:
        resolve(ModelSource(run_id="nofinal", checkpoint=7))
    assert info.value.field == "checkpoint"
    with pytest.raises(SourceError, match="folder .* is gone"):
        resolve(ModelSource(run_id="deleted"))


def test_a_job_that_is_not_a_training_run_is_no_model_source(home):
    folder = paths.run_dir("serve1")
    folder.mkdir(parents=True)
    (folder / "kind.txt").write_text("serve\n")
    with pytest.raises(SourceError, match="not a training run"):
        resolve(ModelSource(run_id="serve1"))


# ====================================================================== submit
@dataclass
class ProbeSpec(JobSpec):
    """A spec of the smallest kind: the generic path, without any kind's own fields."""

    KIND: ClassVar[JobKind] = JobKind.EXPORT
    note: str = ""

    def env_names(self) -> list[str]:
        return ["STUDIO_TEST_JUDGE_KEY", "FINETUNE_STUDIO_PASSWORD"]


def test_submit_refuses_a_spec_with_problems(orch, home):
    with pytest.raises(ConfigError) as info:
        orch.submit(ProbeSpec(source=ModelSource(run_id="nothere"), name="x" * 81))
    assert {e.field for e in info.value.errors} == {"name", "run"}
    assert orch.list_runs() == []


def test_submit_queues_behind_a_training_run_on_the_same_device_and_starts_after_it(orch, home, monkeypatch):
    import trainer_core.specs.jobkinds  # noqa: F401  (the real spec classes register first; the probe stands in for one)
    monkeypatch.setitem(jobspec.SPEC_TYPES, JobKind.EXPORT, ProbeSpec)
    run_folder("src", steps=(2,))
    pause = home.parent / "go"  # outside the data root, which a sandboxed worker does not see
    cfg = fake(monkeypatch, steps=3)
    monkeypatch.setenv("FAKE_PAUSE_AT", "1")  # the training run holds the device until the test says so
    monkeypatch.setenv("FAKE_PAUSE_UNTIL", str(pause))
    train_id = orch.start(cfg)
    job_id = orch.submit(ProbeSpec(source=ModelSource(run_id="src", checkpoint=2), name="probe", note="<b>hi</b>"))

    job = orch.get_run(job_id)
    assert job.kind is JobKind.EXPORT and job.status is RunStatus.QUEUED
    assert job.method == "Export" and job.model == "run:src@2" and job.parent_run_id == "src"
    folder = paths.run_dir(job_id)
    assert read_kind(folder) is JobKind.EXPORT
    assert json.loads((folder / "job.json").read_text())["note"] == "<b>hi</b>"

    monkeypatch.delenv("FAKE_PAUSE_AT")  # the job's own (fake) worker does not pause
    pause.write_text("")
    orch.wait(train_id, timeout=30, interval=0.05)
    wait_until(lambda: orch.get_run(job_id).status is not RunStatus.QUEUED, what="the job left the queue")
    orch.wait(job_id, timeout=30, interval=0.05)  # the fake worker plays any kind's lifecycle
    assert [r.id for r in orch.list_runs(kinds=[JobKind.EXPORT])] == [job_id]
    assert [r.id for r in orch.list_runs(kinds=[JobKind.TRAIN])] == [train_id]
    assert orch.count_runs(kinds=[JobKind.TRAIN, JobKind.EXPORT]) == 2 and orch.count_runs(kinds=[JobKind.SERVE]) == 0
    done = orch.get_run(job_id)
    assert done.status is RunStatus.COMPLETED, f"{done.error}\n{orch.log_tail(job_id)}"


def test_a_job_gets_the_variables_it_names_but_never_the_servers_secrets(home, monkeypatch):
    monkeypatch.setenv("STUDIO_TEST_JUDGE_KEY", "judge-secret")
    monkeypatch.setenv("FINETUNE_STUDIO_PASSWORD", "server-secret")
    monkeypatch.setenv("HF_TOKEN", "hub-secret")
    env = WorkerLauncher().environment(home, ProbeSpec(), 1)
    assert env["STUDIO_TEST_JUDGE_KEY"] == "judge-secret"
    assert "FINETUNE_STUDIO_PASSWORD" not in env and "HF_TOKEN" not in env


def test_a_submitted_job_comes_back_with_its_kind_after_a_database_rebuild(make_orch, store, home, monkeypatch):
    from tests.jobs.test_rebuild import dump, wipe
    from trainer_core.jobs import rebuild

    monkeypatch.setitem(jobspec.SPEC_TYPES, JobKind.EXPORT, ProbeSpec)
    run_folder("src", steps=(2,))
    orch = make_orch()
    fake(monkeypatch, steps=2)
    job_id = orch.submit(ProbeSpec(source=ModelSource(run_id="src"), name="probe"))
    orch.wait(job_id, timeout=30, interval=0.05)
    orch.close()
    before = dump(store)
    wipe(store)

    report = rebuild.rebuild(store.url)

    assert job_id in report.runs and report.skipped == []  # (the hand-made source run, too, from its config)
    after = dump(type(store)(store.url))
    assert [r for r in after["runs"] if r["id"] == job_id] == before["runs"]
    assert [e for e in after["events"] if e[0] == job_id] == before["events"]


def test_a_running_job_reads_as_what_it_does():
    assert JobKind.SERVE.status_label(RunStatus.RUNNING) == "Serving"
    assert JobKind.TRAIN.status_label(RunStatus.RUNNING) == "Training"
    assert JobKind.EXPORT.status_label(RunStatus.FAILED) == "Failed"


@pytest.mark.parametrize("kind", ["serve", "export"])
@pytest.mark.parametrize("value", [None, 5, ["x"]])
def test_a_job_name_that_is_not_text_is_named_not_a_crash(home, kind, value):
    """A job.json edited by hand with "name": null crashed every kind's validate (len(None))."""
    from trainer_core.export.spec import ExportSpec
    from trainer_core.serving.spec import ServeSpec

    run_folder("20260101-000000-nnnnnn")
    source = ModelSource(run_id="20260101-000000-nnnnnn")
    spec = ServeSpec(sources=[source]) if kind == "serve" else ExportSpec(source=source, targets=["adapter"])
    spec.name = value
    assert "name" in [e.field for e in spec.validate()]


@pytest.mark.parametrize("content", ["", "{not json", "[1, 2]", "\x00\x00"])
def test_a_damaged_adapter_config_is_a_source_error_naming_the_file(home, content):
    """It was accepted, and the serve/eval/export worker failed later with a bare JSONDecodeError."""
    run_folder("20260101-000000-dddddd", steps=(10,))
    folder = paths.run_dir("20260101-000000-dddddd")
    (folder / "checkpoints" / "checkpoint-10" / "adapter_config.json").write_text(content)
    with pytest.raises(SourceError, match="checkpoint-10/adapter_config.json cannot be read") as caught:
        resolve(ModelSource(run_id="20260101-000000-dddddd", checkpoint=10))
    assert caught.value.field == "checkpoint"
    assert resolve(ModelSource(run_id="20260101-000000-dddddd")).adapter_dir == folder / "adapter"  # final intact


# ====================================================================== every spec field, every wrong type
def _wrong_values(hint) -> list:
    """JSON values of the wrong type for a field annotated ``hint`` (list, dict, nested list, null, number, text)."""
    import typing

    origin = typing.get_origin(hint)
    if hint is ModelSource:
        return [[], [["x"]], "run:x", 5, None, {"run_id": ["x"]}]
    if hint is list or origin is list:
        item = typing.get_args(hint)[0] if typing.get_args(hint) else None
        nested = [[wrong] for wrong in _wrong_values(item)[:2]] if item is not None else [[["x"]], [{"a": 1}]]
        return ["x", 5, {"a": 1}, None] + nested
    if hint is dict or origin is dict:
        if typing.get_args(hint)[1:] == (typing.Any,):  # a nested document (a recipe's config): any JSON inside
            return ["x", 5, [1], None]
        return ["x", 5, [1], None, {"a": [1]}, {"a": {"b": 1}}]
    base = {str: [["x"], [["x"]], {"a": 1}, None, 5, True], int: ["5", [1], [[1]], {"a": 1}, None, 1.5, True],
            float: ["0.5", [1.0], [[1]], {"a": 1}, None, True], bool: ["yes", 1, [True], [[True]], {"a": 1}, None]}
    return base[hint]


def _every_spec_field():
    import trainer_core.specs.jobkinds  # noqa: F401  (registers every kind's spec class)

    for kind, cls in sorted(jobspec.SPEC_TYPES.items(), key=lambda item: item[0].value):
        if cls.__module__.startswith("tests."):
            continue
        for name, hint in jobspec.field_types(cls).items():
            for value in _wrong_values(hint):
                yield pytest.param(cls, name, value, id=f"{kind.value}-{name}-{json.dumps(value)}")


@pytest.mark.parametrize("cls, name, value", list(_every_spec_field()))
def test_every_spec_field_refuses_a_value_of_the_wrong_type(cls, name, value):
    """A hand-edited job.json with "targets": [["adapter"]] (or "source": []) passed validate() and raised
    TypeError later, on every pump tick; each field is now checked against its annotation when job.json is read."""
    with pytest.raises(ConfigError) as info:
        cls.from_dict({name: value})
    assert [e.field for e in info.value.errors] in ([name], ["checkpoint"])
    assert "expected" in info.value.errors[0].message or "model source" in info.value.errors[0].message


def test_the_type_errors_of_a_job_json_are_all_named_at_once():
    from trainer_core.export.spec import ExportSpec

    with pytest.raises(ConfigError) as info:
        ExportSpec.from_dict({"targets": [["adapter"]], "source": [], "quantizations": 5, "verify": None, "x": 1})
    assert [(e.field, e.message) for e in info.value.errors] == [
        ("x", "unknown field"),
        ("targets", "item 0: expected text, got ['adapter']"),
        ("source", "expected a model source (an object with run_id, checkpoint, model), got []"),
        ("quantizations", "expected a list of text, got 5"),
        ("verify", "expected true or false, got null"),
    ]
