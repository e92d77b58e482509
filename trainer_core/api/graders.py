"""OpenAI's reinforcement graders (``method.reinforcement.grader``) as the studio's built-in GRPO rewards.

| OpenAI grader | the studio's reward (``grpo.rewards``) |
|---|---|
| ``string_check`` ``eq``, reference ``{{item.<field>}}`` | ``answer_match`` (``column: <field>``, ``mode: exact``, ``extract: whole``) |
| ``string_check`` ``eq``, plain-text reference | ``format`` (``pattern``: the text, escaped) |
| ``string_check`` ``ne`` | the same with weight -1 |
| ``string_check`` ``like`` / ``ilike``, plain-text reference | ``contains`` (``keywords: [text]``, case-sensitive for ``like``) |
| ``multi`` | each grader's rewards, weighted by ``calculate_output`` (a weighted sum of the graders' names) |
| ``text_similarity``, ``score_model``, ``label_model``, ``python`` | refused, naming the fix |

``ne`` scores 0 / -1 where OpenAI scores 1 / 0: GRPO compares the completions of one prompt with each other, so a
reward shifted by a constant teaches the same (likewise a constant term in ``calculate_output``, left out). Both
ignore whitespace around the completion. ``input`` must be ``{{sample.output_text}}`` (the completion); a
reference is plain text or one ``{{item.<field>}}``, a top-level field of the training rows, which the studio's GRPO
passes to its rewards as the column of that name. Each refusal is an ApiError naming the grader's parameter.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from trainer_core.api.errors import invalid, unsupported

PARAM = "method.reinforcement.grader"
COMPLETION = "sample.output_text"
_TEMPLATE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_FIELD = re.compile(r"item\.([A-Za-z_][A-Za-z0-9_-]{0,63})")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
KEYS = {"string_check": ("type", "name", "input", "reference", "operation"),
        "multi": ("type", "name", "graders", "calculate_output")}
REFUSED = {
    "text_similarity": "the studio's GRPO rewards have no text-similarity score (fuzzy_match, BLEU, ROUGE, cosine...): "
                       "use a string_check grader (eq: the answer matches the row's reference)",
    "score_model": "a model grader needs an LLM judge while training, which the studio's GRPO does not have: use "
                   "string_check graders, or train a reward model (method reward) and use it as the reward "
                   "{model: FOLDER} of a GRPO run started from the New run form or the CLI (docs/methods.md)",
    "label_model": "a model grader needs an LLM judge while training, which the studio's GRPO does not have: use "
                   "string_check graders, or train a reward model (method reward) and use it as the reward "
                   "{model: FOLDER} of a GRPO run started from the New run form or the CLI (docs/methods.md)",
    "python": "a python grader is your own code, which this API does not run: write it as a reward file under the "
              "server's allowed folders and ask an admin to start the GRPO run with grpo.rewards: [{python: FILE, "
              "function: NAME}] from the New run form or the CLI (docs/methods.md); through this API use "
              "string_check graders",
}


@dataclass
class Rewards:
    """What a grader became: the run's ``grpo.rewards`` entries and the row fields they read (field -> parameter)."""

    rewards: list[dict] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)


def to_rewards(grader: object, param: str = PARAM) -> Rewards:
    """The rewards of ``grader``; an ApiError naming the grader's parameter when it cannot be mapped."""
    out = Rewards()
    _add(grader, param, 1.0, None, out)
    out.rewards = [r for r in out.rewards if r["weight"] != 0]
    if not out.rewards:
        raise invalid("the grader gives every completion the same score (all its weights are 0): GRPO needs a "
                      "reward that tells completions apart", param)
    return out


def _add(grader: object, param: str, weight: float, name: str | None, out: Rewards) -> None:
    if not isinstance(grader, dict):
        raise invalid("the grader must be an object such as {\"type\": \"string_check\", \"input\": "
                      "\"{{sample.output_text}}\", \"reference\": \"{{item.answer}}\", \"operation\": \"eq\"}", param)
    kind = grader.get("type")
    if kind in REFUSED:
        raise unsupported(f"{kind} graders are not supported here: {REFUSED[kind]}", f"{param}.type")
    if kind not in KEYS:
        raise invalid(f"grader type must be string_check or multi (text_similarity, score_model, label_model and "
                      f"python are refused here), not {str(kind)[:40]!r}", f"{param}.type")
    for key in grader:
        if key not in KEYS[kind]:
            raise invalid(f"a {kind} grader has no field {str(key)[:40]!r}: it takes {', '.join(KEYS[kind])}",
                          f"{param}.{str(key)[:40]}")
    own = grader.get("name")
    if own is not None and not isinstance(own, str):
        raise invalid("name must be a string", f"{param}.name")
    label = reward_name(name or own or kind)
    if kind == "multi":
        _add_multi(grader, param, weight, out)
    else:
        _add_string_check(grader, param, weight, label, out)


def reward_name(text: str) -> str:
    """A grader's name as a reward's (it names the metric rewards/<name>/mean): letters, digits and _."""
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")[:64]
    if not name or not _NAME.fullmatch(name):
        name = f"g_{name}"[:64] if name else "grader"
    return name


