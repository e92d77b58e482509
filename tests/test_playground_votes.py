"""Votes in the Playground (issue 34) through AppTest: a side-by-side pick, thumbs and an edit on the answers of a
chat turn are stored with the conversation, both answers, the models and the sampling; the voter sees and withdraws
their vote; hostile answers and edits stay text."""
from __future__ import annotations

from db.store import Store
from tests.support.apptest import open_page
from tests.support.factories import finished_run
from tests.support.fake_openai import FakeOpenAI, FakeServeJob
from tests.test_playground import (BASE_ANSWER, BASE_KEY, PAGE, TUNED_ID, TUNED_KEY, ask,  # noqa: F401 - fixtures
                                   base_and_tuned, fake_server, runs, serve_job)
from tests.test_text_safety import PAYLOADS, assert_nothing_interpreted
from trainer_core.auth.access import Actor
from trainer_core.feedback import votes
from trainer_core.protocol import feedback_log
from ui import votes as votes_ui
from ui.state import get_orchestrator

TUNED_REPLY = "Tuned answer: What is 2+2? done"


def button(at, key: str):
    return at.button(key=key)


def chatted(at):
    at.text_area(key="pg_system").input("Be brief.")
    at.number_input(key="pg_temperature").set_value(0.0)
    return ask(at, "What is 2+2?")


def test_a_side_by_side_pick_is_stored_with_everything_it_judged_and_can_be_withdrawn(serve_job, runs):
    at = chatted(base_and_tuned(open_page(PAGE, timeout=60)))
    button(at, f"{votes_ui.K}{votes.B_BETTER}_0").click().run()
    assert not at.exception, at.exception
    [vote] = get_orchestrator().store.votes()
    assert (vote.kind, vote.label, vote.voter) == ("pair", "b_better", Actor.local().name)
    assert vote.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    assert (vote.answer_a, vote.answer_b) == (BASE_ANSWER, TUNED_REPLY)
    assert [m["key"] for m in vote.models] == [BASE_KEY, TUNED_KEY]
    assert vote.models[1]["run_id"] == TUNED_ID and vote.models[1]["base_model"] == vote.models[0]["base_model"]
    assert vote.sampling["temperature"] == 0.0 and vote.sampling["max_new_tokens"] == 256
    assert "Your vote: B is better" in [c.value for c in at.caption]

    button(at, f"{votes_ui.K}withdraw_{vote.id}").click().run()
    assert get_orchestrator().store.votes() == []
    assert [r["op"] for r in feedback_log.read()] == ["vote", "withdraw"]
    assert "Your vote: B is better" not in [c.value for c in at.caption]


def test_thumbs_and_an_edit_on_one_answer(serve_job, runs):
    at = chatted(base_and_tuned(open_page(PAGE, timeout=60)))
    button(at, f"{votes_ui.K}up_0_{TUNED_KEY}").click().run()
    button(at, f"{votes_ui.K}down_0_{BASE_KEY}").click().run()
    at.text_area(key=f"{votes_ui.K}edit_0_{BASE_KEY}").input("4.")
    button(at, f"{votes_ui.K}save_0_{BASE_KEY}").click().run()
    assert not at.exception, at.exception
    found = sorted((v.kind, v.label, v.answer_a, v.answer_b) for v in get_orchestrator().store.votes())
    assert found == [("edit", "edit", BASE_ANSWER, "4."), ("single", "down", BASE_ANSWER, ""),
                     ("single", "up", TUNED_REPLY, "")]
    at.text_area(key=f"{votes_ui.K}edit_0_{BASE_KEY}").input("   ")  # an empty edit: refused, said
    button(at, f"{votes_ui.K}save_0_{BASE_KEY}").click().run()
    assert any("the edit is empty" in e.value for e in at.error)
    assert len(get_orchestrator().store.votes()) == 3


def test_hostile_answers_and_edits_are_stored_and_shown_as_text(app_home, monkeypatch):
    hostile = PAYLOADS["markup"] + " " + PAYLOADS["links"]
    server = FakeOpenAI({"smollm2": PAYLOADS["html"], "tuned": hostile}).start()
    try:
        job = FakeServeJob(server.url, server.api_key, {BASE_KEY: "smollm2", TUNED_KEY: "tuned"})
        job.install(lambda target, name, value: monkeypatch.setattr(target, name, value, raising=False))
        store = Store()
        finished_run(store, TUNED_ID, "tuned run")
        store.engine.dispose()
        at = ask(base_and_tuned(open_page(PAGE, timeout=60)), PAYLOADS["image"])
        at.text_area(key=f"{votes_ui.K}edit_0_{TUNED_KEY}").input(PAYLOADS["lines"])
        button(at, f"{votes_ui.K}save_0_{TUNED_KEY}").click().run()
        [vote] = get_orchestrator().store.votes()
        assert (vote.answer_a, vote.answer_b) == (hostile, PAYLOADS["lines"])
        assert_nothing_interpreted(at, [PAYLOADS["html"], hostile, PAYLOADS["image"]], "Playground votes")
    finally:
        server.stop()
