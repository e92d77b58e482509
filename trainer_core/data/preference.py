"""Preference and RL data: pairs (DPO, ORPO, SimPO, reward), labelled completions (KTO), prompts (GRPO).

Rows come out in TRL's shapes: ``{prompt, chosen, rejected}``, ``{prompt, completion, label}`` and
``{prompt, **other columns}``, each either all text or all conversational (message lists), so the trainer
applies the chat template itself. Conversational pairs whose ``chosen``/``rejected`` repeat the whole
conversation (Anthropic HH, UltraFeedback) have their shared prefix split off as the prompt. Unusable rows
are dropped and counted with ``NormalizedData``, as for SFT data.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from trainer_core.data import DatasetError, quoted
from trainer_core.data.formats import ROLE_ALIASES, NormalizedData, as_turn_list, columns_of, no_usable_rows
from trainer_core.data.tool_calls import TOOL_ROLE, ToolFormatError, normalize_call, pair_tool_results

PAIR_KEYS = ("prompt", "chosen", "rejected")
KTO_KEYS = ("prompt", "completion", "label")
SHAPES = {
    "pairs": "prompt/chosen/rejected columns (text, or message lists sharing a prefix)",
    "kto": "prompt/completion/label columns (label true for a good answer), or preference pairs",
    "prompts": "a prompt column (text or messages), or chat rows whose last assistant turn is left out",
}
UNREADABLE_TURNS = "prompt's turns cannot be read (each needs a role and text; a call, a name and object arguments)"
_TRUE = {"true", "1", "yes", "good", "desirable", "chosen"}
_FALSE = {"false", "0", "no", "bad", "undesirable", "rejected"}


def _col(mapping: dict | None, name: str) -> str:
    return (mapping or {}).get(name, name)


def _messages(value: Any) -> list[dict] | None:
    """A message list in role/content form (ShareGPT's from/value too), or None when the value is not one."""
    turns = as_turn_list(value)
    if turns is None:
        return None
    out = []
    for turn in turns:
        if not isinstance(turn, dict):
            return None
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if not isinstance(role, str) or not isinstance(content, str) or role.strip().lower() not in ROLE_ALIASES:
            return None
        out.append({"role": ROLE_ALIASES[role.strip().lower()], "content": content})
    return out


def _prompt_messages(value: Any) -> list[dict] | None:
    """A GRPO prompt's message list, keeping tool turns: an assistant turn's ``tool_calls`` (in the normal form of
    trainer_core.data.tool_calls, arguments as JSON text; its content may then be null) and ``role: tool`` results
    paired with their calls. A few-shot prompt whose examples call tools shows the model the calls it should make
    (docs/tool-calling.md); without this the calls were dropped and only their empty words stayed. None when the
    value is not a message list (or a call cannot be read)."""
    turns = as_turn_list(value)
    if turns is None or not all(isinstance(turn, dict) for turn in turns):
        return None
    if not any(turn.get("tool_calls") or turn.get("role") == TOOL_ROLE for turn in turns):
        return _messages(turns)
    out = []
    for index, turn in enumerate(turns):
        role, content, calls = turn.get("role"), turn.get("content"), turn.get("tool_calls")
        if role == TOOL_ROLE and isinstance(content, str):
            out.append({"role": TOOL_ROLE, "content": content,
                        **{k: turn[k] for k in ("tool_call_id", "name") if isinstance(turn.get(k), str)}})
            continue
        if calls and role == "assistant" and isinstance(calls, list) and (content is None or isinstance(content, str)):
            try:
                normal = [normalize_call(call, f"call_{index}_{n}") for n, call in enumerate(calls)]
            except ToolFormatError:
                return None
            out.append({"role": "assistant", "content": content or "", "tool_calls": normal})
            continue
        plain = _messages([turn])
        if plain is None:
            return None
        out += plain
    return pair_tool_results(out)


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value
    return None


def split_shared_prefix(chosen: list[dict], rejected: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """(prompt, chosen tail, rejected tail): the turns both sides share become the prompt."""
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    while shared and chosen[shared - 1]["role"] == "assistant":  # the prompt ends before an answer
        shared -= 1
    return chosen[:shared], chosen[shared:], rejected[shared:]


def _pair(row: dict, m: dict | None, system: str) -> tuple[dict | None, str | None]:
    chosen_raw, rejected_raw = row.get(_col(m, "chosen")), row.get(_col(m, "rejected"))
    prompt_raw = row.get(_col(m, "prompt"))
    if chosen_raw is None or rejected_raw is None:
        return None, "missing chosen or rejected"
    chosen_msgs, rejected_msgs = _messages(chosen_raw), _messages(rejected_raw)
    if chosen_msgs is not None and rejected_msgs is not None:
        prompt_msgs = _messages(prompt_raw) if prompt_raw is not None else []
        if prompt_msgs is None:
            text = _text(prompt_raw)
            if text is None:
                return None, "prompt is neither text nor messages"
            prompt_msgs = [{"role": "user", "content": text}]
        if not prompt_msgs:
            prompt_msgs, chosen_msgs, rejected_msgs = split_shared_prefix(chosen_msgs, rejected_msgs)
        if not prompt_msgs:
            return None, "no prompt (chosen and rejected share no turns and there is no prompt column)"
        if not chosen_msgs or not rejected_msgs:
            return None, "chosen and rejected are the same conversation"
        if system and prompt_msgs[0]["role"] != "system":
            prompt_msgs = [{"role": "system", "content": system}] + prompt_msgs
        return {"prompt": prompt_msgs, "chosen": chosen_msgs, "rejected": rejected_msgs}, None
    chosen, rejected, prompt = _text(chosen_raw), _text(rejected_raw), _text(prompt_raw)
    if chosen is None or rejected is None:
        return None, "chosen or rejected is empty or not text"
    if prompt is None:
        return None, "missing prompt"
    if chosen == rejected:
        return None, "chosen equals rejected"
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}, None


def _label(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        return True if word in _TRUE else False if word in _FALSE else None
    return None


def _completion(row: dict, m: dict | None, system: str) -> tuple[dict | None, str | None]:
    label = _label(row.get(_col(m, "label")))
    if label is None:
        return None, "label is not true/false"
    prompt_raw, completion_raw = row.get(_col(m, "prompt")), row.get(_col(m, "completion"))
    prompt_msgs, completion_msgs = _messages(prompt_raw), _messages(completion_raw)
    if prompt_msgs and completion_msgs:
        if system and prompt_msgs[0]["role"] != "system":
            prompt_msgs = [{"role": "system", "content": system}] + prompt_msgs
        return {"prompt": prompt_msgs, "completion": completion_msgs, "label": label}, None
    prompt, completion = _text(prompt_raw), _text(completion_raw)
    if prompt is None or completion is None:
        return None, "missing prompt or completion"
    return {"prompt": prompt, "completion": completion, "label": label}, None


def _prompt(row: dict, m: dict | None, system: str) -> tuple[dict | None, str | None]:
    prompt_col = _col(m, "prompt")
    rest = {k: v for k, v in row.items() if k not in (prompt_col, "messages", "prompt")}
    raw = row.get(prompt_col)
    if raw is None and "messages" in row:  # chat rows: everything before the last answer is the prompt
        msgs = _messages(row["messages"])
        if msgs is None:
            return None, "messages is not a list of turns"
        while msgs and msgs[-1]["role"] == "assistant":
            rest.setdefault("answer", msgs[-1]["content"])
            msgs = msgs[:-1]
        raw = msgs or None
    if raw is None:
        return None, "missing prompt"
    msgs = _prompt_messages(raw)
    if msgs is None and as_turn_list(raw) is not None:
        return None, UNREADABLE_TURNS
    if msgs is not None:
        if not msgs or msgs[-1]["role"] == "assistant":
            return None, "prompt is empty or ends with an assistant turn"
        if system and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": system}] + msgs
        return {"prompt": msgs, **rest}, None
    text = _text(raw)
    if text is None:
        return None, "prompt is empty or not text"
    return {"prompt": text, **rest}, None


_CONVERT = {"pairs": _pair, "kto": _completion, "prompts": _prompt}


def row_problem(row: dict, shape: str) -> str | None:
    """Why ``row`` is dropped from data of ``shape`` (pairs, kto or prompts), or None when it is usable."""
    return _CONVERT[shape](row, None, "")[1]


def detect_shape(rows: list[dict], mapping: dict | None = None) -> tuple[str, str]:
    """(shape, reason) for preference/RL rows: what the columns say, in a sentence the form can show."""
    columns = columns_of(rows)
    has = {key: _col(mapping, key) in columns for key in PAIR_KEYS + KTO_KEYS}
    if has["chosen"] and has["rejected"]:
        how = "with a prompt column" if has["prompt"] else "without a prompt column (the shared prefix is the prompt)"
        return "pairs", f"found chosen and rejected columns {how}"
    if has["completion"] and has["label"]:
        return "kto", "found prompt, completion and label columns"
    if has["prompt"] or "messages" in columns:
        return "prompts", "found a prompt column" if has["prompt"] else "found chat rows (messages)"
    raise DatasetError("format_type", f"could not tell the data's shape: the columns are {quoted(columns)}. "
                       + "; ".join(f"{shape}: {needs}" for shape, needs in SHAPES.items())
                       + ". Rename your columns, or map them with custom_format_mapping (e.g. {chosen: good}).")


def normalize(rows: list[dict], shape: str, mapping: dict | None = None, system_prompt: str = "",
              field_name: str = "local_datasets") -> NormalizedData:
    """Rows in TRL's shape for ``shape`` (pairs, kto or prompts). Pairs given to a KTO run are unpaired:
    each becomes a desirable and an undesirable completion of the same prompt."""
    unknown = [key for key in (mapping or {}) if key not in PAIR_KEYS + KTO_KEYS]
    if unknown:
        raise DatasetError("custom_format_mapping", f"unknown name {quoted(unknown)}: map one of "
                                                    f"{', '.join(dict.fromkeys(PAIR_KEYS + KTO_KEYS))} onto your columns")
    found, reason = detect_shape(rows, mapping)
    unpair = shape == "kto" and found == "pairs"
    if found != shape and not unpair and not (shape == "prompts" and found in ("pairs", "kto")):
        raise DatasetError("format_type", f"this method needs {SHAPES[shape]}, but the data has {reason}.")
    convert = _CONVERT["pairs" if unpair else shape]
    system = system_prompt.strip()
    out: list[dict] = []
    dropped: Counter[str] = Counter()
    for row in rows:
        value, problem = convert(row, mapping, system)
        if problem:
            dropped[problem] += 1
        elif unpair:
            out.append({"prompt": value["prompt"], "completion": value["chosen"], "label": True})
            out.append({"prompt": value["prompt"], "completion": value["rejected"], "label": False})
        else:
            out.append(value)
    kinds = Counter(isinstance(row["prompt"], list) for row in out)
    if len(kinds) > 1:  # TRL needs one kind per dataset; the majority wins, the rest are dropped and counted
        chat = kinds[True] >= kinds[False]
        dropped["mixes text and conversational rows"] += kinds[not chat]
        out = [row for row in out if isinstance(row["prompt"], list) == chat]
    if not out:
        raise no_usable_rows(field_name, len(rows), dict(dropped))
    why = reason + ("; each pair unpaired into a good and a bad completion" if unpair else "")
    return NormalizedData(format=shape, reason=why, rows=out, dropped=dict(dropped))


def is_conversational(rows: list[dict]) -> bool:
    return bool(rows) and isinstance(rows[0].get("prompt"), list)
