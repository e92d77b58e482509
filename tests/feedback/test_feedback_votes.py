"""Votes (issue 34): what the store and the feedback log keep, who may withdraw and export, hostile text, and votes
surviving a restart and `db rebuild`."""
from __future__ import annotations

import json

import pytest

from db.store import Store
from trainer_core.auth.access import Actor, Role
from trainer_core.feedback import agreement, votes
from trainer_core.feedback.service import Feedback, FeedbackRefused
from trainer_core.feedback.votes import FeedbackError, Model
from trainer_core.jobs import rebuild
from trainer_core.protocol import feedback_log

ANN = Actor("ann", Role.OPERATOR)
VAL = Actor("val", Role.VIEWER)
ADA = Actor("ada", Role.ADMIN)
CONVO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
MODELS = [Model("base:bundled:SmolLM2-135M-Instruct", "Base"), Model("run:r1", "tuned", run_id="r1")]


def pair(feedback: Feedback, who: Actor, label: str, a: str = "4", b: str = "four, I think", **kw):
    return feedback.vote(who, votes.PAIR, label, CONVO, [a, b], MODELS, {"temperature": 0.7}, **kw)


def test_a_vote_keeps_who_when_the_conversation_answers_models_and_settings(home, store):
    feedback = Feedback(store)
    vote = pair(feedback, ANN, votes.A_BETTER)
    [stored] = store.votes()
    assert stored == vote
    assert (stored.voter, stored.kind, stored.label, stored.messages, stored.answer_a, stored.answer_b) == \
        ("ann", "pair", "a_better", CONVO, "4", "four, I think")
    assert stored.models[1] == {"key": "run:r1", "label": "tuned", "run_id": "r1", "checkpoint": None,
                                "base_model": "", "template": "", "system_prompt": ""}
    assert stored.sampling == {"temperature": 0.7} and stored.created_at > 0 and stored.withdrawn_at is None
    [logged] = feedback_log.read()
    assert logged["op"] == "vote" and logged["row"]["id"] == vote.id and json.loads(logged["row"]["messages"]) == CONVO


def test_only_the_voter_withdraws_a_vote_and_then_it_is_gone_from_every_view(home, store):
    feedback = Feedback(store)
    vote = pair(feedback, VAL, votes.B_BETTER)  # viewers vote
    for other in (ANN, ADA):
        with pytest.raises(FeedbackRefused, match="this vote is val's: only they can withdraw it"):
            feedback.withdraw(other, vote.id)
    assert store.votes() == [vote]
    feedback.withdraw(VAL, vote.id)
    assert store.votes() == [] and feedback.votes_of(VAL) == [] and feedback.open_for(ANN) == []
    assert store.votes(include_withdrawn=True)[0].withdrawn_at is not None
    with pytest.raises(FeedbackError, match="already withdrawn"):
        feedback.withdraw(VAL, vote.id)
    with pytest.raises(FeedbackError, match="there is no vote 'v-nope'"):
        feedback.withdraw(VAL, "v-nope")
    assert [r["op"] for r in feedback_log.read()] == ["vote", "withdraw"]


@pytest.mark.parametrize("kind, label, answers, edited, message", [
    ("pair", "a_better", ["same", "same"], "", "both answers are the same text"),
    ("pair", "up", ["a", "b"], "", "a pair vote's label is one of a_better, b_better, tie, both_bad, not 'up'"),
    ("single", "up", ["a", "b"], "", "a single vote judges 1 answer(s)"),
    ("edit", "edit", ["an answer"], "   ", "the edit is empty"),
    ("edit", "edit", ["an answer"], "an answer", "the edit is the same as the answer"),
    ("edit", "edit", ["an answer"], "x" * 100_001, "the edit has 100,001 characters; the limit is 100,000"),
    ("single", "up", ["a"], "sneaky", "only an edit vote carries an edited answer"),
    ("poll", "up", ["a"], "", "unknown vote kind 'poll'"),
])
def test_bad_votes_are_refused_naming_the_problem(home, store, kind, label, answers, edited, message):
    models = MODELS[:len(answers)]
    with pytest.raises(FeedbackError) as err:
        Feedback(store).vote(ANN, kind, label, CONVO, answers, models, edited=edited)
    assert message in str(err.value)
    assert store.votes() == [] and feedback_log.read() == []


