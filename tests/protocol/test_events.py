"""Worker events: encoding, number cleaning and tailing the event log."""
from __future__ import annotations

import json
import math
import os

import pytest

from trainer_core.protocol import events as ev

ALL_EVENTS = [
    ev.StatusEvent(status="running", phase="training", message="go", engine="transformers", ts=1.0),
    ev.WarningEvent(message="low memory", ts=2.0),
    ev.ProgressEvent(step=3, total_steps=10, epoch=0.3, loss=1.25, learning_rate=2e-4, grad_norm=0.5,
                     tokens_seen=1536, tokens_per_s=812.5, memory_mb=1024.0, elapsed_s=4.5, eta_s=10.5, ts=3.0),
    ev.EvalEvent(step=5, eval_loss=1.1, ts=4.0),
    ev.CheckpointEvent(step=5, path="/runs/x/checkpoint-5", ts=5.0),
    ev.CompleteEvent(status="completed", output_dir="/runs/x/adapter", steps=10, final_loss=0.9, ts=6.0),
    ev.ErrorEvent(message="CUDA out of memory", exc_type="OutOfMemoryError", traceback="Traceback ...", ts=7.0),
    ev.HeartbeatEvent(pid=4242, ts=8.0),
    ev.ServeReadyEvent(url="http://127.0.0.1:8000/v1", models={"tuned": "my run · final"}, engine="transformers", ts=9.0),
    ev.SampleEvent(step=20, index=1, prompt="Say <b>hi</b> *now*", text="hi<|im_end|>", new_tokens=3,
                   flags={"template_leak": "the answer contains <|im_end|>"}, ts=10.0),
    ev.EvalSampleEvent(index=0, prompt="2+2?", reference="4", answer="four", exact=0.0, rouge_l=0.0, bleu=0.0,
                       loss=1.5, tokens=3, ts=9.0),
    ev.EvalResultEvent(source_key="run:r", base_model="bundled:x", data_fingerprint="fp", settings_hash="sh",
                       metrics={"exact": 0.5, "lm_eval": {"t": {"acc,none": 1.0}}}, source_run_id="r", checkpoint=4,
                       ts=10.0),
    ev.ArtifactEvent(artifact="gguf", path="/runs/x/artifacts/m-q8_0.gguf", size=144810848, sha256="ab" * 32,
                     source_run_id="r1", detail="q8_0", ts=9.0),
    ev.VerifyEvent(format="gguf q8_0", identical=2, total=3, first_difference="prompt 2, token 4", ts=10.0),
    ev.DataEvent(fingerprint="0123abcd" * 4, rows=300, eval_rows=30, ts=11.0),
]


def test_every_event_kind_is_registered_once():
    assert sorted(ev.EVENT_TYPES) == ["artifact", "checkpoint", "complete", "data", "error", "eval", "eval_result",
                                      "eval_sample", "heartbeat", "progress", "sample", "serve_ready", "status",
                                      "verify", "warning"]
    assert sorted(type(e).kind for e in ALL_EVENTS) == sorted(ev.EVENT_TYPES)


@pytest.mark.parametrize("event", ALL_EVENTS, ids=lambda e: type(e).kind)
def test_encode_decode_round_trip(event):
    line = ev.encode(event)
    decoded = ev.decode(line)
    assert type(decoded) is type(event)
    assert decoded == event
    data = json.loads(line)
    assert data["kind"] == type(event).kind
    assert data["v"] == ev.SCHEMA_VERSION
    assert data["nonfinite"] == {}
    assert "\n" not in line


def test_clean_numbers_replaces_nonfinite_and_records_them():
    cleaned, nonfinite = ev.clean_numbers(
        {"loss": float("nan"), "grad_norm": float("inf"), "lr": float("-inf"), "step": 3, "epoch": 0.5,
         "name": "x", "none": None})
    assert cleaned == {"loss": None, "grad_norm": None, "lr": None, "step": 3, "epoch": 0.5, "name": "x",
                       "none": None}
    assert nonfinite == {"loss": "nan", "grad_norm": "inf", "lr": "-inf"}


