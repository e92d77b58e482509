"""Every starter recipe previewed with the deterministic teacher (tests/support/fake_teacher.py), through the same
path as the Data page's Preview (a sandboxed child, Data Designer in its venv): each makes the training rows its
docs promise, and its checks set aside what they should, with the reason."""
from __future__ import annotations

import json

import pytest

from tests.support.fake_teacher import FakeTeacher, fact_files
from trainer_core.recipes import launch, starters
from trainer_core.recipes.rows import PROVENANCE

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                                                "required": ["city"]}}}


@pytest.fixture
def teacher(monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")
    with FakeTeacher() as fake:
        yield fake


def preview(studio, teacher, name: str, rows: int = 3, **fields) -> dict:
    models = [{"alias": m["alias"], "url": teacher.url, "model": m["alias"]}
              for m in starters.spec_fields(name).get("models") or [{"alias": "teacher"}]]
    spec = launch.from_fields({**starters.spec_fields(name), "models": models, **fields})
    return launch.preview(studio, spec, rows=rows)


def test_every_starter_is_offered_and_valid():
    assert starters.names() == ["docs-qa", "instruction-from-answer", "preference-pairs", "text-to-sql", "tool-calls"]
    for name in starters.names():
        assert starters.get(name).label and starters.get(name).description


def test_instruction_from_answer(studio, teacher, tmp_path):
    fact_files(tmp_path / "docs", 3)
    result = preview(studio, teacher, "instruction-from-answer", documents=str(tmp_path / "docs"))
    rows = [shown["row"] for shown in result["rows"]]
    assert [r["messages"][1]["content"] for r in rows] == [
        "The capital of Zorbia is Quellport.", "The river of Quillon is Westerhay.",
        "The festival of Maravel is Copperline."]
    assert rows[0]["messages"][0]["content"].startswith("answer from teacher: ")
    assert rows[0][PROVENANCE] == {"source": "fact-000.md", "page": None, "chunk": 0}


def test_preference_pairs_set_aside_a_pair_with_one_answer(studio, teacher, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("Name a colour.", "Name a fruit.")))
    result = preview(studio, teacher, "preference-pairs", rows=2, seed_dataset=str(prompts))
    assert [s["row"] for s in result["rows"]] == [
        {"prompt": "Name a colour.", "chosen": "answer from teacher: colour. a Name",
         "rejected": "answer from base: colour. a Name"},
        {"prompt": "Name a fruit.", "chosen": "answer from teacher: fruit. a Name",
         "rejected": "answer from base: fruit. a Name"}]
    same = [{"alias": "teacher", "url": teacher.url, "model": "teacher"},
            {"alias": "base", "url": teacher.url, "model": "teacher"}]  # one model twice: every pair is one answer
    result = preview(studio, teacher, "preference-pairs", rows=2, seed_dataset=str(prompts), models=same)
    assert [s["reason"] for s in result["rows"]] == ["pair: the chosen and rejected answers are the same"] * 2


def test_text_to_sql_keeps_only_queries_that_run(studio, teacher):
    result = preview(studio, teacher, "text-to-sql", rows=2)
    assert [s["row"]["messages"][1]["content"] for s in result["rows"]] == [
        "SELECT city, COUNT(*) FROM customers GROUP BY city"] * 2
    broken = starters.spec_fields("text-to-sql")
    broken["validators"][0]["schema_sql"] = "CREATE TABLE towns (id INTEGER);"  # no customers table to query
    result = preview(studio, teacher, "text-to-sql", rows=1, validators=broken["validators"])
    (shown,) = result["rows"]
    assert shown["row"] is None and shown["reason"].startswith("sql on pair.sql: ") and "customers" in shown["reason"]


def test_tool_calls_are_checked_against_the_tools_schema(studio, teacher, tmp_path):
    tools = tmp_path / "tools.jsonl"
    tools.write_text(json.dumps({"tool": WEATHER}) + "\n")
    result = preview(studio, teacher, "tool-calls", rows=1, seed_dataset=str(tools))
    (shown,) = result["rows"]
    assert shown["reason"] is None, shown
    row = shown["row"]
    assert row["tools"] == [WEATHER]
    call = row["messages"][1]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "city text", "unit": "C"}


JUDGE = {"name": "grounded", "column_type": "llm-judge", "model_alias": "teacher",
         "prompt": "Passage: {{ text }}\nQuestion: {{ qa.question }}\nAnswer: {{ qa.answer }}\nIs the answer supported?",
         "scores": [{"name": "support", "description": "How well the passage supports the answer",
                     "options": {"4": "fully", "2": "partly", "1": "not at all"}}]}


def test_a_judge_column_scores_each_row_and_judge_min_sets_low_ones_aside(studio, teacher, tmp_path):
    fact_files(tmp_path / "docs", 2)
    fields = starters.spec_fields("docs-qa")
    recipe = {"columns": fields["recipe"]["columns"] + [JUDGE]}
    result = preview(studio, teacher, "docs-qa", rows=2, documents=str(tmp_path / "docs"), recipe=recipe)
    assert [s["scores"] for s in result["rows"]] == [{"grounded.support": 4.0}] * 2
    assert [s["row"][PROVENANCE]["scores"] for s in result["rows"]] == [{"grounded.support": 4.0}] * 2
    result = preview(studio, teacher, "docs-qa", rows=2, documents=str(tmp_path / "docs"), recipe=recipe,
                     judge_min=5.0)
    assert [s["reason"] for s in result["rows"]] == ["judge: grounded.support scored 4.0 (< judge_min 5)"] * 2


def test_a_hub_dataset_seeds_the_records(home, monkeypatch, tmp_path):
    """seed_hub_dataset is read with Hugging Face datasets in the worker (played here by a stand-in module: no hub
    here); nested values become JSON text; a dataset that cannot be read is named with the split."""
    import sys
    import types

    from trainer_core.recipes import checking

    asked = []

    def load_dataset(name, split):
        asked.append((name, split))
        if name == "org/missing":
            raise FileNotFoundError("Couldn't find a dataset script")
        return [{"prompt": "Name a colour.", "meta": {"lang": "en"}}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    spec = launch.from_fields({**starters.spec_fields("preference-pairs"), "seed_hub_dataset": "org/prompts",
                               "seed_hub_split": "train[:10]"})
    assert [e.field for e in spec.validate() if e.field.startswith("seed")] == []
    seeds = checking.prepare_seeds(spec, tmp_path, print)
    assert asked == [("org/prompts", "train[:10]")]
    assert [json.loads(line) for line in seeds.read_text().splitlines()] == [
        {"prompt": "Name a colour.", "meta": '{"lang": "en"}'}]
    missing = launch.from_fields({**starters.spec_fields("preference-pairs"), "seed_hub_dataset": "org/missing"})
    with pytest.raises(checking.RecipeError, match=r"^seed_hub_dataset: org/missing \(train\) cannot be read: "
                                                   r"FileNotFoundError: Couldn't find a dataset script$"):
        checking.prepare_seeds(missing, tmp_path / "other", print)
    both = launch.from_fields({**starters.spec_fields("preference-pairs"), "seed_hub_dataset": "a b",
                               "seed_dataset": str(tmp_path)})
    assert {e.field: e.message for e in both.validate()}["seed_hub_dataset"] == "a hub dataset id such as org/name"
