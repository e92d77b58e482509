"""Tool rows checked against their own tools: a call naming a tool the row does not list, arguments that do not
fit the tool's JSON Schema, and a schema that is not JSON Schema at all. The preview shows these per row; training
still runs (a dataset may mean to teach refusals), so they are flags, not errors."""
from __future__ import annotations

import jsonschema
from jsonschema.exceptions import SchemaError

from trainer_core.data.tool_calls import ToolFormatError, normalize_tools, row_calls

SCHEMA_FIX = 'fix it to a JSON Schema object, e.g. {"type": "object", "properties": {"city": {"type": "string"}}}'


def _where(path) -> str:
    return "/".join(str(p) for p in path) or "the top level"


def schema_problem(tool: dict) -> str | None:
    """Why a tool's ``parameters`` are not a usable JSON Schema, naming the field and the fix; None when fine."""
    name = tool["function"]["name"]
    parameters = tool["function"].get("parameters")
    if not isinstance(parameters, dict):
        return f"tools: '{name}'.parameters must be a JSON Schema object; {SCHEMA_FIX}"
    try:
        jsonschema.validators.validator_for(parameters, default=jsonschema.Draft202012Validator).check_schema(parameters)
    except SchemaError as exc:
        return (f"tools: '{name}'.parameters is not valid JSON Schema ({exc.message} at "
                f"{_where(exc.absolute_path)}); {SCHEMA_FIX}")
    return None


def row_problems(row: dict) -> list[str]:
    """Every problem of one normal-form tool row, in order: bad schemas first, then each call."""
    try:
        tools = normalize_tools(row.get("tools"))
    except ToolFormatError as exc:
        return [f"tools: {exc}"]
    problems, schemas = [], {}
    for tool in tools:
        problem = schema_problem(tool)
        if problem:
            problems.append(problem)
        else:
            schemas[tool["function"]["name"]] = tool["function"].get("parameters", {})
    listed = [tool["function"]["name"] for tool in tools]
    for name, arguments in row_calls(row):
        if name not in listed:
            offered = ", ".join(listed) if listed else "none"
            problems.append(f"calls '{name}', which is not among the row's tools ({offered}): add the tool to the "
                            "row's tools or correct the call's name")
        elif name in schemas:
            error = jsonschema.validators.validator_for(schemas[name], default=jsonschema.Draft202012Validator)(
                schemas[name]).iter_errors(arguments)
            first = min(error, key=lambda e: list(e.absolute_path), default=None)
            if first is not None:
                problems.append(f"the arguments of '{name}' do not fit its schema: {first.message} at "
                                f"{_where(first.absolute_path)}")
    return problems
