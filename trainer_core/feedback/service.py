"""The one API over people's feedback that the pages and the CLI call: vote, withdraw one's own vote, export, rate
an eval answer, import ratings made elsewhere. Who may do what (trainer_core.auth.access): everyone votes and rates
(viewers included: their judgement is what is asked for); a vote is its voter's own, so only they withdraw it (an
admin neither: a withdrawn vote is gone for everyone); exporting writes a dataset to train on, so viewers cannot
(the rule of training itself)."""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from db.feedback_store import RatingRecord, VoteRecord
from trainer_core.auth.access import Action, Actor, allowed
from trainer_core.feedback import agreement, export, votes
from trainer_core.feedback.votes import FeedbackError, Model
from trainer_core.specs import model_source as jobspec

SCALES = {"pass_fail": (0.0, 1.0), "score5": (1.0, 5.0)}
SCALE_TEXT = {"pass_fail": "pass/fail (1 pass, 0 fail)", "score5": "a score from 1 to 5"}


class FeedbackRefused(FeedbackError):
    """The person's role or ownership does not allow it; the message says who can."""


def model_for(key: str, label: str = "") -> Model:
    """What a vote keeps of the model that wrote an answer: its source, and for a run's model the base it was trained
    from, the tokenizer whose chat template it trains with, and its system prompt (a run whose folder is gone keeps
    its source alone)."""
    try:
        source = jobspec.ModelSource.from_key(key)
    except jobspec.SourceError:
        return Model(key=key, label=label)
    if source.is_base:
        return Model(key=key, label=label, base_model=source.model, template=source.model)
    try:
        cfg = jobspec.run_config(source.run_id)
    except jobspec.SourceError:
        return Model(key=key, label=label, run_id=source.run_id, checkpoint=source.checkpoint)
    return Model(key=key, label=label, run_id=source.run_id, checkpoint=source.checkpoint, base_model=cfg.model_name,
                 template=cfg.model_name, system_prompt=cfg.system_prompt)


@dataclass
class ImportReport:
    ratings: int = 0
    votes: int = 0
    problems: list[str] = field(default_factory=list)  # "line N: why"


