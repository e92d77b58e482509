"""The Feedback page (issue 34) through AppTest: counts, agreement and conflicts, filters, withdrawing one's own
vote, a viewer's second opinion (and no export), and an export whose "Train on this feedback" opens New run with the
method, the dataset and the voted run's model."""
from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest

from db import users
from db.store import Store
from tests.support import apptest
from tests.support.factories import finished_run
from tests.test_playground import TUNED_ID
from tests.test_text_safety import PAYLOADS, assert_nothing_interpreted
from trainer_core.auth.access import Actor, Role
from trainer_core.feedback import export, votes
from trainer_core.feedback.service import Feedback, model_for
from ui import auth
from ui import feedback_view as view
from ui import form
from ui.state import get_orchestrator

PAGE = "pages/feedback.py"
ASK = [{"role": "user", "content": "What is 2+2?"}]


def open_page() -> AppTest:
    return apptest.open_page(PAGE, timeout=60)


def as_user(monkeypatch, name: str, role: Role) -> Actor:
    store = get_orchestrator().store
    users.ensure_user(store, name, role)
    monkeypatch.setenv(auth.SHARED_ENV, "1")
    monkeypatch.setattr(auth, "proxy_user", lambda: name)
    monkeypatch.setattr(auth, "proxy_session", lambda: users.get_user(store, name).session_generation)
    return Actor(name, role)


def seed(store: Store, me: Actor) -> Feedback:
    finished_run(store, TUNED_ID, "tuned run")
    feedback = Feedback(store)
    models = [model_for("base:bundled:SmolLM2-135M-Instruct", "Base"), model_for(f"run:{TUNED_ID}", "tuned")]
    feedback.vote(me, votes.PAIR, votes.B_BETTER, ASK, ["5", "4"], models)
    feedback.vote(Actor("bob", Role.OPERATOR), votes.PAIR, votes.A_BETTER, ASK, ["4", "5"], models[::-1])
    feedback.vote(Actor("cy", Role.OPERATOR), votes.PAIR, votes.A_BETTER, ASK, ["5", "4"], models)  # conflict
    return feedback


def test_counts_agreement_conflicts_and_filters(app_home):
    me = Actor.local()
    seed(get_orchestrator().store, me)
    at = open_page()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {"Votes": "3", "People": "3", "Agreement": "33%", "Conflicts": "1"}
    by_run, by_person, conflicts = (t.value for t in at.dataframe[:3])
    assert by_run.to_dict("records") == [{"Run": "tuned run", "A is better": 2, "B is better": 1, "Votes": 3}]  # as clicked
    assert sorted(by_person["Person"]) == sorted(["bob", "cy", me.name])
    # answers in a fixed order ("4" is A): me and bob picked "4", cy picked "5"; newest vote first
    assert conflicts.to_dict("records") == [{"Prompt": "What is 2+2?", "Answer A": "4", "Answer B": "5",
                                             "Votes": f"cy: B is better; bob: A is better; {me.name}: A is better"}]
    at.multiselect(key="fb_people").set_value(["bob"]).run()
    assert {m.label: m.value for m in at.metric}["Votes"] == "1"


def test_a_person_withdraws_their_own_vote_here(app_home):
    me = Actor.local()
    seed(get_orchestrator().store, me)
    at = open_page()
    [mine] = Feedback(get_orchestrator().store).votes_of(me)
    at.multiselect(key="fb_labels").set_value([votes.A_BETTER]).run()  # the filters apply to one's own votes too
    assert "Your votes (0)" in [s.value for s in at.subheader] and "None match the filters above." in \
        [c.value for c in at.caption]
    at.multiselect(key="fb_labels").set_value([]).run()
    at.button(key=f"fb_withdraw_{mine.id}").click().run()
    assert not at.exception, at.exception
    assert {m.label: m.value for m in at.metric}["Votes"] == "2"
    assert not [b for b in at.button if b.key and b.key.startswith("fb_withdraw_")]


def test_a_viewer_gives_a_second_opinion_but_cannot_export(app_home, monkeypatch):
    seed(get_orchestrator().store, Actor("ann", Role.OPERATOR))
    val = as_user(monkeypatch, "val", Role.VIEWER)
    at = open_page()
    assert at.button(key="fb_export").disabled
    [waiting] = Feedback(get_orchestrator().store).open_for(val)
    at.button(key=f"fb_second_{waiting.id}_{votes.A_BETTER}").click().run()
    assert not at.exception, at.exception
    [mine] = Feedback(get_orchestrator().store).votes_of(val)
    assert (mine.origin, mine.pair_key, mine.label) == ("second opinion", waiting.pair_key, votes.A_BETTER)
    assert {m.label: m.value for m in at.metric}["Votes"] == "4"


def test_export_then_train_on_this_feedback_opens_new_run_prefilled(app_home):
    me = Actor.local()
    seed(get_orchestrator().store, me)
    at = open_page()
    at.multiselect(key="fb_people").set_value([me.name]).run()  # my vote alone: no conflict
    at.radio(key="fb_format").set_value("dpo").run()
    at.button(key="fb_export").click().run()
    assert not at.exception, at.exception
    [path] = [export.folder() / "feedback-dpo-v1.jsonl"]
    assert [json.loads(line)["chosen"] for line in path.read_text().splitlines()] == [
        [{"role": "assistant", "content": "4"}]]
    assert any("Wrote 1 row(s) from 1 vote(s) to feedback-dpo-v1.jsonl" in s.value for s in at.success)
    assert any("the base model of run 'tuned run'" in c.value for c in at.caption)
    at.button(key="fb_train").click().run()
    assert not at.exception, at.exception
    state = at.session_state
    assert state[form.K + "method"] == "dpo" and state[form.K + "local_datasets"] == str(path)
    assert state[form.K + "dataset_source"] == "local" and state[form.K + "model_source"] == "bundled"
    assert at.title[0].value == "New run"


def test_hostile_votes_are_shown_as_text(app_home):
    feedback = Feedback(get_orchestrator().store)
    other = Actor("bob", Role.OPERATOR)
    feedback.vote(other, votes.PAIR, votes.A_BETTER, [{"role": "user", "content": PAYLOADS["markup"]}],
                  [PAYLOADS["html"], PAYLOADS["links"]], [model_for("base:m"), model_for("base:n")])
    at = open_page()
    assert_nothing_interpreted(at, [PAYLOADS["markup"]], "Feedback")  # the prompt, as escaped markdown
    assert [t.value for t in at.text] == [PAYLOADS["html"], PAYLOADS["links"]]  # the answers, as plain text


def test_date_bounds_include_the_last_day():
    import datetime as dt

    start, end = view.date_bounds((dt.date(2026, 1, 1), dt.date(2026, 1, 2)))
    assert end - start == 2 * 86400 and view.date_bounds(()) == (None, None)
