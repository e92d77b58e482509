"""The values an event may carry: ``events.decode`` checks each field's JSON type from its annotation, then
``validate_event`` the values of that type the field may hold (FIELD_RULES, EVENT_RULES), so a forged or damaged line
is refused where it enters (trainer_core/protocol/events.py)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from trainer_core.protocol.events import Event


class InvalidEvent(ValueError):
    """A log line that is not a valid event: says which field is wrong and how."""


# ====================================================================== the values an event may carry
# decode() checks each field's JSON type from its annotation; FIELD_RULES say which values of that type a field
# may hold, so a forged or damaged line (a sample index of -1, an exact match of 5.0, a metric "lots", verify 5/2)
# is refused where it enters, as an invalid line the pump reports and skips, and never reaches a handler, the
# database or a page. A rule returns what was expected, or "" when the value is fine; None (an optional field,
# or a number cleaned of NaN) always is.
COUNT_MAX = 2**31 - 1  # steps, indices and counts: an INTEGER column on PostgreSQL
BYTES_MAX = 2**63 - 1  # sizes and token totals: a BIGINT
_HEX64 = frozenset("0123456789abcdef")
Rule = Callable[[Any], str]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def whole(low: int = 0, high: int = COUNT_MAX) -> Rule:
    def rule(value: Any) -> str:
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high)
        return "" if ok else f"a whole number from {low:,} to {high:,}"
    return rule


def between(low: float, high: float = math.inf) -> Rule:
    def rule(value: Any) -> str:
        ok = value is None or (_number(value) and low <= value <= high)
        return "" if ok else (f"a number from {low:g} to {high:g}" if high < math.inf else f"a number of at least {low:g}")
    return rule


def sha256_hex(value: Any) -> str:
    return "" if isinstance(value, str) and len(value) == 64 and set(value) <= _HEX64 else "64 lower-case hex digits"


def hex_digest(value: Any) -> str:
    ok = isinstance(value, str) and 0 < len(value) <= 64 and set(value) <= _HEX64
    return "" if ok else "a digest of 1 to 64 lower-case hex digits"


def identifier(value: Any) -> str:
    ok = isinstance(value, str) and 0 < len(value) <= 40 and all(c.isascii() and (c.isalnum() or c in "_-.") for c in value)
    return "" if ok else "a short name (letters, digits, _ - .)"


def http_url(value: Any) -> str:
    ok = isinstance(value, str) and value.startswith(("http://", "https://")) and len(value) <= 2000
    return "" if ok else "an http:// or https:// URL"


def text_map(value: Any) -> str:
    ok = isinstance(value, dict) and len(value) <= 64 and all(isinstance(v, str) for v in value.values())
    return "" if ok else "an object of at most 64 text values"


def nonfinite_map(value: Any) -> str:
    ok = isinstance(value, dict) and all(v in ("nan", "inf", "-inf") for v in value.values())
    return "" if ok else "an object of field names to 'nan', 'inf' or '-inf'"


# An eval result's metrics: the known keys with their ranges; any other key a plain value (number, true/false,
# text, null), so a metric a later version adds still decodes; "lm_eval" is {task: {metric: number}}.
EVAL_METRIC_RULES: dict[str, Rule] = {
    "samples": whole(), "judged": whole(), "exact": between(0, 1), "rouge_l": between(0, 1), "bleu": between(0, 100),
    "loss": between(0), "perplexity": between(0), "judge": between(1, 10),
    "partial": lambda v: "" if isinstance(v, bool) else "true or false",
}


def _lm_eval(value: Any) -> str:
    ok = isinstance(value, dict) and all(isinstance(scores, dict) and all(v is None or _number(v) for v in scores.values())
                                         for scores in value.values())
    return "" if ok else "an object of task -> {metric: number}"


def eval_metrics(value: Any) -> str:
    if not isinstance(value, dict) or len(value) > 200:
        return "an object of at most 200 metrics"
    for key, item in value.items():
        if len(key) > 200:
            return "metric names of at most 200 characters"
        rule = EVAL_METRIC_RULES.get(key) or (_lm_eval if key == "lm_eval" else None)
        if rule is not None:
            problem = rule(item)
            if problem:
                return f"{key!r} to be {problem}"
        elif not (item is None or isinstance(item, (str, int, float, bool))) or (isinstance(item, str) and len(item) > 1000):
            return f"{key!r} to be a number, true/false, short text or null"
    return ""


_TIMES = {"ts": between(0)}
TURNS_MAX = 64  # turns of one sampled trajectory (the worker keeps at most 32)


def _turn_ok(turn: Any) -> bool:
    if not isinstance(turn, dict) or not isinstance(turn.get("content", ""), str):
        return False
    if turn.get("role") == "tool":
        return set(turn) <= {"role", "name", "content"} and isinstance(turn.get("name", ""), str)
    calls = turn.get("calls", [])
    return (turn.get("role") == "assistant" and set(turn) <= {"role", "content", "calls"} and isinstance(calls, list)
            and all(isinstance(c, dict) and set(c) <= {"name", "arguments"}
                    and all(isinstance(v, str) for v in c.values()) for c in calls))


def trajectory_turns(value: Any) -> str:
    ok = isinstance(value, list) and len(value) <= TURNS_MAX and all(_turn_ok(turn) for turn in value)
    return "" if ok else (f"at most {TURNS_MAX} turns, each {{role: assistant, content, calls: [{{name, arguments}}]}} "
                          "or {role: tool, name, content} with text values")


FIELD_RULES: dict[str, dict[str, Rule]] = {
    "status": {},
    "warning": {},
    "progress": {"step": whole(), "total_steps": whole(), "epoch": between(0), "learning_rate": between(0),
                 "grad_norm": between(0), "tokens_seen": whole(0, BYTES_MAX), "memory_mb": between(0)},
    "eval": {"step": whole()},
    "checkpoint": {"step": whole()},
    "complete": {"steps": whole()},
    "error": {},
    "heartbeat": {"pid": whole()},
    "serve_ready": {"url": http_url, "models": text_map},
    "eval_sample": {"index": whole(), "exact": between(0, 1), "rouge_l": between(0, 1), "bleu": between(0, 100),
                    "loss": between(0), "tokens": whole(), "judge": between(1, 10)},
    "eval_result": {"metrics": eval_metrics, "checkpoint": whole()},
    "sample": {"step": whole(), "index": whole(), "new_tokens": whole(), "turns": trajectory_turns},
    "artifact": {"artifact": identifier, "size": whole(0, BYTES_MAX), "sha256": sha256_hex},
    "verify": {"identical": whole(), "total": whole()},
    "data": {"fingerprint": hex_digest, "rows": whole(), "eval_rows": whole()},
}
# Rules between two fields of one event: (the field named, its rule given the event).
EVENT_RULES: dict[str, tuple[tuple[str, Callable[[Any], str]], ...]] = {
    "verify": (("identical", lambda e: "" if e.identical <= e.total else f"at most total ({e.total})"),),
}


def validate_event(event: Event) -> None:
    """InvalidEvent naming the first field whose value ``event`` may not carry (see FIELD_RULES)."""
    rules = FIELD_RULES.get(event.kind, {})
    for name, rule in (*_TIMES.items(), ("nonfinite", nonfinite_map), *rules.items()):
        value = getattr(event, name)
        problem = rule(value)
        if problem:
            raise InvalidEvent(f"{event.kind} event: {name!r} is {value!r:.80}, expected {problem}")
    for name, rule in EVENT_RULES.get(event.kind, ()):
        problem = rule(event)
        if problem:
            raise InvalidEvent(f"{event.kind} event: {name!r} is {getattr(event, name)!r:.80}, expected {problem}")
