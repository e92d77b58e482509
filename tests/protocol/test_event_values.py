"""Issue 24: forged event values are refused where they enter (events.decode), for every event kind, as an invalid
line the pump reports and skips; a value our own workers write always passes."""
from __future__ import annotations

import json
import os

import pytest

from trainer_core.protocol import event_rules, events as ev

BASE = {  # the required fields of each kind, with good values
    "status": {"status": "running"}, "warning": {"message": "m"}, "progress": {"step": 1, "total_steps": 3},
    "eval": {"step": 1}, "checkpoint": {"step": 1, "path": "/r/c"}, "complete": {"status": "completed"},
    "error": {"message": "m"}, "heartbeat": {"pid": 12}, "serve_ready": {"url": "http://127.0.0.1:1/v1"},
    "eval_sample": {"index": 0, "prompt": "p", "reference": "r", "answer": "a"},
    "eval_result": {"source_key": "base:m", "base_model": "m", "data_fingerprint": "f", "settings_hash": "h",
                    "metrics": {"samples": 2, "exact": 0.5, "bleu": 31.2, "judge": 7.0, "partial": False,
                                "lm_eval": {"arc": {"acc": 0.3}}, "perplexity": None, "new_key": 3}},
    "sample": {"step": 1, "index": 0, "prompt": "p", "text": "t"},
    "artifact": {"artifact": "gguf", "path": "/r/a", "size": 10, "sha256": "ab" * 32},
    "verify": {"format": "merged", "identical": 2, "total": 2},
    "data": {"fingerprint": "0123abcd" * 4},
}


def line(kind: str, **fields) -> str:
    return json.dumps({"kind": kind, "v": 1, "ts": 1.0, **BASE[kind], **fields})


def test_every_kind_has_rules_and_good_values_pass():
    assert set(BASE) == set(ev.EVENT_TYPES) == set(event_rules.FIELD_RULES)
    for kind in BASE:
        assert ev.decode(line(kind)).kind == kind


