"""Votes seen together: filters (run, person, date, label), counts per run and per person, agreement between people
who judged the same answers, and conflicts (people who picked opposite answers). Pure functions over VoteRecords."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import combinations

from db.feedback_store import VoteRecord
from trainer_core.feedback.votes import A_BETTER, B_BETTER, DOWN, PAIR, SINGLE, UP, canonical_label, run_ids

BASE_ONLY = "(base models only)"  # the run filter's name for votes on answers of base models alone
OPPOSITE = ({A_BETTER, B_BETTER}, {UP, DOWN})


@dataclass(frozen=True)
class Filters:
    """Which votes to look at; an empty field lets every vote through. Dates are UNIX seconds, ``until`` exclusive."""

    runs: tuple[str, ...] = ()
    voters: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None

    def keeps(self, vote: VoteRecord) -> bool:
        if self.runs and not (set(run_ids(vote) or [BASE_ONLY]) & set(self.runs)):
            return False
        if self.voters and vote.voter not in self.voters:
            return False
        if self.labels and vote.label not in self.labels:
            return False
        if self.since is not None and vote.created_at < self.since:
            return False
        return self.until is None or vote.created_at < self.until


def select(votes: list[VoteRecord], filters: Filters) -> list[VoteRecord]:
    return [v for v in votes if filters.keeps(v)]


def latest_per_person(votes: list[VoteRecord]) -> list[VoteRecord]:
    """Each person's newest vote on each set of answers: voting again on the same answers replaces the older vote."""
    newest: dict[tuple[str, str], VoteRecord] = {}
    for vote in sorted(votes, key=lambda v: (v.created_at, v.id)):
        newest[(vote.pair_key, vote.voter)] = vote
    return sorted(newest.values(), key=lambda v: (-v.created_at, v.id))


def counts_by_run(votes: list[VoteRecord]) -> dict[str, Counter]:
    """Run id (or BASE_ONLY) -> label -> votes."""
    out: dict[str, Counter] = defaultdict(Counter)
    for vote in votes:
        for run in run_ids(vote) or [BASE_ONLY]:
            out[run][vote.label] += 1
    return dict(out)


def counts_by_person(votes: list[VoteRecord]) -> dict[str, Counter]:
    out: dict[str, Counter] = defaultdict(Counter)
    for vote in votes:
        out[vote.voter][vote.label] += 1
    return dict(out)


@dataclass(frozen=True)
class Agreement:
    """Between people on the same answers: ``shared`` sets of answers judged by two people or more, ``pairs`` the
    pairs of people compared on them, ``agreeing`` how many of those pairs gave the same label; ``conflicts`` the
    sets where people picked opposite answers (A vs B, 👍 vs 👎)."""

    shared: int = 0
    pairs: int = 0
    agreeing: int = 0
    conflicts: list[str] = field(default_factory=list)  # pair keys

    @property
    def rate(self) -> float | None:
        return self.agreeing / self.pairs if self.pairs else None


def by_answers(votes: list[VoteRecord]) -> dict[str, list[VoteRecord]]:
    """Pair key -> each person's newest vote on those answers."""
    grouped: dict[str, list[VoteRecord]] = defaultdict(list)
    for vote in latest_per_person(votes):
        grouped[vote.pair_key].append(vote)
    return dict(grouped)


def agreement(votes: list[VoteRecord]) -> Agreement:
    """Percent agreement over pairs of people who judged the same answers (pair and single votes; edits are each
    person's own text), and the conflicts."""
    shared = pairs = agreeing = 0
    conflicts = []
    for key, group in by_answers([v for v in votes if v.kind in (PAIR, SINGLE)]).items():
        if len(group) < 2:
            continue
        shared += 1
        labels = [canonical_label(v) for v in group]
        for first, second in combinations(labels, 2):
            pairs += 1
            agreeing += first == second
        if any(opposite <= set(labels) for opposite in OPPOSITE):
            conflicts.append(key)
    return Agreement(shared, pairs, agreeing, conflicts)