def _add_string_check(grader: dict, param: str, weight: float, name: str, out: Rewards) -> None:
    operation = grader.get("operation")
    if operation not in ("eq", "ne", "like", "ilike"):
        raise invalid(f"operation must be eq, ne, like or ilike, not {str(operation)[:40]!r}", f"{param}.operation")
    completion = grader.get("input")
    if not isinstance(completion, str) or _only_template(completion) != COMPLETION:
        raise invalid("input must be \"{{sample.output_text}}\": the studio grades the completion's text (the "
                      "model's output as JSON or tool calls cannot be graded here)", f"{param}.input")
    reference = grader.get("reference")
    if not isinstance(reference, str) or not reference:
        raise invalid("reference is required: plain text, or \"{{item.<field>}}\" for a field of each row",
                      f"{param}.reference")
    column = _row_field(reference, f"{param}.reference")
    if column is not None:
        if operation in ("like", "ilike"):
            raise unsupported(f"{operation} with a reference from each row has no built-in reward: the studio's "
                              "contains reward looks for fixed text (give reference as plain text), and its "
                              "answer_match compares the whole answer (operation eq)", f"{param}.operation")
        out.fields.setdefault(column, f"{param}.reference")
        entry = {"type": "answer_match", "column": column, "mode": "exact", "extract": "whole"}
    elif operation in ("eq", "ne"):
        entry = {"type": "format", "pattern": r"\s*" + re.escape(reference) + r"\s*"}
    else:
        entry = {"type": "contains", "keywords": [reference], "case_sensitive": operation == "like"}
    sign = -1.0 if operation == "ne" else 1.0
    out.rewards.append({**entry, "weight": sign * weight, "name": name})


def _only_template(text: str) -> str | None:
    """The reference inside ``text`` when ``text`` is exactly one ``{{...}}``, else None."""
    match = _TEMPLATE.fullmatch(text.strip())
    return match.group(1) if match else None


def _row_field(reference: str, param: str) -> str | None:
    """The row field a reference names (``{{item.answer}}`` -> ``answer``), None for plain text."""
    if "{{" not in reference and "}}" not in reference:
        return None
    inner = _only_template(reference)
    match = _FIELD.fullmatch(inner or "")
    if match is None:
        raise invalid("reference must be plain text or exactly one \"{{item.<field>}}\" (a top-level field of the "
                      f"training rows); {reference[:80]!r} cannot be mapped", param)
    if match.group(1) in ("messages", "prompt"):
        raise invalid(f"{{{{item.{match.group(1)}}}}} is the prompt itself: name a field that holds the reference "
                      "answer, such as {{item.reference_answer}}", param)
    return match.group(1)


def _add_multi(grader: dict, param: str, weight: float, out: Rewards) -> None:
    graders = grader.get("graders")
    if not isinstance(graders, dict) or not graders:
        raise invalid("graders must be an object of named graders, e.g. {\"exact\": {...}, \"keyword\": {...}}",
                      f"{param}.graders")
    expression = grader.get("calculate_output")
    if not isinstance(expression, str) or not expression.strip():
        raise invalid("calculate_output is required: a weighted sum of the graders' names, e.g. "
                      "\"0.7 * exact + 0.3 * keyword\"", f"{param}.calculate_output")
    weights = weighted_sum(expression, set(graders), f"{param}.calculate_output")
    for key, sub in graders.items():
        _add(sub, f"{param}.graders.{key}", weight * weights.get(key, 0.0), str(key), out)


def weighted_sum(expression: str, names: set[str], param: str) -> dict[str, float]:
    """The weight of each name in a weighted sum such as ``(2 * a + b) / 3`` (a constant term is left out: it shifts
    every completion's reward alike); ApiError for anything else (min, max, a product of graders...)."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        tree = None
    found = _linear(tree.body, names) if tree is not None else None
    if found is None:
        raise unsupported(f"calculate_output {expression[:120]!r} cannot be mapped: the studio adds its rewards with "
                          f"a weight each, so write a weighted sum of the graders ({', '.join(sorted(names))}) such "
                          "as \"0.7 * a + 0.3 * b\" (no min, max or products of graders)", param)
    return found[0]


def _linear(node: ast.AST, names: set[str]) -> tuple[dict[str, float], float] | None:
    """(weights, constant) of an expression linear in ``names``, or None."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return {}, float(node.value)
    if isinstance(node, ast.Name):
        return ({node.id: 1.0}, 0.0) if node.id in names else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        inner = _linear(node.operand, names)
        sign = -1.0 if isinstance(node.op, ast.USub) else 1.0
        return None if inner is None else _scaled(inner, sign)
    if not isinstance(node, ast.BinOp):
        return None
    left, right = _linear(node.left, names), _linear(node.right, names)
    if left is None or right is None:
        return None
    if isinstance(node.op, (ast.Add, ast.Sub)):
        sign = -1.0 if isinstance(node.op, ast.Sub) else 1.0
        weights = dict(left[0])
        for name, value in right[0].items():
            weights[name] = weights.get(name, 0.0) + sign * value
        return weights, left[1] + sign * right[1]
    if isinstance(node.op, ast.Mult) and (not left[0] or not right[0]):
        constant, other = (left, right) if not left[0] else (right, left)
        return _scaled(other, constant[1])
    if isinstance(node.op, ast.Div) and not right[0] and right[1] != 0:
        return _scaled(left, 1.0 / right[1])
    return None


def _scaled(found: tuple[dict[str, float], float], factor: float) -> tuple[dict[str, float], float]:
    return {name: value * factor for name, value in found[0].items()}, found[1] * factor
