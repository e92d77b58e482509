"""Votes from a deployed app (issue 34): a serve job started with ``store_completions`` keeps each chat completion in
its folder, and the app rates one with the endpoint's key (POST /v1/feedback: a rating, an edit or a preferred
answer; trainer_core/serving/gate.py checks the id against the job's own completions). ``sync`` turns those ratings
into votes in the same store: 👍/👎 a single vote, an edit an edit vote, a preferred answer a pair with the preferred
one better. Each rating becomes one vote whose id derives from the rating's, so syncing again adds nothing; the voter
is the endpoint (and the ``user`` the app named)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trainer_core.feedback import votes
from trainer_core.feedback.service import Feedback, model_for
from trainer_core.feedback.votes import FeedbackError, Model
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind
from trainer_core.serving.spec import COMPLETIONS_FILE, FEEDBACK_FILE, ServeSpec, served_names
from trainer_core.specs import jobspec, model_source

SERVE_JOBS_READ = 500  # newest serve jobs whose folders are looked at


@dataclass
class SyncReport:
    added: int = 0
    skipped: list[str] = field(default_factory=list)  # "job: rating id: why"


def _lines(path: Path) -> list[dict]:
    try:
        raw = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for line in raw.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _models(run_dir: Path) -> dict[str, str]:
    """Served model name -> model source key, from the job's spec (empty when it cannot be read)."""
    try:
        spec = jobspec.read_spec(run_dir)
        resolved = [model_source.resolve(s) for s in spec.sources] if isinstance(spec, ServeSpec) else []
    except (ValueError, OSError, model_source.SourceError):
        return {}
    return dict(zip(served_names(resolved), (r.source.key for r in resolved)))


def _vote(feedback: Feedback, job_id: str, rating: dict, completion: dict, models: dict[str, str]):
    name = str(completion.get("model") or "")
    key = models.get(name)
    model = model_for(key, name) if key else Model(key=f"served:{name}", label=name)
    user = rating.get("user") if isinstance(rating.get("user"), str) else ""
    voter = f"{user} via endpoint {job_id}" if user else f"endpoint {job_id}"
    common = dict(messages=completion.get("messages"), sampling=completion.get("sampling") or {}, origin="served",
                  now=float(rating.get("created") or 0.0), vote_id=f"v-{rating['id']}")
    answer = str(completion.get("answer") or "")
    if "rating" in rating:
        vote = votes.build(voter, votes.SINGLE, rating["rating"], answers=[answer], models=[model], **common)
    elif "edited" in rating:
        vote = votes.build(voter, votes.EDIT, votes.EDITED, answers=[answer], models=[model],
                           edited=str(rating["edited"]), **common)
    else:
        vote = votes.build(voter, votes.PAIR, votes.B_BETTER, answers=[answer, str(rating.get("preferred"))],
                           models=[model, Model(key="served:preferred", label="preferred by the app")], **common)
    return feedback.store.add_vote(vote)


def sync(feedback: Feedback, job_ids: list[str] | None = None) -> SyncReport:
    """Record the ratings posted to serve jobs' endpoints that are not votes yet (``job_ids``: these jobs; default the
    newest serve jobs). A rating that cannot be a vote (a conversation with images or tool turns, an unknown
    completion) is skipped and named."""
    report = SyncReport()
    if job_ids is None:
        job_ids = [r.id for r in feedback.store.list_runs(limit=SERVE_JOBS_READ, kinds=[JobKind.SERVE.value])]
    for job_id in job_ids:
        try:
            folder = paths.run_dir(job_id)
        except paths.UnsafePathError:
            continue
        ratings = [r for r in _lines(folder / FEEDBACK_FILE) if isinstance(r.get("id"), str)]
        fresh = [r for r in ratings if feedback.store.get_vote(f"v-{r['id']}") is None]
        if not fresh:
            continue
        completions = {c.get("id"): c for c in _lines(folder / COMPLETIONS_FILE)}
        models = _models(folder)
        for rating in fresh:
            completion = completions.get(rating.get("completion_id"))
            try:
                if completion is None:
                    raise FeedbackError("its completion is not in the job's completions file")
                _vote(feedback, job_id, rating, completion, models)
            except FeedbackError as exc:
                report.skipped.append(f"{job_id}: {rating['id']}: {exc}")
                continue
            report.added += 1
    return report