def test_clean_numbers_leaves_finite_payload_alone():
    payload = {"loss": 1.5, "step": 0, "flag": True}
    assert ev.clean_numbers(payload) == (payload, {})


def test_clean_numbers_cleans_at_any_depth_and_names_the_dotted_path():
    cleaned, nonfinite = ev.clean_numbers(
        {"loss": 1.0, "metrics": {"perplexity": float("inf"), "ok": 2.0,
                                  "lm_eval": {"task": {"acc,none": float("nan"), "n": 3}}},
         "values": [1.0, float("-inf"), (float("nan"), 4)], "name": "x"})
    assert cleaned == {"loss": 1.0, "metrics": {"perplexity": None, "ok": 2.0,
                                                "lm_eval": {"task": {"acc,none": None, "n": 3}}},
                       "values": [1.0, None, [None, 4]], "name": "x"}
    assert nonfinite == {"metrics.perplexity": "inf", "metrics.lm_eval.task.acc,none": "nan", "values.1": "-inf",
                         "values.2.0": "nan"}


def test_an_eval_result_with_an_infinite_metric_encodes_and_names_it():
    event = ev.EvalResultEvent(source_key="run:r", base_model="b", data_fingerprint="fp", settings_hash="sh",
                               metrics={"perplexity": float("inf"), "exact": 0.5}, ts=1.0)
    line = ev.encode(event)  # raised ValueError ("Out of range float values are not JSON compliant") before
    json.loads(line, parse_constant=lambda token: pytest.fail(f"non-standard JSON token {token}"))
    decoded = ev.decode(line)
    assert decoded.metrics == {"perplexity": None, "exact": 0.5}
    assert decoded.nonfinite == {"metrics.perplexity": "inf"}


def test_progress_event_carries_open_metrics_and_cleans_them():
    event = ev.ProgressEvent(step=4, total_steps=8, loss=0.5, ts=1.0,
                             metrics={"rewards/format/mean": 0.75, "rewards/chosen": float("nan"), "logps/rejected": -3})
    decoded = ev.decode(ev.encode(event))
    assert decoded.metrics == {"rewards/format/mean": 0.75, "rewards/chosen": None, "logps/rejected": -3}
    assert decoded.nonfinite == {"metrics.rewards/chosen": "nan"}
    assert decoded.loss == 0.5


def test_a_progress_line_written_before_open_metrics_decodes_unchanged():
    line = ('{"ts":3.0,"nonfinite":{},"step":3,"total_steps":10,"epoch":0.3,"loss":1.25,"learning_rate":0.0002,'
            '"grad_norm":0.5,"tokens_seen":1536,"tokens_per_s":812.5,"memory_mb":1024.0,"elapsed_s":4.5,'
            '"eta_s":10.5,"kind":"progress","v":1}')
    assert ev.decode(line) == ALL_EVENTS[2]
    assert ev.decode(line).metrics == {}
    assert ev.decode('{"kind":"eval","step":5,"eval_loss":1.1,"ts":4.0}').metrics == {}


@pytest.mark.parametrize("metrics, problem", [
    ({"": 1.0}, "progress event: 'metrics' key '' is empty"),
    ({"a\x00b": 1.0}, "progress event: 'metrics' key 'a\\x00b' contains a control character (NUL, newline, "
                       "tab...): use printable characters only"),
    ({"x" * 201: 1.0}, f"progress event: 'metrics' key {'x' * 60!r} is 201 characters long; at most 200"),
    ({"a,b": 1.0}, "progress event: 'metrics' key 'a,b' contains a comma: use another separator such as '/' or '_'"),
    ({"loss": 1.0}, "progress event: 'metrics' key 'loss' is a wide metric field: send it as the event's own field"),
    ({"ok": "high"}, "progress event: 'metrics' 'ok' is 'high', expected a number or null"),
    ({"ok": True}, "progress event: 'metrics' 'ok' is True, expected a number or null"),
    ({"ok": {"nested": 1}}, "progress event: 'metrics' 'ok' is {'nested': 1}, expected a number or null"),
])
def test_invalid_open_metrics_are_refused_naming_the_key(metrics, problem):
    line = json.dumps({"kind": "progress", "step": 1, "total_steps": 2, "metrics": metrics})
    with pytest.raises(ev.InvalidEvent) as caught:
        ev.decode(line)
    assert str(caught.value) == problem


