"""A small evaluator of Go's text/template, for the Ollama TEMPLATEs the export writes (no Go toolchain here).

Written from Go's documentation (text/template), independently of the code that writes the templates: text and
``{{ actions }}`` with trim markers; ``if`` / ``else if`` / ``else`` / ``with`` / ``range`` (over a list, with
``$i, $x :=``) / ``end``; variables declared with ``:=`` (scoped to their block) and assigned with ``=``; fields
(``.A.B``, ``$.A``, ``$x.A``; a missing key is empty, as Ollama's ``missingkey=zero``); string and integer
literals; parentheses; and the functions ``eq ne and or not len slice index``. Go's truth: false, 0, nil and
empty strings and lists are false. ``and``/``or`` stop at the first argument that decides, as Go 1.18+ does.

A value that Go prints through its ``String()`` method (Ollama's ``api.Tool``, a call's arguments) is a
``Printed``: it prints as its ``text``. ``ollama_render`` plays Ollama: a Modelfile's TEMPLATE and SYSTEM on a
conversation in OpenAI's form, with tools.

``parse`` returns the tree (lists of nodes), so a test can also walk it as Ollama does to find the tag that starts
a tool call (``tool_call_tag``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

ACTION = re.compile(r"\{\{(-\s)?\s*(.*?)\s*(\s-)?\}\}", re.S)
TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<int>-?\d+)|(?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_]\w*)*)'
                   r'|(?P<field>(?:\.[A-Za-z_]\w*)+|\.)|(?P<open>\()|(?P<close>\))|(?P<ident>[A-Za-z_]\w*))')


@dataclass(frozen=True)
class Printed:
    value: Any
    text: str

    def __str__(self) -> str:
        return self.text


# ---------------------------------------------------------------- parsing
def _lex(template: str) -> list[tuple[str, str]]:
    items, pos = [], 0
    for match in ACTION.finditer(template):
        text = template[pos:match.start()]
        if match.group(1):
            text = text.rstrip(" \t\r\n")
        items.append(("text", text))
        items.append(("action", match.group(2)))
        pos = match.end()
        if match.group(3):
            rest = template[pos:]
            pos += len(rest) - len(rest.lstrip(" \t\r\n"))
    items.append(("text", template[pos:]))
    return [item for item in items if item != ("text", "")]


def _pipe(text: str) -> tuple:
    """A pipeline (one command, as these templates write them): ("call", name, args) or an operand."""
    tokens = [(m.lastgroup, m.group(m.lastgroup)) for m in TOKEN.finditer(text)]
    assert "".join(v for _, v in tokens).replace(" ", "") == text.replace(" ", ""), f"cannot read {text!r}"
    node, rest = _command(tokens, 0)
    assert rest == len(tokens), f"unsupported pipeline {text!r}"
    return node


def _command(tokens, i):
    args = []
    while i < len(tokens) and tokens[i][0] != "close":
        arg, i = _operand(tokens, i)
        args.append(arg)
    if args and args[0][0] == "ident":
        return ("call", args[0][1], args[1:]), i
    assert len(args) == 1, f"not a command: {args}"
    return args[0], i


def _operand(tokens, i):
    kind, value = tokens[i]
    if kind == "open":
        node, i = _command(tokens, i + 1)
        assert tokens[i][0] == "close"
        return node, i + 1
    if kind == "str":
        return ("lit", bytes(value[1:-1], "utf-8").decode("unicode_escape")), i + 1
    if kind == "int":
        return ("lit", int(value)), i + 1
    if kind == "field":
        return ("field", [p for p in value.split(".") if p]), i + 1
    if kind == "var":
        name, *chain = value.split(".")
        return ("var", name, chain), i + 1
    return ("ident", value), i + 1


def parse(template: str) -> list:
    nodes, i, end = _block(_lex(template), 0)
    assert end is None, f"unbalanced template: {end}"
    return nodes


def _block(items, i):
    nodes = []
    while i < len(items):
        kind, value = items[i]
        i += 1
        if kind == "text":
            nodes.append(("text", value))
        elif value == "end" or value == "else" or value.startswith("else "):
            return nodes, i, value
        elif value.startswith(("if ", "with ")):
            word, cond = value.split(" ", 1)
            branches = []
            while True:
                body, i, end = _block(items, i)
                branches.append((_pipe(cond) if cond is not None else None, body))
                if end == "end":
                    break
                cond = end[len("else if "):] if end.startswith("else if ") else None
            nodes.append((word, branches))
        elif value.startswith("range "):
            match = re.fullmatch(r"range (?:(\$\w*)(?:, (\$\w*))? := )?(.*)", value)
            body, i, end = _block(items, i)
            assert end == "end", "range ... else is not used here"
            first, second, pipe = match.groups()
            index, element = (first, second) if second else (None, first)
            nodes.append(("range", index, element, _pipe(pipe), body))
        elif re.match(r"\$\w* :?= ", value):
            name, op, pipe = re.fullmatch(r"(\$\w*) (:?=) (.*)", value, re.S).groups()
            nodes.append(("declare" if op == ":=" else "assign", name, _pipe(pipe)))
        else:
            nodes.append(("print", _pipe(value)))
    return nodes, i, None


# ---------------------------------------------------------------- evaluation
def truth(value: Any) -> bool:
    if isinstance(value, Printed):
        return truth(value.value)
    return bool(value)  # False, 0, None, "" and empty lists and dicts are false in Go's templates too


def _get(value: Any, chain: list[str]) -> Any:
    for name in chain:
        value = value.get(name) if isinstance(value, dict) else None
    return value


def _printed(value: Any) -> str:
    return "" if value is None else str(value)


class _Scope:
    def __init__(self, root: Any):
        self.frames: list[dict[str, Any]] = [{"$": root}]

    def lookup(self, name: str) -> Any:
        for frame in reversed(self.frames):
            if name in frame:
                return frame[name]
        raise AssertionError(f"undefined variable {name}")

    def assign(self, name: str, value: Any) -> None:
        for frame in reversed(self.frames):
            if name in frame:
                frame[name] = value
                return
        raise AssertionError(f"assignment to undeclared {name}")


def _eval(node, dot, scope: _Scope) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "field":
        return _get(dot, node[1])
    if kind == "var":
        return _get(scope.lookup(node[1]), node[2])
    assert kind == "call", node
    name, args = node[1], node[2]
    if name in ("and", "or"):
        value = None
        for arg in args:
            value = _eval(arg, dot, scope)
            if truth(value) != (name == "and"):
                return value
        return value
    values = [_eval(arg, dot, scope) for arg in args]
    values = [v.value if isinstance(v, Printed) and name != "index" else v for v in values]
    if name in ("eq", "ne"):
        same = any(values[0] == other for other in values[1:])
        return same if name == "eq" else not same
    if name == "not":
        return not truth(values[0])
    if name == "len":
        return len(values[0] or [])
    if name == "slice":
        return values[0][values[1]:values[2]] if len(values) > 2 else values[0][values[1]:]
    if name == "index":
        return values[0][values[1]]
    raise AssertionError(f"unsupported function {name}")


def _run(nodes, dot, scope: _Scope, out: list[str]) -> None:
    for node in nodes:
        kind = node[0]
        if kind == "text":
            out.append(node[1])
        elif kind == "print":
            out.append(_printed(_eval(node[1], dot, scope)))
        elif kind == "declare":
            scope.frames[-1][node[1]] = _eval(node[2], dot, scope)
        elif kind == "assign":
            scope.assign(node[1], _eval(node[2], dot, scope))
        elif kind in ("if", "with"):
            for cond, body in node[1]:
                value = True if cond is None else _eval(cond, dot, scope)
                if truth(value):
                    scope.frames.append({})
                    _run(body, value if kind == "with" and cond is not None else dot, scope, out)
                    scope.frames.pop()
                    break
        else:  # range
            _, index, element, pipe, body = node
            for i, item in enumerate(_eval(pipe, dot, scope) or []):
                scope.frames.append({**({index: i} if index else {}), **({element: item} if element else {})})
                _run(body, item, scope, out)
                scope.frames.pop()


def render(template: str, data: dict) -> str:
    out: list[str] = []
    _run(parse(template), data, _Scope(data), out)
    return "".join(out)


def tool_call_tag(template: str) -> str:
    """The text Ollama takes for the start of a tool call: the first text inside the first ``if`` whose condition
    names ``.ToolCalls`` (searching ifs, ranges and withs in order), trimmed, up to its first ``{``."""
    def find_if(nodes):
        for node in nodes:
            if node[0] == "if":
                for cond, body in node[1]:
                    if cond is not None and _names_tool_calls(cond):
                        return body
                for _, body in node[1]:
                    found = find_if(body)
                    if found is not None:
                        return found
            elif node[0] in ("range", "with"):
                bodies = [node[4]] if node[0] == "range" else [b for _, b in node[1]]
                for body in bodies:
                    found = find_if(body)
                    if found is not None:
                        return found
        return None

    def first_text(nodes):
        for node in nodes:
            if node[0] == "text":
                return node[1]
            if node[0] in ("print", "declare", "assign"):
                return None
            if node[0] == "range":
                return first_text(node[4])
            if node[0] in ("if", "with"):
                return first_text(node[1][0][1])
        return None

    body = find_if(parse(template))
    text = first_text(body) if body is not None else None
    return (text or "").strip().split("{")[0]


def _names_tool_calls(cond) -> bool:
    """A condition whose own arguments include the field .ToolCalls (nested parentheses do not count, as in Ollama)."""
    if cond[0] == "field":
        return "ToolCalls" in cond[1]
    return cond[0] == "call" and any(a[0] == "field" and "ToolCalls" in a[1] for a in cond[2])


# ---------------------------------------------------------------- Ollama's side
def ollama_values(messages: list[dict], tools: list[dict]) -> dict:
    """What Ollama hands its template: .Messages (Role, Content, ToolCalls with Function.Name and Function.Arguments)
    and .Tools. An api.Tool and a call's arguments print through their String() methods, as JSON: printed here as
    transformers' tojson writes it (Ollama's Go encoder writes it without spaces, the one difference)."""
    shown = [{"Role": m["role"], "Content": m.get("content") or "",
              "ToolCalls": [{"Function": {"Name": c["function"]["name"],
                                          "Arguments": Printed(c["function"]["arguments"],
                                                               json.dumps(c["function"]["arguments"]))}}
                            for c in m.get("tool_calls") or []]} for m in messages]
    return {"Messages": shown, "Tools": [Printed(t, json.dumps(t)) for t in tools]}


def ollama_render(modelfile: str, messages: list[dict], tools: list[dict]) -> str:
    """What Ollama sends the model: the Modelfile's SYSTEM joins a conversation that has no system message."""
    template = re.search(r'^TEMPLATE """(.*?)"""$', modelfile, re.S | re.M).group(1)
    system = re.search(r'^SYSTEM """(.*?)"""$', modelfile, re.S | re.M)
    if system is not None and not any(m["role"] == "system" for m in messages):
        messages = [{"role": "system", "content": system.group(1)}, *messages]
    return render(template, ollama_values(messages, tools))
