"""Data files for tests and benchmarks: rows written as JSONL, and invented jargon no model can know (the embedding
tests tune on it and measure retrieval of held-out phrasings)."""
from __future__ import annotations

import json
import random
from pathlib import Path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


MEANINGS = [
    "a valve that keeps bread dough warm overnight", "a tax paid on imported violins",
    "a knot used to tie canoes to docks", "a fever common among lighthouse keepers",
    "a ceramic tile that glows after sunset", "a dance performed at harvest weddings",
    "a lens that corrects colour blindness", "a pastry filled with salted plums", "a permit to fish in frozen lakes",
    "a broom made from coconut fibres", "a drum tuned by filling it with water", "a sled pulled by goats",
    "a rash caused by wool sweaters", "a clock that counts tides", "a ledger for counting sheep",
    "a hammer for breaking ice on roofs", "a scarf knitted from nettle fibre", "a poem recited at funerals of sailors",
    "a trap for catching river eels", "a mirror for signalling ships", "a soup made of roasted chestnuts",
    "a saddle designed for camels", "a whistle that calls homing pigeons", "a fence woven from willow",
    "a brush for cleaning chimney pots", "a lamp fuelled by fish oil", "a rope bridge over canyons",
    "a jar for fermenting cabbage", "a coin minted for temple offerings", "a helmet worn by beekeepers",
    "a basket for carrying peat", "a kite flown at spring festivals", "a spoon for tasting honey",
    "a blanket woven for newborn lambs", "a cart for hauling stones", "a flute carved from bone",
    "a net to catch falling apples", "a glove for handling nettles", "a pot for brewing pine tea",
    "a map of underground rivers",
]


def jargon() -> tuple[list[dict], list[dict]]:
    """Three training questions per invented word (the source columns a user's file would have) and one held-out
    phrasing each, all answered by the word's passage."""
    rng = random.Random(0)
    syllables = ["zor", "blik", "quan", "trel", "vox", "mip", "drax", "fen", "lum", "skor", "pel", "yth", "gran",
                 "wub", "taz", "nor"]
    words: set[str] = set()
    while len(words) < len(MEANINGS):
        words.add("".join(rng.sample(syllables, 3)))
    train, held_out = [], []
    for word, meaning in zip(sorted(words), MEANINGS):
        passage = meaning[0].upper() + meaning[1:] + "."
        # the source columns a user's file would have; the loader's shape_rows maps them
        train += [{"question": f"What is a {word}?", "passage": passage}, {"question": f"define {word}", "passage": passage},
                  {"question": f"{word} meaning", "passage": passage}]
        held_out.append({"question": f"Can you explain what {word} refers to?", "passage": passage})
    return train, held_out
