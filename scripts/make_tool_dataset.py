"""Write the bundled tool-calling demo: ``trainer_core/data/demo_tools.jsonl`` (training) and
``demo_tools_eval.jsonl`` (held out), OpenAI fine-tuning rows with a ``tools`` list each.

Three tools (weather, a calculator, unit conversion). Each row lists the tool it needs and one other, in
shuffled order (tools differ between rows, as in real data); about one row in ten needs no tool and is answered in
words. A third of the calling rows go on to the tool's result and the assistant's answer. The held-out rows use
other cities and other numbers than training, so a model that scores there learned to fill arguments in, not to
recall them. The output is deterministic (fixed seeds, no clock).

    python scripts/make_tool_dataset.py
"""
from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "trainer_core" / "data" / "demo_tools.jsonl"
EVAL_OUT = OUT.with_name("demo_tools_eval.jsonl")
TRAIN_ROWS, EVAL_ROWS = 400, 40

TOOLS = {
    "get_weather": {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    "calculate": {"type": "function", "function": {
        "name": "calculate", "description": "Arithmetic on two numbers.",
        "parameters": {"type": "object", "properties": {
            "operation": {"type": "string", "enum": ["add", "subtract", "multiply", "divide"]},
            "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["operation", "a", "b"]}}},
    "convert_units": {"type": "function", "function": {
        "name": "convert_units", "description": "Convert a value between units.",
        "parameters": {"type": "object", "properties": {
            "value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": {"type": "string"}},
            "required": ["value", "from_unit", "to_unit"]}}},
}
TRAIN_CITIES = ["Paris", "Berlin", "Madrid", "Lisbon", "Vienna", "Prague", "Dublin", "Athens", "Warsaw", "Budapest",
                "Helsinki", "Brussels", "Amsterdam", "Copenhagen", "Stockholm", "Zurich", "Milan", "Munich", "Lyon",
                "Porto", "Seville", "Krakow", "Geneva", "Hamburg"]
EVAL_CITIES = ["Oslo", "Rome", "Tokyo", "Cairo", "Lima", "Seoul", "Nairobi", "Denver", "Toronto", "Sydney"]
TRAIN_NUMBERS = range(2, 50)
EVAL_NUMBERS = range(51, 100)
OPERATIONS = {"add": ("Add {a} and {b}.", "What is {a} plus {b}?"),
              "subtract": ("What is {a} minus {b}?", "Subtract {b} from {a}."),
              "multiply": ("What is {a} times {b}?", "Multiply {a} by {b}."),
              "divide": ("Divide {a} by {b}.", "What is {a} divided by {b}?")}
CONVERSIONS = (("km", "miles", "Convert {v} km to miles."), ("miles", "km", "How many km is {v} miles?"),
               ("kg", "pounds", "How many pounds is {v} kg?"), ("pounds", "kg", "Convert {v} pounds to kg."))
SMALL_TALK = (("Hi there!", "Hello! Ask me about the weather, a calculation or a unit conversion."),
              ("Thanks a lot!", "You are welcome!"), ("Who are you?", "I am an assistant that can use tools."),
              ("Tell me a joke.", "Why did the function return early? It had no arguments left."))


def _weather(rng: random.Random, cities) -> tuple[str, str, dict, str]:
    city = rng.choice(cities)
    if rng.random() < 0.3:
        return (f"Weather for {city} in fahrenheit, please.", "get_weather", {"city": city, "unit": "fahrenheit"},
                f"It is 64°F and sunny in {city}.")
    question = rng.choice(("What's the weather in {c}?", "Is it raining in {c} right now?", "How warm is it in {c}?"))
    return question.format(c=city), "get_weather", {"city": city}, f"It is 18°C and cloudy in {city}."


def _calculate(rng: random.Random, numbers) -> tuple[str, str, dict, str]:
    operation = rng.choice(list(OPERATIONS))
    a, b = rng.choice(numbers), rng.choice(numbers)
    question = rng.choice(OPERATIONS[operation]).format(a=a, b=b)
    return question, "calculate", {"operation": operation, "a": a, "b": b}, "Here is the result."


def _convert(rng: random.Random, numbers) -> tuple[str, str, dict, str]:
    source, target, question = rng.choice(CONVERSIONS)
    value = rng.choice(numbers)
    return (question.format(v=value), "convert_units", {"value": value, "from_unit": source, "to_unit": target},
            f"That is about the value in {target}.")


def _row(rng: random.Random, index: int, cities, numbers) -> dict:
    if rng.random() < 0.1:
        question, answer = rng.choice(SMALL_TALK)
        names = rng.sample(list(TOOLS), 2)
        return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
                "tools": [TOOLS[n] for n in names]}
    make = rng.choice((_weather, _calculate, _convert))
    question, name, arguments, final = (make(rng, cities) if make is _weather else make(rng, list(numbers)))
    others = [n for n in TOOLS if n != name]
    names = [name, rng.choice(others)]  # two tools a row: short prompts keep the CPU demo at ~5 minutes
    rng.shuffle(names)
    call_id = f"call_{index}"
    messages = [{"role": "user", "content": question},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function",
                     "function": {"name": name, "arguments": json.dumps(arguments)}}]}]
    if rng.random() < 1 / 3:
        messages += [{"role": "tool", "tool_call_id": call_id, "content": json.dumps({"ok": True})},
                     {"role": "assistant", "content": final}]
    return {"messages": messages, "tools": [TOOLS[n] for n in names]}


def rows(count: int, seed: int, cities, numbers) -> list[dict]:
    rng = random.Random(seed)
    return [_row(rng, i, cities, numbers) for i in range(count)]


def main() -> None:
    for path, made in ((OUT, rows(TRAIN_ROWS, 32, TRAIN_CITIES, TRAIN_NUMBERS)),
                       (EVAL_OUT, rows(EVAL_ROWS, 3232, EVAL_CITIES, EVAL_NUMBERS))):
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in made))
        print(f"wrote {len(made)} rows to {path}")


if __name__ == "__main__":
    main()