def test_encode_is_strict_json_and_keeps_nonfinite():
    event = ev.ProgressEvent(step=7, total_steps=10, loss=float("nan"), grad_norm=float("inf"),
                             learning_rate=float("-inf"), ts=1.0)
    line = ev.encode(event)
    assert "NaN" not in line and "Infinity" not in line
    json.loads(line, parse_constant=lambda token: pytest.fail(f"non-standard JSON token {token}"))
    decoded = ev.decode(line)
    assert decoded.loss is None and decoded.grad_norm is None and decoded.learning_rate is None
    assert decoded.nonfinite == {"loss": "nan", "grad_norm": "inf", "learning_rate": "-inf"}
    assert decoded.step == 7 and decoded.total_steps == 10


def test_encode_merges_nonfinite_already_recorded_on_the_event():
    event = ev.EvalEvent(step=2, eval_loss=float("inf"), nonfinite={"loss": "nan"}, ts=1.0)
    assert ev.decode(ev.encode(event)).nonfinite == {"loss": "nan", "eval_loss": "inf"}


def test_decode_rejects_unknown_kind_and_ignores_unknown_fields():
    with pytest.raises(ev.UnknownEvent, match="'telemetry'"):
        ev.decode('{"kind":"telemetry","v":1}')
    decoded = ev.decode('{"kind":"heartbeat","v":2,"pid":9,"ts":1.0,"added_in_v2":"x"}')
    assert decoded == ev.HeartbeatEvent(pid=9, ts=1.0)


@pytest.mark.parametrize("line", ["42", '"status"', "null", "[1]"])
def test_decode_rejects_json_that_is_not_an_object(line):
    with pytest.raises(ev.UnknownEvent, match="an event is a JSON object"):
        ev.decode(line)