def test_hostile_text_is_stored_as_given_and_a_nul_becomes_a_replacement_character(home, store):
    hostile = "**bold** <script>alert(1)</script> [x](http://evil.example) ![i](http://evil.example/i.png)\x00end"
    huge = "y" * votes.ANSWER_MAX
    feedback = Feedback(store)
    vote = feedback.vote(ANN, votes.EDIT, votes.EDITED, [{"role": "user", "content": hostile}], [huge],
                         MODELS[:1], edited=hostile)
    [stored] = store.votes()
    assert stored.answer_a == huge and stored.answer_b == hostile.replace("\x00", "\ufffd")
    assert stored.messages[0]["content"] == hostile.replace("\x00", "\ufffd") and stored.id == vote.id
    with pytest.raises(FeedbackError, match="the conversation must end with the user's message"):
        feedback.vote(ANN, votes.SINGLE, votes.UP, [{"role": "assistant", "content": "hi"}], ["a"], MODELS[:1])
    with pytest.raises(FeedbackError, match="the conversation is empty"):
        feedback.vote(ANN, votes.SINGLE, votes.UP, [], ["a"], MODELS[:1])


def test_agreement_between_people_counts_swapped_columns_as_the_same_pick_and_finds_conflicts(home, store):
    feedback = Feedback(store)
    pair(feedback, ANN, votes.A_BETTER)
    pair(feedback, VAL, votes.B_BETTER, a="four, I think", b="4")  # the same pick, columns swapped
    pair(feedback, ADA, votes.A_BETTER, a="four, I think", b="4")  # the other answer: a conflict
    other = [{"role": "user", "content": "Hi"}]
    feedback.vote(ANN, votes.SINGLE, votes.UP, other, ["Hello!"], MODELS[:1])
    feedback.vote(VAL, votes.SINGLE, votes.UP, other, ["Hello!"], MODELS[:1])
    found = agreement.agreement(store.votes())
    assert (found.shared, found.pairs, found.agreeing) == (2, 4, 2)  # ann=val, ann!=ada, val!=ada; the thumbs agree
    assert found.rate == 0.5 and found.conflicts == [votes.pair_key(CONVO, ["4", "four, I think"])]
    assert feedback.open_for(ANN) == []  # ann judged both sets of answers
    pair(feedback, ANN, votes.B_BETTER)  # ann changes her mind: her newest vote counts
    assert agreement.agreement(store.votes()).agreeing == 2  # now ann=ada, thumbs agree


def test_filters_and_counts_by_run_and_person(home, store):
    feedback = Feedback(store)
    first = pair(feedback, ANN, votes.A_BETTER)
    feedback.vote(VAL, votes.SINGLE, votes.DOWN, CONVO, ["4"], MODELS[:1])
    everything = store.votes()
    assert agreement.counts_by_run(everything) == {"r1": {"a_better": 1}, agreement.BASE_ONLY: {"down": 1}}
    assert agreement.counts_by_person(everything) == {"ann": {"a_better": 1}, "val": {"down": 1}}
    assert agreement.select(everything, agreement.Filters(runs=("r1",))) == [first]
    assert agreement.select(everything, agreement.Filters(voters=("val",), labels=("down",)))[0].voter == "val"
    assert agreement.select(everything, agreement.Filters(until=first.created_at)) == []
    assert len(agreement.select(everything, agreement.Filters(since=first.created_at))) == 2


def test_votes_and_ratings_survive_a_restart_and_db_rebuild(home):
    store = Store()
    feedback = Feedback(store)
    kept = pair(feedback, ANN, votes.A_BETTER)
    gone = pair(feedback, VAL, votes.TIE)
    feedback.withdraw(VAL, gone.id)
    store.engine.dispose()
    assert Store().votes() == [kept]  # a restart: the database kept them
    report = rebuild.rebuild()
    assert report.feedback == 3 and "replayed 3 feedback record(s)" in report.summary()
    rebuilt = Store()
    assert rebuilt.votes() == [kept]  # the withdrawn one stays withdrawn
    assert sorted(v.id for v in rebuilt.votes(include_withdrawn=True)) == sorted([kept.id, gone.id])
    assert len(feedback_log.read()) == 3  # the rebuild wrote nothing to the log it replays
    rebuilt.engine.dispose()


def test_a_damaged_log_line_costs_only_itself(home, store):
    feedback = Feedback(store)
    pair(feedback, ANN, votes.A_BETTER)
    with open(feedback_log.log_path(), "a", encoding="utf-8") as fh:
        fh.write('{"op": "vote", "row": {"id": 3, "bogus": tr\n{"op": "withdraw", "id": "v-none", "at": 1}\n')
    pair(feedback, VAL, votes.A_BETTER)
    fresh = Store(f"sqlite:///{home}/fresh.db", journal=False)
    assert fresh.replay_feedback(feedback_log.read()) == 3
    assert len(fresh.votes()) == 2
    fresh.engine.dispose()