@pytest.mark.parametrize("kind, fields, message", [
    ("eval_sample", {"index": -1}, "eval_sample event: 'index' is -1, expected a whole number from 0 to 2,147,483,647"),
    ("eval_sample", {"index": 2**63 - 1}, "eval_sample event: 'index' is 9223372036854775807, expected a whole number "
                                          "from 0 to 2,147,483,647"),
    ("eval_sample", {"exact": 5.0}, "eval_sample event: 'exact' is 5.0, expected a number from 0 to 1"),
    ("eval_sample", {"tokens": -3}, "eval_sample event: 'tokens' is -3, expected a whole number from 0 to 2,147,483,647"),
    ("eval_sample", {"judge": 11}, "eval_sample event: 'judge' is 11, expected a number from 1 to 10"),
    ("eval_sample", {"bleu": 101.0}, "eval_sample event: 'bleu' is 101.0, expected a number from 0 to 100"),
    ("data", {"fingerprint": "../../x"}, "data event: 'fingerprint' is '../../x', expected a digest of 1 to 64 "
                                         "lower-case hex digits"),
    ("verify", {"identical": 5, "total": 2}, "verify event: 'identical' is 5, expected at most total (2)"),
    ("verify", {"total": -1, "identical": -2}, "verify event: 'identical' is -2, expected a whole number from 0 to "
                                               "2,147,483,647"),
    ("progress", {"step": -7}, "progress event: 'step' is -7, expected a whole number from 0 to 2,147,483,647"),
    ("progress", {"learning_rate": -1.0}, "progress event: 'learning_rate' is -1.0, expected a number of at least 0"),
    ("eval", {"step": -1}, "eval event: 'step' is -1, expected a whole number from 0 to 2,147,483,647"),
    ("checkpoint", {"step": 2**40}, "checkpoint event: 'step' is 1099511627776, expected a whole number from 0 to "
                                    "2,147,483,647"),
    ("complete", {"steps": -1}, "complete event: 'steps' is -1, expected a whole number from 0 to 2,147,483,647"),
    ("heartbeat", {"pid": -5}, "heartbeat event: 'pid' is -5, expected a whole number from 0 to 2,147,483,647"),
    ("serve_ready", {"url": "javascript:alert(1)"}, "serve_ready event: 'url' is 'javascript:alert(1)', expected an "
                                                    "http:// or https:// URL"),
    ("serve_ready", {"models": {"a": 1}}, "serve_ready event: 'models' is {'a': 1}, expected an object of at most 64 "
                                          "text values"),
    ("eval_result", {"metrics": {"exact": "lots", "rouge_l": [1]}}, "eval_result event: 'metrics' is {'exact': 'lots', "
                                                                    "'rouge_l': [1]}, expected 'exact' to be a number "
                                                                    "from 0 to 1"),
    ("eval_result", {"metrics": {"rouge_l": [1]}}, "eval_result event: 'metrics' is {'rouge_l': [1]}, expected "
                                                   "'rouge_l' to be a number from 0 to 1"),
    ("eval_result", {"metrics": {"x": {"y": 1}}}, "eval_result event: 'metrics' is {'x': {'y': 1}}, expected 'x' to be "
                                                  "a number, true/false, short text or null"),
    ("eval_result", {"metrics": {"lm_eval": {"arc": "high"}}}, "eval_result event: 'metrics' is {'lm_eval': {'arc': "
                                                               "'high'}}, expected 'lm_eval' to be an object of task -> "
                                                               "{metric: number}"),
    ("eval_result", {"checkpoint": -4}, "eval_result event: 'checkpoint' is -4, expected a whole number from 0 to "
                                        "2,147,483,647"),
    ("sample", {"index": -1}, "sample event: 'index' is -1, expected a whole number from 0 to 2,147,483,647"),
    ("artifact", {"size": -1}, "artifact event: 'size' is -1, expected a whole number from 0 to 9,223,372,036,854,775,807"),
    ("artifact", {"sha256": "zz"}, "artifact event: 'sha256' is 'zz', expected 64 lower-case hex digits"),
    ("artifact", {"artifact": "<img src=x>"}, "artifact event: 'artifact' is '<img src=x>', expected a short name "
                                              "(letters, digits, _ - .)"),
    ("status", {"ts": -1.0}, "status event: 'ts' is -1.0, expected a number of at least 0"),
    ("warning", {"nonfinite": {"loss": "big"}}, "warning event: 'nonfinite' is {'loss': 'big'}, expected an object of "
                                                "field names to 'nan', 'inf' or '-inf'"),
    ("error", {"ts": -2}, "error event: 'ts' is -2, expected a number of at least 0"),
])
def test_a_forged_value_is_refused_naming_the_field(kind, fields, message):
    with pytest.raises(ev.InvalidEvent) as info:
        ev.decode(line(kind, **fields))
    assert str(info.value) == message


def test_the_pump_skips_a_forged_line_with_a_warning_and_reads_on(tmp_path):
    path = tmp_path / ev.LOG_NAME
    path.write_text(line("eval_sample", index=-1) + "\n" + line("eval_sample", index=3) + "\n")
    events, end = ev.read_new(path, 0)
    assert [e.index for e in events] == [3] and end == path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        first = ev.read_lines(fd, 0)[0]
    finally:
        os.close(fd)
    assert first.event is None
    assert first.problem.startswith("skipped an invalid line at byte 0 of the event log (eval_sample event: 'index' "
                                    "is -1, expected a whole number from 0 to 2,147,483,647)")


def test_what_the_writer_emits_for_a_nan_metric_still_decodes():
    event = ev.EvalResultEvent(source_key="base:m", base_model="m", data_fingerprint="f", settings_hash="h",
                               metrics={"samples": 1, "loss": float("inf"), "perplexity": float("nan")})
    decoded = ev.decode(ev.encode(event))
    assert decoded.metrics == {"samples": 1, "loss": None, "perplexity": None}
