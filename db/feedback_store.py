"""People's feedback (issue 34): votes on answers and ratings of eval answers, the Store's feedback aggregate
(db/store.py composes it).

Every write also goes to the feedback log in the data root (trainer_core/protocol/feedback_log.py) unless the
store was opened by ``db rebuild`` (``journal=False``), which replays that very log (``replay_feedback``). Checks
(who may withdraw what, labels, sizes) are trainer_core/feedback's; the store writes what it is given.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Optional

from sqlmodel import Session, col, delete, select

from db.models import Rating, Vote
from trainer_core.protocol import feedback_log


@dataclass(frozen=True)
class VoteRecord:
    """A vote, typed (see db.models.Vote): ``messages``, ``models`` and ``sampling`` parsed from their JSON."""

    id: str
    created_at: float
    voter: str
    kind: str
    label: str
    messages: list = field(default_factory=list)
    answer_a: str = ""
    answer_b: str = ""
    models: list = field(default_factory=list)
    sampling: dict = field(default_factory=dict)
    origin: str = "playground"
    pair_key: str = ""
    withdrawn_at: Optional[float] = None

    @classmethod
    def from_row(cls, row: Vote) -> "VoteRecord":
        values = {f.name: getattr(row, f.name) for f in fields(cls)}
        for name, empty in (("messages", []), ("models", []), ("sampling", {})):
            try:
                parsed = json.loads(values[name] or "null")
            except ValueError:
                parsed = None
            values[name] = parsed if isinstance(parsed, type(empty)) else empty
        return cls(**values)

    def to_row(self) -> dict[str, Any]:
        """The row's values (JSON fields as text): what the log keeps and the store writes."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("messages", "models", "sampling"):
            values[name] = json.dumps(values[name], sort_keys=True, ensure_ascii=False)
        return values


@dataclass(frozen=True)
class RatingRecord:
    """A person's rating of one eval answer: ``scale`` pass_fail (value 0 or 1) or score5 (1-5)."""

    job_id: str
    index: int
    rater: str
    scale: str
    value: float
    created_at: float = 0.0


class FeedbackStore:
    """Store methods on feedback; ``self`` is the Store (engine, write lock, ``journal``)."""

    # ------------------------------------------------------------------ votes
    def add_vote(self, vote: VoteRecord) -> VoteRecord:
        row = vote.to_row()
        with self._write_lock, Session(self.engine) as session:
            session.merge(Vote(**row))
            session.commit()
        if self.journal:
            feedback_log.append("vote", row=row)
        return vote

    def withdraw_vote(self, vote_id: str, at: float, by: str) -> None:
        with self._write_lock, Session(self.engine) as session:
            row = session.get(Vote, vote_id)
            if row is None or row.withdrawn_at is not None:
                return
            row.withdrawn_at = at
            session.add(row)
            session.commit()
        if self.journal:
            feedback_log.append("withdraw", id=vote_id, at=at, by=by)

    def get_vote(self, vote_id: str) -> VoteRecord | None:
        with Session(self.engine) as session:
            row = session.get(Vote, vote_id)
            return VoteRecord.from_row(row) if row is not None else None

    def votes(self, include_withdrawn: bool = False) -> list[VoteRecord]:
        """Every vote, newest first (withdrawn ones only when asked: they are gone from every view)."""
        query = select(Vote).order_by(col(Vote.created_at).desc(), Vote.id)
        if not include_withdrawn:
            query = query.where(col(Vote.withdrawn_at).is_(None))
        with Session(self.engine) as session:
            return [VoteRecord.from_row(row) for row in session.exec(query)]

    # ------------------------------------------------------------------ ratings of eval answers
    def save_rating(self, rating: RatingRecord) -> None:
        with self._write_lock, Session(self.engine) as session:
            session.merge(Rating(**{f.name: getattr(rating, f.name) for f in fields(rating)}))
            session.commit()
        if self.journal:
            feedback_log.append("rate", row={f.name: getattr(rating, f.name) for f in fields(rating)})

    def remove_rating(self, job_id: str, index: int, rater: str, scale: str) -> None:
        with self._write_lock, Session(self.engine) as session:
            session.exec(delete(Rating).where(Rating.job_id == job_id, Rating.index == index,
                                              Rating.rater == rater, Rating.scale == scale))
            session.commit()
        if self.journal:
            feedback_log.append("unrate", job_id=job_id, index=index, rater=rater, scale=scale)

    def ratings(self, job_id: str) -> list[RatingRecord]:
        """An eval job's ratings, by sample then rater."""
        with Session(self.engine) as session:
            rows = session.exec(select(Rating).where(Rating.job_id == job_id)
                                .order_by(Rating.index, Rating.rater, Rating.scale)).all()
        return [RatingRecord(r.job_id, r.index, r.rater, r.scale, r.value, r.created_at) for r in rows]

    # ------------------------------------------------------------------ db rebuild
    def replay_feedback(self, records: Iterable[dict[str, Any]]) -> int:
        """Write the feedback log's records (``feedback_log.read``) into this database, in order; returns how many
        were applied. A record that does not fit (a hand-edited line) is skipped on its own."""
        applied = 0
        for record in records:
            try:
                self._replay_one(record)
            except (TypeError, ValueError, KeyError):
                continue
            applied += 1
        return applied

    def _replay_one(self, record: dict[str, Any]) -> None:
        op = record["op"]
        if op == "vote":
            row = dict(record["row"])
            names = {f.name for f in fields(VoteRecord)}
            with self._write_lock, Session(self.engine) as session:
                session.merge(Vote(**{k: v for k, v in row.items() if k in names}))
                session.commit()
        elif op == "withdraw":
            with self._write_lock, Session(self.engine) as session:
                row = session.get(Vote, str(record["id"]))
                if row is not None and row.withdrawn_at is None:
                    row.withdrawn_at = float(record["at"])
                    session.add(row)
                    session.commit()
        elif op == "rate":
            row = record["row"]
            with self._write_lock, Session(self.engine) as session:
                session.merge(Rating(job_id=str(row["job_id"]), index=int(row["index"]), rater=str(row["rater"]),
                                     scale=str(row["scale"]), value=float(row["value"]),
                                     created_at=float(row.get("created_at") or 0.0)))
                session.commit()
        elif op == "unrate":
            with self._write_lock, Session(self.engine) as session:
                session.exec(delete(Rating).where(Rating.job_id == str(record["job_id"]),
                                                  Rating.index == int(record["index"]),
                                                  Rating.rater == str(record["rater"]),
                                                  Rating.scale == str(record["scale"])))
                session.commit()
