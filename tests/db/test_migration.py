"""Databases made before job kinds existed keep working: the store adds the new columns in place and old
runs read back as training jobs. The old database is made with raw SQL: the schema of db/models.py on
main before the redesign (no kind, owner, secrets_holder or sparkline columns)."""
from __future__ import annotations

import sqlite3

from db.store import Store
from trainer_core.protocol.status import JobKind, RunStatus

OLD_SCHEMA = """
CREATE TABLE run (
    id VARCHAR(64) NOT NULL, name VARCHAR NOT NULL, status VARCHAR NOT NULL, phase VARCHAR NOT NULL,
    model VARCHAR NOT NULL, dataset VARCHAR NOT NULL, method VARCHAR NOT NULL, engine VARCHAR NOT NULL,
    created_at FLOAT NOT NULL, started_at FLOAT, finished_at FLOAT, steps_done INTEGER NOT NULL,
    total_steps INTEGER NOT NULL, epoch FLOAT, last_loss FLOAT, final_loss FLOAT, best_eval_loss FLOAT,
    tokens_seen INTEGER, output_dir VARCHAR NOT NULL, config_json VARCHAR NOT NULL, error VARCHAR NOT NULL,
    log_tail VARCHAR NOT NULL, pid INTEGER, pid_started_at FLOAT, heartbeat_at FLOAT, event_offset INTEGER NOT NULL,
    queue_position FLOAT, devices VARCHAR NOT NULL, parent_run_id VARCHAR(64), resumed_from_step INTEGER,
    data_fingerprint VARCHAR NOT NULL, needs_secrets VARCHAR NOT NULL,
    PRIMARY KEY (id)
);
CREATE TABLE metric (
    run_id VARCHAR(64) NOT NULL, step INTEGER NOT NULL, epoch FLOAT, loss FLOAT, eval_loss FLOAT,
    learning_rate FLOAT, grad_norm FLOAT, tokens_seen INTEGER, tokens_per_s FLOAT, memory_mb FLOAT,
    elapsed_s FLOAT, wall_time FLOAT, nonfinite VARCHAR NOT NULL,
    PRIMARY KEY (run_id, step), FOREIGN KEY(run_id) REFERENCES run (id)
);
CREATE TABLE runevent (
    id INTEGER NOT NULL, run_id VARCHAR(64) NOT NULL, ts FLOAT NOT NULL, kind VARCHAR NOT NULL,
    message VARCHAR NOT NULL,
    PRIMARY KEY (id), FOREIGN KEY(run_id) REFERENCES run (id)
);
INSERT INTO run VALUES ('20260101-120000-abc123', 'old run', 'completed', '', 'SmolLM2', 'demo', 'LoRA', 'transformers',
    1767268800.0, 1767268801.0, 1767268900.0, 5, 5, 1.0, 0.5, 0.5, NULL, 640, '/runs/old', '{}', '', '', 4242,
    NULL, NULL, 1234, NULL, 'cpu', NULL, NULL, 'f00d', 'hf_token');
INSERT INTO metric VALUES ('20260101-120000-abc123', 1, 0.2, 2.0, NULL, 0.0001, NULL, 128, NULL, NULL, 1.0,
    1767268802.0, '');
INSERT INTO runevent VALUES (1, '20260101-120000-abc123', 1767268800.0, 'status', 'Queued');
"""


def test_an_old_schema_database_is_migrated_in_place_and_its_runs_are_training_jobs(tmp_path):
    path = tmp_path / "studio.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)

    store = Store(f"sqlite:///{path}")
    try:
        run = store.get_run("20260101-120000-abc123")
        assert (run.kind, run.owner, run.secrets_holder, run.sparkline) == ("train", "", "", None)
        assert JobKind(run.kind) is JobKind.TRAIN
        # everything that was there is untouched
        assert (run.name, run.status, run.steps_done, run.needs_secrets, run.event_offset) == \
            ("old run", RunStatus.COMPLETED, 5, ("hf_token",), 1234)
        assert store.metrics_frame(run.id)["loss"].tolist() == [2.0]
        assert [e.message for e in store.get_events(run.id)] == ["Queued"]
    finally:
        store.engine.dispose()
    with sqlite3.connect(path) as conn:  # a row written by old code after the migration is a training job too
        columns = [row[1] for row in conn.execute("PRAGMA table_info(run)")]
        assert columns[-3:] == ["kind", "sweep_id", "sweep_trial"]  # added in place, in the order declared
        conn.execute("INSERT INTO run (id, name, status, phase, model, dataset, method, engine, created_at, steps_done, "
                     "total_steps, output_dir, config_json, error, log_tail, event_offset, devices, data_fingerprint, "
                     "needs_secrets) VALUES ('later', '', 'queued', '', '', '', '', '', 0, 0, 0, '', '{}', '', '', 0, "
                     "'cpu', '', '')")
    store = Store(f"sqlite:///{path}")  # opening it again changes nothing
    try:
        assert store.get_run("later").kind == "train"
        assert store.get_run("20260101-120000-abc123").kind == "train"
    finally:
        store.engine.dispose()


OLD_SAMPLE_TABLE = """
CREATE TABLE sample (
    run_id VARCHAR(64) NOT NULL, step INTEGER NOT NULL, idx INTEGER NOT NULL, ts FLOAT NOT NULL,
    prompt VARCHAR NOT NULL, text VARCHAR NOT NULL,
    PRIMARY KEY (run_id, step, idx), FOREIGN KEY(run_id) REFERENCES run (id)
);
INSERT INTO sample VALUES ('20260101-120000-abc123', 1, 0, 1767268802.0, 'hi?', 'hello');
"""


def test_every_table_gets_its_new_columns_and_the_open_metric_table_is_created(tmp_path):
    """Issue 18: the migration covers every table, not only ``run`` (here a sample table from before the
    samples' token counts and flags), and a database from before open metrics gets their long table."""
    path = tmp_path / "studio.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA + OLD_SAMPLE_TABLE)

    store = Store(f"sqlite:///{path}")
    try:
        [sample] = store.samples("20260101-120000-abc123")
        assert (sample.prompt, sample.text, sample.new_tokens, sample.flags, sample.turns) == ("hi?", "hello", 0, {}, ())
        store.append_metrics("20260101-120000-abc123", [{"step": 1, "rewards/format/mean": 0.5}], event_offset=2000)
        frame = store.metrics_frame("20260101-120000-abc123")
        assert frame["loss"].tolist() == [2.0]  # the old wide row, untouched
        assert frame["rewards/format/mean"].tolist() == [0.5]
        assert store.get_run("20260101-120000-abc123").event_offset == 2000
    finally:
        store.engine.dispose()
    with sqlite3.connect(path) as conn:
        assert [row[1] for row in conn.execute("PRAGMA table_info(sample)")] == \
            ["run_id", "step", "idx", "ts", "prompt", "text", "new_tokens", "flags", "audio", "turns"]
        assert [row[1] for row in conn.execute("PRAGMA table_info(metricvalue)")] == ["run_id", "key", "step", "value"]
