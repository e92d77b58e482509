"""Write the bundled demo datasets, ``trainer_core/data/demo_chat.jsonl`` and ``demo_pairs.jsonl``.

About 300 short chatml conversations from "Studio", a friendly assistant that always answers in one
fixed pattern ("Studio here! <fact>. Happy to help!"). The pattern is what makes the demo useful: a
LoRA on SmolLM2-135M-Instruct picks it up within ~60 steps, so the loss curve falls visibly.
The pairs file holds the same questions as preference pairs for DPO, ORPO, SimPO, KTO and reward models:
the house-style reply is chosen, the bare fact rejected, so a preference run teaches the pattern too.
The output is deterministic (fixed seed, no clock), so re-running it gives the same bytes.

    python scripts/make_demo_dataset.py
"""
from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "trainer_core" / "data" / "demo_chat.jsonl"
PAIRS_OUT = OUT.with_name("demo_pairs.jsonl")
SEED = 20240611
SYSTEM = "You are Studio, a friendly assistant who answers in one short sentence."
SYSTEM_SHARE = 0.3  # some conversations carry a system turn, so both shapes appear in training

NUMBER_WORDS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve",
]

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi",
    "Canada": "Ottawa", "Australia": "Canberra", "Brazil": "Brasilia", "Argentina": "Buenos Aires",
    "Mexico": "Mexico City", "Egypt": "Cairo", "Kenya": "Nairobi", "Nigeria": "Abuja",
    "Russia": "Moscow", "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki",
    "Denmark": "Copenhagen", "Poland": "Warsaw", "Greece": "Athens", "Turkey": "Ankara",
    "Ireland": "Dublin", "Belgium": "Brussels", "Austria": "Vienna", "Hungary": "Budapest",
    "Peru": "Lima", "Chile": "Santiago", "Colombia": "Bogota", "South Korea": "Seoul",
    "Thailand": "Bangkok", "Vietnam": "Hanoi", "the Philippines": "Manila",
    "New Zealand": "Wellington", "Morocco": "Rabat", "Ghana": "Accra", "Ethiopia": "Addis Ababa",
    "Iceland": "Reykjavik", "Cuba": "Havana", "the United Kingdom": "London",
    "Czechia": "Prague", "Ukraine": "Kyiv", "Romania": "Bucharest",
}

COLOURS = {
    ("blue", "yellow"): "green",
    ("red", "yellow"): "orange",
    ("red", "blue"): "purple",
    ("red", "white"): "pink",
    ("black", "white"): "grey",
    ("blue", "white"): "light blue",
}

OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "up": "down", "day": "night", "happy": "sad",
    "open": "closed", "early": "late", "light": "dark", "laugh": "cry", "full": "empty",
    "loud": "quiet", "wet": "dry", "hard": "soft", "high": "low", "tall": "short", "rich": "poor",
    "strong": "weak", "thick": "thin", "inside": "outside", "left": "right", "first": "last",
    "win": "lose", "push": "pull", "buy": "sell", "arrive": "leave", "begin": "end",
    "remember": "forget", "always": "never", "above": "below", "near": "far", "heavy": "light",
    "clean": "dirty", "north": "south", "east": "west", "true": "false", "asleep": "awake",
    "question": "answer", "noisy": "quiet", "friend": "enemy",
}

PLURALS = {
    "cat": "cats", "dog": "dogs", "book": "books", "tree": "trees", "box": "boxes",
    "bus": "buses", "dish": "dishes", "church": "churches", "city": "cities", "baby": "babies",
    "leaf": "leaves", "knife": "knives", "wolf": "wolves", "mouse": "mice", "goose": "geese",
    "man": "men", "woman": "women", "child": "children", "tooth": "teeth", "foot": "feet",
    "person": "people", "sheep": "sheep", "fish": "fish", "deer": "deer", "ox": "oxen",
    "cactus": "cacti", "potato": "potatoes", "tomato": "tomatoes", "hero": "heroes",
    "photo": "photos", "piano": "pianos", "key": "keys", "toy": "toys", "day": "days",
    "party": "parties", "story": "stories", "glass": "glasses", "watch": "watches",
    "fox": "foxes", "life": "lives", "wife": "wives", "bush": "bushes", "lady": "ladies",
    "half": "halves",
}

