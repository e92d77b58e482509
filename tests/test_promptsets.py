"""Prompt sets: saved YAML files under the data root and the built-in sets; bad names, prompts and files are
refused with the field and the file named."""
from __future__ import annotations

import threading

import pytest
import yaml

from trainer_core.config import promptsets
from trainer_core.config.promptsets import PromptSetError


def test_builtin_sets_load_and_are_listed(home):
    loaded = promptsets.load("quick-check")
    assert loaded.builtin and loaded.prompts == promptsets.BUILTIN["quick-check"]
    assert promptsets.names() == list(promptsets.BUILTIN)


def test_save_load_round_trip_with_unicode_and_newlines(home):
    saved = promptsets.save("support tone", ["  How do I reset my password?  ", "", "Zwei\nZeilen: ü, 東京"])
    assert saved.prompts == ("How do I reset my password?", "Zwei\nZeilen: ü, 東京")
    assert promptsets.load("support tone") == promptsets.PromptSet("support tone", saved.prompts)
    path = promptsets.sets_dir() / "support tone.yaml"
    assert yaml.safe_load(path.read_text(encoding="utf-8")) == {"name": "support tone", "prompts": list(saved.prompts)}
    assert promptsets.names() == ["support tone", *promptsets.BUILTIN]
    assert [p.name for p in promptsets.sets_dir().iterdir()] == ["support tone.yaml"]  # no temporary file left


def test_a_saved_set_replaces_the_builtin_one_until_deleted(home):
    promptsets.save("quick-check", ["Mine."])
    assert promptsets.load("quick-check").prompts == ("Mine.",) and not promptsets.load("quick-check").builtin
    assert promptsets.names().count("quick-check") == 1
    promptsets.delete("quick-check")
    assert promptsets.load("quick-check").builtin


def test_add_prompt_creates_appends_once_and_copies_a_builtin_set(home):
    assert promptsets.add_prompt("new", " First? ").prompts == ("First?",)
    assert promptsets.add_prompt("new", "Second?").prompts == ("First?", "Second?")
    assert promptsets.add_prompt("new", "First?").prompts == ("First?", "Second?")  # not twice
    copied = promptsets.add_prompt("quick-check", "One more.")
    assert copied.prompts == (*promptsets.BUILTIN["quick-check"], "One more.") and not copied.builtin
    with pytest.raises(PromptSetError) as exc:
        promptsets.add_prompt("new", "   ")
    assert (exc.value.field, str(exc.value)) == ("prompt", "the prompt is empty")


def test_delete_removes_the_file_and_a_missing_set_is_named(home):
    promptsets.save("gone soon", ["x"])
    promptsets.delete("gone soon")
    with pytest.raises(PromptSetError) as exc:
        promptsets.load("gone soon")
    assert str(exc.value).startswith("there is no prompt set 'gone soon'; known sets: quick-check")
    assert exc.value.field == "prompt_set"


@pytest.mark.parametrize("name", ["", "   ", "../escape", "a/b", "-dash-first", "x" * 65, "nul\x00name", ".hidden"])
def test_bad_names_are_refused_everywhere(home, name):
    for call in (lambda: promptsets.save(name, ["p"]), lambda: promptsets.load(name),
                 lambda: promptsets.add_prompt(name, "p"), lambda: promptsets.delete(name)):
        with pytest.raises(PromptSetError) as exc:
            call()
        assert exc.value.field == "name" and "is not a usable prompt set name" in str(exc.value)
    assert list(promptsets.sets_dir().iterdir()) == []


@pytest.mark.parametrize("prompts, message", [
    (["ok", "bad\x00"], "prompt 2 contains a NUL character (\\x00): remove it"),
    (["x" * (promptsets.PROMPT_MAX + 1)], f"prompt 1 has {promptsets.PROMPT_MAX + 1:,} characters; the limit is "
                                          f"{promptsets.PROMPT_MAX:,}"),
    (["ok", 3], "prompt 2 is a int; every prompt must be text"),
    ([f"p{i}" for i in range(promptsets.PROMPTS_MAX + 1)], f"{promptsets.PROMPTS_MAX + 1} prompts; a set holds at "
                                                          f"most {promptsets.PROMPTS_MAX}"),
    (["", "  "], "a prompt set needs at least one non-empty prompt"),
])
def test_bad_prompts_are_refused_and_nothing_is_written(home, prompts, message):
    with pytest.raises(PromptSetError) as exc:
        promptsets.save("set", prompts)
    assert str(exc.value) == message and exc.value.field == "prompts"
    assert list(promptsets.sets_dir().iterdir()) == []


@pytest.mark.parametrize("content, reason", [
    ("prompts: [unclosed", "cannot be read"),
    ("- just\n- a list\n", "must be a mapping with a 'prompts' list"),
    ("prompts: {a: 1}\n", "must be a mapping with a 'prompts' list"),
    ("prompts:\n  - fine\n  - 42\n", "prompt 2 is a int; every prompt must be text"),
    ("prompts:\n  - \"nul \\0 inside\"\n", "prompt 1 contains a NUL character"),
])
def test_a_broken_file_is_an_error_naming_the_file(home, content, reason):
    path = promptsets.sets_dir() / "broken.yaml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(PromptSetError) as exc:
        promptsets.load("broken")
    assert str(exc.value).startswith(str(path)) and reason in str(exc.value)
    with pytest.raises(PromptSetError):  # adding to it never overwrites what the user may still fix
        promptsets.add_prompt("broken", "new")
    assert path.read_text(encoding="utf-8") == content


def test_a_file_that_is_not_text_or_too_large_is_refused(home):
    path = promptsets.sets_dir() / "binary.yaml"
    path.write_bytes(b"prompts:\n  - \xff\xfe\n")
    with pytest.raises(PromptSetError) as exc:
        promptsets.load("binary")
    assert str(exc.value).startswith(f"{path} cannot be read")
    path.write_bytes(b"#" * (promptsets.FILE_BYTES_MAX + 1))
    with pytest.raises(PromptSetError) as exc:
        promptsets.load("binary")
    assert str(exc.value) == f"{path} is larger than 2 MiB: it is not a prompt set"


def test_sessions_saving_at_once_never_leave_half_a_file(home):
    sets = [[f"prompt {i} of writer {w}" for i in range(50)] for w in range(4)]
    errors = []

    def write(prompts):
        try:
            for _ in range(20):
                promptsets.save("shared", prompts)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in sets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert list(promptsets.load("shared").prompts) in sets
    assert [p.name for p in promptsets.sets_dir().iterdir()] == ["shared.yaml"]


def test_a_yaml_alias_bomb_is_refused_without_copying_every_prompt(home):
    """A 1 MB file whose aliases repeat one 8,000-character prompt 100,000s of times took >1 GB to refuse: the
    count is checked as the prompts are cleaned, so at most PROMPTS_MAX + 1 are ever copied."""
    class Counted(str):
        copies = 0

        def strip(self, *args):
            Counted.copies += 1
            return str(self).strip(*args)

    long = Counted(" " + "x" * 7_990 + " ")
    with pytest.raises(promptsets.PromptSetError, match="10000 prompts; a set holds at most 200"):
        promptsets.check_prompts([long] * 10_000)
    assert Counted.copies <= 2 * (promptsets.PROMPTS_MAX + 1)

    bomb = "prompts:\n- &a '%s'\n" % (" " + "x" * 7_990 + " ") + "- *a\n" * 5_000
    (promptsets.sets_dir() / "bomb.yaml").write_text(bomb)
    with pytest.raises(promptsets.PromptSetError, match="bomb.yaml: 5001 prompts"):
        promptsets.load("bomb")
