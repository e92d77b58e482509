"""The documentation stays true to the code: links resolve, CLI subcommands exist, every YAML example is a
valid run config, every registered method is documented, and the generated config reference is current."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

from trainer_core.config import TrainConfig, load_yaml
from trainer_core.data import loading
from trainer_core.methods import METHODS
from trainer_core.rewards.builtin import PARAMS
from trainer_core.sweeps import checks as sweep_checks

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
README_MAX_LINES = 160

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CLI = re.compile(r"python -m trainer_core((?:\s+[a-z][\w-]*)+)")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are examples, not links)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").replace("*", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, numbered as GitHub numbers repeated ones (-1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        out.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return out


def test_github_slugs_follow_githubs_rules():
    assert github_slug("Queue, resume and restarts") == "queue-resume-and-restarts"
    assert github_slug("Section `dpo:`") == "section-dpo"
    assert github_slug("GPU smoke check (`bench/gpu_smoke.py`)") == "gpu-smoke-check-benchgpu_smokepy"
    assert github_slug("sft — supervised fine-tuning") == "sft--supervised-fine-tuning"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        file = (page.parent / path_part).resolve() if path_part else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with anchor #{anchor} in {_rel(file)}")
    assert broken == [], f"{_rel(page)} has broken links:\n" + "\n".join(broken)


@pytest.fixture(scope="module")
def cli_commands() -> dict[str, list[str]]:
    """{subcommand: its own subcommands} of `python -m trainer_core`, read from the real parser in a child
    process, which also proves that building the parser imports no ML library."""
    code = r"""
import argparse, json, sys
captured = {}
def grab(self, args=None, namespace=None):
    captured["parser"] = self
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = grab
from trainer_core.__main__ import main
try:
    main([])
except SystemExit:
    pass
def subs(parser):
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
ml = ("torch", "transformers", "trl", "peft", "datasets", "sentence_transformers", "unsloth")
print(json.dumps({"commands": {name: sorted(subs(p)) for name, p in subs(captured["parser"]).items()},
                  "ml": sorted(m for m in sys.modules if m.split(".")[0] in ml)}))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["ml"] == [], f"building the CLI's parser imported {found['ml']}"
    return found["commands"]


def test_the_cli_parser_is_read(cli_commands):
    assert {"run", "validate", "runs", "db"} <= set(cli_commands)
    assert cli_commands["db"] == ["rebuild"]


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_cli_subcommand_named_exists(page, cli_commands):
    wrong = []
    for words in CLI.findall(page.read_text(encoding="utf-8")):
        command, *rest = words.split()
        if command not in cli_commands:
            wrong.append(f"python -m trainer_core {command}: not a subcommand (they are {', '.join(cli_commands)})")
        elif cli_commands[command] and rest and rest[0] not in cli_commands[command]:
            wrong.append(f"python -m trainer_core {command} {rest[0]}: {command} takes "
                         f"{', '.join(cli_commands[command])}")
    assert wrong == [], f"{_rel(page)}:\n" + "\n".join(wrong)


def test_readme_stays_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines, more than {README_MAX_LINES}: move detail into "
                                       "docs/ and link it")


def yaml_blocks() -> list[tuple[str, str]]:
    """(where, text) of every ```yaml block in docs/*.md: each one is a run config."""
    blocks = []
    for page in DOCS:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match.group(1) == "yaml":
                line = text[:match.start()].count("\n") + 1
                blocks.append((f"{_rel(page)}:{line}", match.group(2)))
    return blocks


@pytest.mark.parametrize("where,text", yaml_blocks(), ids=[w for w, _ in yaml_blocks()])
def test_every_yaml_example_is_a_valid_config(home, monkeypatch, where, text):
    """As `python -m trainer_core validate` checks a file: the fields, then the dataset when it is bundled
    (an example that names the reader's own file cannot have it checked here)."""
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")  # a launcher: ray example runs on the server's cluster
    data = load_yaml(text)
    if isinstance(data, dict) and "recipe" in data:  # a data recipe (data-recipes.md): checked as the CLI reads it
        from trainer_core.recipes import launch

        own = ("documents", "seed_dataset", "models[0].source")  # the reader's own folders and runs
        assert [e for e in launch.from_fields(data).validate() if e.field not in own] == [], where
        return
    if isinstance(data, dict) and "sweep" in data:  # a sweep file (sweeps.md): its sweep: section, then its base
        config, errors = sweep_checks.read(data)
        assert errors == [], where
        text = yaml.safe_dump(config.base)
    cfg = TrainConfig.from_yaml(text)
    assert cfg.validate() == [], where
    if cfg.local_datasets and all(d.startswith("bundled:") for d in cfg.local_datasets + cfg.local_eval_datasets):
        assert loading.check_data(cfg) == [], where


def test_every_registered_method_has_a_yaml_example():
    documented = {TrainConfig.from_yaml(text).method for where, text in yaml_blocks() if where.startswith("docs/methods.md")}
    assert documented == set(METHODS), f"docs/methods.md needs a YAML example for {sorted(set(METHODS) - documented)}"


def test_methods_doc_lists_every_builtin_reward_and_parameter():
    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    missing = [f"{kind}.{param}" for kind, params in PARAMS.items() for param in [None, *params]
               if f"`{param or kind}`" not in text]
    assert missing == [], f"docs/methods.md does not mention {missing}"


def test_config_reference_is_generated_from_the_code():
    spec = importlib.util.spec_from_file_location("gen_config_reference", ROOT / "scripts" / "gen_config_reference.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    committed = (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert committed == generator.render(), ("docs/config-reference.md differs from the code's help texts: run "
                                             ".venv/bin/python scripts/gen_config_reference.py and commit the result")
