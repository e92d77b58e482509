"""Samples during training: one answer (or spoken clip) per prompt per sampling step, upserted on (run, step,
index) so a replayed event log rewrites the same rows (the Store's sample aggregate; db/store.py composes it)."""
from __future__ import annotations

import json
from typing import Any, Iterable

from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from db.entities import SampleRecord
from db.models import Sample


class SamplesStore:
    """Store methods on samples; ``self`` is the Store (engine, write lock, backend)."""

    def append_samples(self, run_id: str, rows: Iterable[dict[str, Any]]) -> None:
        """Upsert sample answers on (run, step, index): a replayed event log rewrites the same rows."""
        values = [{"run_id": run_id, "step": int(r["step"]), "idx": int(r["index"]), "ts": float(r.get("ts") or 0.0),
                   "prompt": r["prompt"], "text": r["text"], "new_tokens": int(r.get("new_tokens") or 0),
                   "flags": json.dumps(r.get("flags") or {}, sort_keys=True), "audio": str(r.get("audio") or ""),
                   "turns": json.dumps(r["turns"]) if r.get("turns") else ""}
                  for r in rows]
        if not values:
            return
        by_key = {(v["step"], v["idx"]): v for v in values}  # PostgreSQL refuses the same key twice in one statement
        stmt = (sqlite if self.is_sqlite else postgresql).insert(Sample.__table__)
        stmt = stmt.on_conflict_do_update(index_elements=["run_id", "step", "idx"],
                                          set_={c: stmt.excluded[c] for c in ("ts", "prompt", "text", "new_tokens",
                                                                              "flags", "audio", "turns")})
        with self._write_lock, Session(self.engine) as session:
            session.connection().execute(stmt, list(by_key.values()))
            session.commit()

    def samples(self, run_id: str, max_steps: int = 50) -> list[SampleRecord]:
        """A run's sample answers of its newest ``max_steps`` sampling steps: newest step first, prompts in order."""
        with Session(self.engine) as session:
            steps = session.exec(select(Sample.step).where(Sample.run_id == run_id).distinct()
                                 .order_by(col(Sample.step).desc()).limit(max_steps)).all()
            if not steps:
                return []
            rows = session.exec(select(Sample).where(Sample.run_id == run_id, col(Sample.step) >= min(steps))
                                .order_by(col(Sample.step).desc(), Sample.idx))
            return [SampleRecord.from_row(row) for row in rows]

    def samples_from(self, run_id: str, from_step: int | None = None) -> list[SampleRecord]:
        """A run's sample answers in step order, those from ``from_step`` on when given (views kept current)."""
        query = select(Sample).where(Sample.run_id == run_id)
        if from_step is not None:
            query = query.where(col(Sample.step) >= from_step)
        with Session(self.engine) as session:
            return [SampleRecord.from_row(row) for row in session.exec(query.order_by(Sample.step, Sample.idx))]

    def sample_prompts(self, run_ids: list[str]) -> list[str]:
        """The distinct prompts these runs sampled, in the order they first appear (by run, then index)."""
        if not run_ids:
            return []
        with Session(self.engine) as session:
            rows = session.exec(select(Sample.run_id, Sample.idx, Sample.prompt).where(col(Sample.run_id).in_(run_ids))
                                .distinct()).all()
        order = {run_id: i for i, run_id in enumerate(run_ids)}
        return list(dict.fromkeys(prompt for _, _, prompt in sorted(rows, key=lambda r: (order[r[0]], r[1]))))

    def prompt_samples(self, run_ids: list[str], prompt: str) -> list[SampleRecord]:
        """Every answer these runs gave to ``prompt``: by run in the order asked for, newest step first."""
        if not run_ids:
            return []
        with Session(self.engine) as session:
            rows = session.exec(select(Sample).where(col(Sample.run_id).in_(run_ids), Sample.prompt == prompt)
                                .order_by(col(Sample.step).desc(), Sample.idx)).all()
        order = {run_id: i for i, run_id in enumerate(run_ids)}
        return sorted((SampleRecord.from_row(row) for row in rows), key=lambda r: order[r.run_id])