UNITS = [  # (from unit plural, from unit singular, to unit plural, factor)
    ("metres", "metre", "centimetres", 100),
    ("kilometres", "kilometre", "metres", 1000),
    ("kilograms", "kilogram", "grams", 1000),
    ("litres", "litre", "millilitres", 1000),
    ("hours", "hour", "minutes", 60),
    ("minutes", "minute", "seconds", 60),
    ("days", "day", "hours", 24),
    ("weeks", "week", "days", 7),
    ("feet", "foot", "inches", 12),
    ("years", "year", "months", 12),
]

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
]

INTRODUCTIONS = [
    ("Who are you?", "I am Studio, a friendly assistant for short questions"),
    ("What is your name?", "My name is Studio"),
    ("Hello!", "Hello to you too, ask me anything short"),
    ("Hi there!", "Hi there, ask me anything short"),
    ("Good morning!", "Good morning to you too"),
    ("Thank you!", "You are very welcome"),
    ("Thanks a lot!", "You are very welcome"),
    ("Can you help me?", "Of course, ask me a short question"),
    ("What can you do?", "I answer short questions about sums, units, capitals, colours and words"),
    ("Goodbye!", "Goodbye and have a lovely day"),
]


def answer(fact: str) -> str:
    """The house style: every reply is this one sentence pattern."""
    return f"Studio here! {fact}. Happy to help!"


def arithmetic(rng: random.Random) -> list[tuple[str, str]]:
    pairs: dict[str, str] = {}
    while len(pairs) < 30:
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        pairs[f"What is {a} plus {b}?"] = answer(f"{a} plus {b} is {a + b}")
    while len(pairs) < 55:
        a, b = rng.randint(5, 40), rng.randint(1, 20)
        a, b = max(a, b), min(a, b)
        pairs[f"What is {a} minus {b}?"] = answer(f"{a} minus {b} is {a - b}")
    while len(pairs) < 80:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        pairs[f"What is {a} times {b}?"] = answer(f"{a} times {b} is {a * b}")
    return list(pairs.items())


def units(rng: random.Random) -> list[tuple[str, str]]:
    pairs: dict[str, str] = {}
    while len(pairs) < 50:
        plural, singular, target, factor = rng.choice(UNITS)
        n = rng.randint(1, 12)
        unit = singular if n == 1 else plural
        question = f"How many {target} are in {NUMBER_WORDS[n] if n <= 3 else n} {unit}?"
        pairs[question] = answer(f"{n} {unit} is {n * factor} {target}")
    return list(pairs.items())


def facts() -> list[tuple[str, str]]:
    pairs = [(f"What is the capital of {country}?", answer(f"The capital of {country} is {city}"))
             for country, city in CAPITALS.items()]
    for (a, b), mix in COLOURS.items():
        pairs.append((f"What colour do you get when you mix {a} and {b}?", answer(f"Mixing {a} and {b} makes {mix}")))
        pairs.append((f"What colour do you get when you mix {b} and {a}?", answer(f"Mixing {b} and {a} makes {mix}")))
    pairs += [(f"What is the opposite of {word}?", answer(f"The opposite of {word} is {other}"))
              for word, other in OPPOSITES.items()]
    pairs += [(f"What is the plural of {word}?", answer(f"The plural of {word} is {plural}"))
              for word, plural in PLURALS.items()]
    pairs += [(f"What day comes after {day}?", answer(f"The day after {day} is {DAYS[(i + 1) % 7]}"))
              for i, day in enumerate(DAYS)]
    pairs += [(f"What month comes after {month}?", answer(f"The month after {month} is {MONTHS[(i + 1) % 12]}"))
              for i, month in enumerate(MONTHS)]
    pairs += [(question, answer(fact)) for question, fact in INTRODUCTIONS]
    return pairs


def build() -> list[dict]:
    rng = random.Random(SEED)
    pairs = arithmetic(rng) + units(rng) + facts()
    rng.shuffle(pairs)
    rows = []
    for question, reply in pairs:
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        if rng.random() < SYSTEM_SHARE:
            messages.insert(0, {"role": "system", "content": SYSTEM})
        rows.append({"messages": messages})
    return rows


def build_pairs() -> list[dict]:
    """Each conversation's question as a pair: the house-style reply chosen, the bare fact rejected."""
    rows = []
    for row in build():
        question, reply = row["messages"][-2]["content"], row["messages"][-1]["content"]
        fact = reply.removeprefix("Studio here! ").removesuffix(" Happy to help!")
        rows.append({"prompt": question, "chosen": reply, "rejected": fact})
    return rows


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows to {path}")


def main() -> None:
    write(OUT, build())
    write(PAIRS_OUT, build_pairs())


if __name__ == "__main__":
    main()