class Feedback:
    def __init__(self, store: Any):
        self.store = store

    # ------------------------------------------------------------------ votes
    def vote(self, actor: Actor, kind: str, label: str, messages: list[dict], answers: list[str],
             models: list[Model], sampling: dict | None = None, edited: str = "",
             origin: str = "playground") -> VoteRecord:
        if not allowed(actor, Action.VOTE):
            raise FeedbackRefused(f"{actor.name} may not vote")
        return self.store.add_vote(votes.build(actor.name, kind, label, messages, answers, models, sampling,
                                               edited, origin))

    def second_opinion(self, actor: Actor, of: VoteRecord, label: str) -> VoteRecord:
        """The person's own vote on the answers someone else judged (how agreement between people comes about)."""
        answers = [of.answer_a] + ([of.answer_b] if of.kind == votes.PAIR else [])
        if of.kind == votes.EDIT:
            raise FeedbackError("an edit is its author's own answer: vote on side-by-side answers or thumbs instead")
        models = [Model(**m) for m in of.models]
        return self.vote(actor, of.kind, label, of.messages, answers, models, of.sampling, origin="second opinion")

    def withdraw(self, actor: Actor, vote_id: str) -> None:
        vote = self.store.get_vote(vote_id)
        if vote is None:
            raise FeedbackError(f"there is no vote {vote_id[:40]!r}")
        if vote.voter != actor.name:
            raise FeedbackRefused(f"this vote is {vote.voter}'s: only they can withdraw it")
        if vote.withdrawn_at is not None:
            raise FeedbackError("this vote was already withdrawn")
        self.store.withdraw_vote(vote_id, time.time(), actor.name)

    def all_votes(self) -> list[VoteRecord]:
        return self.store.votes()

    def votes_of(self, actor: Actor) -> list[VoteRecord]:
        return [v for v in self.store.votes() if v.voter == actor.name]

    def open_for(self, actor: Actor, limit: int = 20) -> list[VoteRecord]:
        """Answers others judged that ``actor`` has not (pairs and thumbs): a second opinion is how agreement is
        measured. One vote per set of answers, newest first."""
        mine = {v.pair_key for v in self.votes_of(actor)}
        out: dict[str, VoteRecord] = {}
        for vote in self.store.votes():
            if vote.kind != votes.EDIT and vote.voter != actor.name and vote.pair_key not in mine:
                out.setdefault(vote.pair_key, vote)
        return list(out.values())[:limit]

    # ------------------------------------------------------------------ export
    def may_export(self, actor: Actor) -> bool:
        return allowed(actor, Action.EXPORT_FEEDBACK)

    def export(self, actor: Actor, fmt: str, filters: agreement.Filters | None = None) -> export.Exported:
        if not self.may_export(actor):
            raise FeedbackRefused(f"{actor.name} is a {actor.role.value}: exporting feedback writes a dataset to train "
                                  "on, which operators and admins do; an admin can make you an operator")
        filters = filters or agreement.Filters()
        chosen = agreement.select(self.store.votes(), filters)
        return export.write(fmt, chosen, actor.name, {k: v for k, v in vars(filters).items() if v})

    # ------------------------------------------------------------------ ratings of eval answers
    def rate(self, actor: Actor, job_id: str, index: int, scale: str, value: Any) -> RatingRecord:
        if not allowed(actor, Action.VOTE):
            raise FeedbackRefused(f"{actor.name} may not rate")
        low, high = self._check_scale(scale)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value != int(value) or not low <= value <= high:
            raise FeedbackError(f"a {scale} rating is {SCALE_TEXT[scale]}, not {str(value)[:20]!r}")
        if isinstance(index, bool) or not isinstance(index, int) or index not in self._sample_indexes(job_id):
            raise FeedbackError(f"eval job {job_id[:64]!r} has no answer number {str(index)[:20]}: rate one of its "
                                "scored answers")
        rating = RatingRecord(job_id, index, actor.name, scale, float(value), time.time())
        self.store.save_rating(rating)
        return rating

    def unrate(self, actor: Actor, job_id: str, index: int, scale: str) -> None:
        self._check_scale(scale)
        self.store.remove_rating(job_id, index, actor.name, scale)

    def ratings(self, job_id: str) -> list[RatingRecord]:
        return self.store.ratings(job_id)

    def ratings_for(self, job_id: str) -> list[RatingRecord]:
        """The ratings to check eval job ``job_id``'s judge against: its own, and those people gave the same answers in
        the other evals of the same model on the same data. An eval run again with an edited judge rubric repeats its
        greedy answers, so the new rubric is checked against the same ratings. Matched by answer number and text; a
        person's rating of this job wins over a carried one."""
        result = self.store.eval_result(job_id)
        own = self.store.ratings(job_id)
        if result is None:
            return own
        answers = self._answers(job_id)
        have = {(r.index, r.rater, r.scale) for r in own}
        carried = []
        for other in self.store.eval_results(result.source_run_id):
            if other.job_id == job_id or (other.source_key, other.data_fingerprint) != (result.source_key,
                                                                                      result.data_fingerprint):
                continue
            theirs = self._answers(other.job_id)
            for rating in self.store.ratings(other.job_id):  # newest eval first: its rating wins a tie
                key = (rating.index, rating.rater, rating.scale)
                if key not in have and rating.index in answers and theirs.get(rating.index) == answers[rating.index]:
                    have.add(key)
                    carried.append(dataclasses.replace(rating, job_id=job_id))
        return own + carried

    def _answers(self, job_id: str) -> dict[int, str]:
        samples = self.store.eval_samples(job_id)
        return dict(zip(samples["index"].astype(int), samples["answer"].astype(str)))

    def _check_scale(self, scale: str) -> tuple[float, float]:
        if scale not in SCALES:
            raise FeedbackError(f"unknown rating scale {str(scale)[:20]!r}: use {' or '.join(SCALES)}")
        return SCALES[scale]

    def _sample_indexes(self, job_id: str) -> set[int]:
        return set(self.store.eval_samples(job_id)["index"].astype(int).tolist())

    # ------------------------------------------------------------------ import
    def import_lines(self, actor: Actor, lines: Iterable[str]) -> ImportReport:
        """Ratings and votes made elsewhere, one JSON object a line, recorded as ``actor``'s:

        * ``{"job_id", "index", "scale": "pass_fail"|"score5", "value"}``: a rating of an eval job's answer;
        * ``{"prompt" or "messages", "answer_a", "answer_b"?, "edited"?, "label"}``: a vote (pair labels with two
          answers, up/down with one, edit with ``edited``).

        Every good line is recorded; each bad one is named with why (the others still count)."""
        report = ImportReport()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise FeedbackError("not a JSON object")
                if "job_id" in row:
                    self.rate(actor, str(row["job_id"]), row.get("index"), row.get("scale", "score5"),
                              row.get("value"))
                    report.ratings += 1
                else:
                    self._import_vote(actor, row)
                    report.votes += 1
            except (ValueError, RecursionError) as exc:  # FeedbackError is a ValueError; so is bad JSON
                report.problems.append(f"line {number}: {str(exc)[:300]}")
        return report

    def _import_vote(self, actor: Actor, row: dict) -> None:
        messages = row.get("messages")
        if messages is None:
            prompt = row.get("prompt")
            if not isinstance(prompt, str) or not prompt.strip():
                raise FeedbackError("a vote needs a prompt (text) or messages")
            messages = [{"role": "user", "content": prompt}]
        label = row.get("label")
        kind = next((k for k, labels in votes.LABELS.items() if label in labels), None)
        if kind is None:
            raise FeedbackError(f"label is one of {', '.join(votes.ALL_LABELS)}, not {str(label)[:40]!r}")
        answers = [row.get("answer_a", "")] + ([row.get("answer_b", "")] if kind == votes.PAIR else [])
        models = [Model(key=str(m)) for m in (row.get("models") or ["import"] * len(answers))][:len(answers)]
        models += [Model(key="import")] * (len(answers) - len(models))
        self.vote(actor, kind, label, messages, answers, models, row.get("sampling") or {}, row.get("edited", ""),
                  origin="import")