def test_writer_appends_one_line_per_event(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = ev.EventWriter(path)
    writer.emit(ALL_EVENTS[0])
    writer.emit(ALL_EVENTS[1])
    # flushed per line: readable before close
    assert path.read_text(encoding="utf-8").count("\n") == 2
    writer.close()
    writer.close()  # idempotent
    events, offset = ev.read_new(path, 0)
    assert events == ALL_EVENTS[:2]
    assert offset == path.stat().st_size


def test_read_new_missing_file(tmp_path):
    assert ev.read_new(tmp_path / "nope.jsonl", 17) == ([], 17)


def test_read_new_leaves_a_half_written_line_until_it_is_complete(tmp_path):
    path = tmp_path / "events.jsonl"
    first = ev.encode(ALL_EVENTS[0]) + "\n"
    second = ev.encode(ALL_EVENTS[2])
    path.write_bytes((first + second[:25]).encode())

    events, offset = ev.read_new(path, 0)
    assert events == [ALL_EVENTS[0]]
    assert offset == len(first.encode())

    # nothing new and complete yet: same offset, no events
    assert ev.read_new(path, offset) == ([], offset)

    with open(path, "ab") as fh:
        fh.write((second[25:] + "\n").encode())
    events, offset2 = ev.read_new(path, offset)
    assert events == [ALL_EVENTS[2]]
    assert offset2 == len((first + second + "\n").encode())
    assert ev.read_new(path, offset2) == ([], offset2)


def test_read_new_from_an_offset_returns_only_later_events(tmp_path):
    path = tmp_path / "events.jsonl"
    lines = [ev.encode(e) + "\n" for e in ALL_EVENTS]
    path.write_text("".join(lines), encoding="utf-8")
    offset = len("".join(lines[:5]).encode())
    events, end = ev.read_new(path, offset)
    assert events == ALL_EVENTS[5:]
    assert end == path.stat().st_size


def test_read_new_respects_max_bytes_on_line_boundaries(tmp_path):
    path = tmp_path / "events.jsonl"
    lines = [(ev.encode(e) + "\n").encode() for e in ALL_EVENTS[:3]]
    path.write_bytes(b"".join(lines))
    # room for the first line and part of the second: only the first is consumed
    events, offset = ev.read_new(path, 0, max_bytes=len(lines[0]) + 5)
    assert events == [ALL_EVENTS[0]]
    assert offset == len(lines[0])
    events, offset = ev.read_new(path, offset)
    assert events == ALL_EVENTS[1:3]
    assert offset == sum(len(x) for x in lines)


@pytest.mark.parametrize("corrupt", [
    b"{not json",
    b'{"kind":"progress","v":1}',          # required fields missing
    b'{"kind":"alien","v":1}',             # unknown kind
    b'{"kind":["status"],"v":1}',          # unhashable kind
    b"[1, 2, 3]",                           # JSON, but not an object
    b"42",
    b'"status"',
    b"null",
    b"\xff\xfe garbage",                    # not UTF-8
])
def test_read_new_skips_corrupt_lines_without_stalling(tmp_path, corrupt):
    path = tmp_path / "events.jsonl"
    good1 = (ev.encode(ALL_EVENTS[1]) + "\n").encode()
    good2 = (ev.encode(ALL_EVENTS[7]) + "\n").encode()
    path.write_bytes(good1 + corrupt + b"\n\n" + good2)
    events, offset = ev.read_new(path, 0)
    assert events == [ALL_EVENTS[1], ALL_EVENTS[7]]
    assert offset == path.stat().st_size


def test_decoded_progress_keeps_nan_loss_as_news():
    line = ev.encode(ev.ProgressEvent(step=1, total_steps=2, loss=math.nan, ts=1.0))
    assert json.loads(line)["loss"] is None
    assert json.loads(line)["nonfinite"] == {"loss": "nan"}


def test_a_line_longer_than_one_read_is_skipped_and_reading_goes_on(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = ev.EventWriter(path)
    writer.emit(ev.WarningEvent(message="short"))
    writer.emit(ev.WarningEvent(message="y" * 5000))  # longer than max_bytes below
    writer.emit(ev.HeartbeatEvent(pid=7))
    writer.close()
    offset, kinds = 0, []
    for _ in range(5):
        new, offset = ev.read_new(path, offset, max_bytes=1000)
        kinds += [(e.kind, getattr(e, "message", "")[:5]) for e in new]
    assert kinds == [("warning", "short"), ("heartbeat", "")]
    assert offset == path.stat().st_size


def test_a_long_line_still_being_written_is_read_again_later(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"x" * 3000)  # no newline yet
    assert ev.read_new(path, 0, max_bytes=1000) == ([], 0)


@pytest.mark.parametrize("line, message", [
    ('{"kind":"complete","status":"running"}', "complete event: 'status' is 'running', expected one of cancelled, "
                                               "completed, stopped"),
    ('{"kind":"status","status":"failed"}', "status event: 'status' is 'failed', expected one of running, starting, "
                                            "stopping"),
    ('{"kind":"progress","step":"x","total_steps":3}', "progress event: 'step' is 'x', expected int"),
    ('{"kind":"progress","step":true,"total_steps":3}', "progress event: 'step' is True, expected int"),
    ('{"kind":"progress","step":1,"total_steps":3,"loss":"low"}', "progress event: 'loss' is 'low', expected int or "
                                                                  "float or null"),
    ('{"kind":"eval","eval_loss":1.0}', "eval event without its 'step' field"),
    ('{"kind":"warning","message":["a"]}', "warning event: 'message' is ['a'], expected str"),
])
def test_decode_names_the_field_that_is_wrong(line, message):
    with pytest.raises(ev.InvalidEvent) as info:
        ev.decode(line)
    assert str(info.value) == message


@pytest.mark.parametrize("line", [
    b'{"kind":"progress","step":1,"total_steps":3,"loss":NaN}',  # our writer never writes these: allow_nan=False
    b'{"kind":"progress","step":1,"total_steps":3,"loss":Infinity}',
    b'{"kind":"progress","step":1,"total_steps":3,"loss":1e400}',  # overflows a double
    b'{"kind":"progress","step":100000000000000000000000,"total_steps":3}',  # no database column holds it
    b'{"kind":"warning","message":"caf\xe9"}',  # not UTF-8
])
def test_decode_refuses_numbers_and_bytes_our_writer_never_writes(line):
    with pytest.raises(ValueError):
        ev.decode(line)


def test_read_lines_reports_each_invalid_line_with_its_own_offset(tmp_path):
    path = tmp_path / "events.jsonl"
    good = ev.encode(ALL_EVENTS[1]) + "\n"
    bad = '{"kind":"progress","step":"x","total_steps":3}\n'
    path.write_text(good + bad + good)
    fd = os.open(path, os.O_RDONLY)
    try:
        lines = ev.read_lines(fd, 0)
    finally:
        os.close(fd)
    assert [line.end for line in lines] == [len(good), len(good) + len(bad), 2 * len(good) + len(bad)]
    assert [line.event for line in lines] == [ALL_EVENTS[1], None, ALL_EVENTS[1]]
    assert "at byte " + f"{len(good):,}" in lines[1].problem and "'step' is 'x'" in lines[1].problem


def test_follower_keeps_reading_a_deleted_log_and_says_so_once(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = ev.EventWriter(path)
    writer.emit(ALL_EVENTS[1])
    follower = ev.LogFollower(path)
    first = follower.read(0)
    assert [line.event for line in first] == [ALL_EVENTS[1]]
    path.unlink()
    writer.emit(ALL_EVENTS[7])  # the writer's descriptor still leads to the unlinked file
    writer.close()
    second = follower.read(first[-1].end)
    assert "events.jsonl was deleted" in second[0].problem and second[0].end == first[-1].end
    assert [line.event for line in second[1:]] == [ALL_EVENTS[7]]
    assert follower.read(second[-1].end) == []  # reported once
    assert follower.last_terminal_event() is None
    follower.close()


def test_follower_restarts_from_the_top_of_a_log_that_shrank(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(ev.encode(ALL_EVENTS[1]) + "\n" + ev.encode(ALL_EVENTS[7]) + "\n")
    follower = ev.LogFollower(path)
    end = follower.read(0)[-1].end
    with open(path, "r+") as fh:
        fh.truncate(0)
    assert follower.read(end) == [ev.LogLine(0, None, f"events.jsonl shrank from {end:,} to 0 bytes; reading it "
                                                       "again from its start (stored metrics are merged by step)")]
    follower.close()


def test_follower_finds_the_workers_unlinked_log_through_proc(tmp_path):
    """After a server restart the path may lead nowhere; the worker's open descriptor still leads to its log."""
    path = tmp_path / "events.jsonl"
    writer = ev.EventWriter(path)  # this process plays the worker
    writer.emit(ALL_EVENTS[5])
    path.unlink()
    follower = ev.LogFollower(path, pid=os.getpid())
    lines = follower.read(0)
    assert "events.jsonl was deleted" in lines[0].problem
    assert [line.event for line in lines[1:]] == [ALL_EVENTS[5]]
    assert follower.last_terminal_event() == ALL_EVENTS[5]
    follower.close()
    writer.close()
