"""The Evaluation tab of Run details, the eval block of Compare and History's eval column.

Pure helpers (``metric_rows``, ``worst_first``, ``headline``, ``compare_table``) build what is shown and are
tested on their own; the ``render_*`` functions lay them out. Every text from a test file or a model is
rendered as text (``ui.text.safe``, or dataframe cells, which Streamlit never reads as markdown).

Kept whole: the Evaluation tab's pure helpers and their renderers, one per kind of eval result (text, retrieval,
speech, images), sharing the headline and worst-first ordering.
"""
from __future__ import annotations

from typing import Any, Sequence

import pandas as pd
import streamlit as st

from db.entities import EvalResultRecord, RunRecord
from trainer_core import kinds, methods
from trainer_core.specs import model_source
from trainer_core.auth.access import Action, Actor, allowed
from trainer_core.config import ConfigError
from trainer_core.data import DatasetError
from trainer_core.data import audio as audio_data
from trainer_core.data.sources import save_upload
from trainer_core.evaluation import vision as eval_vision
from trainer_core.feedback.service import Feedback
from trainer_core.evaluation.samples import EVAL_SPLIT_PREFIX, HUB_PREFIX
from trainer_core.evaluation.spec import DEFAULT_METRICS, DEFAULT_RUBRIC, METRICS, EvalSpec
from trainer_core.jobs.orchestrator import Orchestrator, RunRefused
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus
from ui import format as fmt
from ui import judge_calibration
from ui.form import UPLOAD_TYPES
from ui.ray_run import job_place
from ui.server_paths import shown
from ui.text import code, safe

# metric key -> (label, higher is better)
METRIC_LABELS = {"exact": ("Exact match", True), "rouge_l": ("ROUGE-L", True), "bleu": ("BLEU", True),
                 "loss": ("Loss", False), "perplexity": ("Perplexity", False), "judge": ("Judge (1-10)", True),
                 "preference_accuracy": ("Preference accuracy", True), "preference_margin": ("Preference margin", True),
                 "reward": ("Reward (weighted total)", True),
                 # retrieval (an embedding model): sentence-transformers' InformationRetrievalEvaluator, 0-1
                 "ndcg@10": ("NDCG@10", True), "mrr@10": ("MRR@10", True), "recall@1": ("Recall@1", True),
                 "recall@10": ("Recall@10", True), "accuracy@1": ("Accuracy@1", True),
                 # a speech-to-text model's transcripts (jiwer, over all the words / characters of the set)
                 "wer": ("WER", False), "cer": ("CER", False),
                 # tool calls (metric tool_calls): the first reply of conversations with tools, 0-1
                 "tool_call_accuracy": ("Tool call / no call", True), "tool_name_accuracy": ("Tool names", True),
                 "tool_exact_accuracy": ("Tool calls exact", True), "tool_argument_accuracy": ("Tool arguments", True),
                 "tool_json_valid": ("Tool calls valid JSON", True),
                 "tool_schema_valid": ("Tool calls fit schema", True)}
REWARD_PREFIX = "reward/"  # one metric per reward function of the GRPO run: reward/<name>
METRIC_HELP = {"preference_accuracy": "Share of held-out pairs whose chosen answer the model prefers: a LoRA run by "
                                      "its implicit reward (log-prob minus the base's, adapter disabled), a model "
                                      "without a reference (the base) by its plain log-prob margin",
               "preference_margin": "Mean of reward(chosen) - reward(rejected), in nats",
               "reward": "Mean weighted total of the GRPO run's rewards on the model's greedy answers",
               "ndcg@10": "Normalized discounted cumulative gain of the top 10 passages, averaged over the queries",
               "mrr@10": "Mean of 1/rank of the first relevant passage (0 when it is not in the top 10)",
               "recall@1": "Share of each query's relevant passages found at rank 1, averaged over the queries",
               "recall@10": "Share of each query's relevant passages found in the top 10, averaged over the queries",
               "accuracy@1": "Share of queries whose top hit is relevant",
               "wer": "Word error rate over all clips: (substituted + deleted + inserted words) / reference words, "
                      "on lower-cased text without punctuation",
               "cer": "Character error rate over all clips, likewise",
               "tool_call_accuracy": "Share of questions where the model calls a tool when the reference reply does, "
                                     "and answers without one when it does not",
               "tool_name_accuracy": "Share of questions answered with the reference's functions, in order (no call "
                                     "when it makes none)",
               "tool_exact_accuracy": "Share of questions answered with the reference's calls and exactly its "
                                      "arguments",
               "tool_argument_accuracy": "Share of the reference calls' arguments the model gives with the same value, "
                                         "in its call to the same function",
               "tool_json_valid": "Share of the model's <tool_call> blocks that parse as {\"name\", \"arguments\"}",
               "tool_schema_valid": "Share of the model's calls that name one of the row's tools with arguments "
                                    "fitting its JSON Schema"}
SORTABLE = {"rouge_l": "ROUGE-L", "bleu": "BLEU", "exact": "Exact match", "judge": "Judge", "loss": "Loss",
            "margin": "Preference margin", "reward": "Reward", "rank": "Rank of the relevant passage",
            "wer": "WER", "cer": "CER", "tool_exact": "Tool calls exact", "tool_arguments": "Tool arguments"}
LOWER_IS_BETTER = ("loss", "rank", "wer", "cer")
# metrics whose per-sample scores are in predictions.jsonl only (retrieval: each query's rank and top hits)
PER_SAMPLE = ("preference_accuracy", "reward", "ndcg@10", "wer", "tool_call_accuracy")
K = "evaltab_"


# ---------------------------------------------------------------------- pure helpers
def _number(value: Any) -> float | int | None:
    """A metric value as a number, None for anything else (events are checked when read, so only a row stored by
    an older version could hold text here: shown empty rather than raising in History and Run details)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def metric_rows(metrics: dict, baseline: dict | None) -> list[dict[str, Any]]:
    """One row per overall metric present: label, value, the baseline's value, the difference and whether higher
    is better (each reward function's ``reward/<name>`` after the fixed metrics)."""
    labels = {key: value for key, value in METRIC_LABELS.items() if key in metrics}
    labels.update({key: (f"Reward: {key[len(REWARD_PREFIX):]}", True) for key in metrics
                   if isinstance(key, str) and key.startswith(REWARD_PREFIX)})
    rows = []
    for key, (label, higher) in labels.items():
        value = _number(metrics[key])
        base = _number((baseline or {}).get(key))
        rows.append({"metric": label, "key": key, "value": value, "baseline": base, "higher": higher,
                     "delta": value - base if value is not None and base is not None else None})
    return rows


def worst_first(samples: pd.DataFrame, by: str) -> pd.DataFrame:
    """Samples sorted so the worst come first: lowest score, or highest loss or rank; unscored ones last, except
    a query whose relevant passage has no rank (not in the top 100): the worst of all."""
    if samples.empty or by not in samples:
        return samples
    higher_is_better = by not in LOWER_IS_BETTER
    return samples.sort_values(by, ascending=higher_is_better, na_position="first" if by == "rank" else "last",
                               kind="stable")


def headline(metrics: dict | None) -> str:
    """History's short text for an eval: its exact tool calls (a tool-call eval), else ROUGE-L, else exact match, BLEU, judge, preference accuracy, reward or
    NDCG@10 (retrieval)."""
    for key in ("tool_exact_accuracy", "rouge_l", "exact", "bleu", "judge", "preference_accuracy", "reward", "ndcg@10",
                "wer"):
        if metrics and _number(metrics.get(key)) is not None:
            return f"{METRIC_LABELS[key][0]} {metrics[key]:.3f}"
    return ""


def compare_table(runs: Sequence[RunRecord], latest: dict[str, dict]) -> pd.DataFrame:
    """The newest completed eval of each run, a column per metric (runs without one: empty cells)."""
    rows = []
    for run in runs:
        metrics = latest.get(run.id, {})
        rows.append({"run": run.name or run.id,
                     **{label: _number(metrics.get(key)) for key, (label, _) in METRIC_LABELS.items()},
                     "samples": _number(metrics.get("samples"))})
    return pd.DataFrame(rows)


def render_eval_compare(runs: Sequence[RunRecord], latest: dict[str, dict]) -> None:
    """Compare's eval block: the newest completed eval of each run."""
    st.subheader("Evaluation")
    if not latest:
        st.caption("None of these runs has a completed evaluation (Run details > Evaluation).")
        return
    table = compare_table(runs, latest)
    shown = [c for c in table.columns if c in ("run", "samples") or table[c].notna().any()]
    st.dataframe(table[shown], hide_index=True, column_config={"run": st.column_config.TextColumn("Run", pinned=True)})


# ---------------------------------------------------------------------- the tab
def render_evaluation(orch: Orchestrator, run: RunRecord, actor: Actor) -> None:
    if run.kind is JobKind.EVAL:
        result = orch.eval_result(run.id)
        if result is None:
            st.caption("This eval job has no recorded result.")
            return
        render_result(orch, result, None)  # the page above already shows this job's outcome and error
        return
    if run.kind is not JobKind.TRAIN:
        st.caption("Evaluations are for training runs and their checkpoints.")
        return
    results = orch.eval_results(run.id)
    if allowed(actor, Action.START):
        with st.expander("Start an evaluation", icon="🧪", expanded=not results):
            render_start_form(orch, run, actor)
    if not results:
        st.caption("No evaluation of this run yet.")
        return
    labels = {r.job_id: _result_label(r) for r in results}
    picked = st.selectbox("Evaluation", list(labels), format_func=labels.get, key=K + "pick")
    result = next(r for r in results if r.job_id == picked)
    render_result(orch, result, orch.get_run(result.job_id))


def _result_label(result: EvalResultRecord) -> str:
    where = "final model" if result.checkpoint is None else f"step {result.checkpoint}"
    status = JobKind.EVAL.status_label(result.status)
    return f"{fmt.timestamp(result.created_at)} · {where} · {result.data_label} · {status}"


def render_result(orch: Orchestrator, result: EvalResultRecord, job: RunRecord | None) -> None:
    status = result.status
    st.markdown(f"**{safe(result.source_key)}** on {code(result.data_label or '—')} · {status.icon} "
                f"{JobKind.EVAL.status_label(status)}")
    if job is not None and status is RunStatus.FAILED and job.error:
        st.error(safe(job.error), icon="❌")
    if not status.is_terminal():
        _live_progress(orch, result.job_id)
        return
    if result.metrics is None:
        st.caption("The eval ended before reporting metrics.")
    else:
        render_metrics(result.metrics, orch.eval_baseline(result))
    samples = samples_of(orch, result)
    if "judge" in (result.metrics or {}):
        judge_calibration.render(Feedback(orch.store), result.job_id, samples)
    render_samples(samples)


def samples_of(orch: Orchestrator, result: EvalResultRecord) -> pd.DataFrame:
    """The scored samples: the stored ones, or, for preference and reward scores (which only the predictions
    file holds), that file's lines when it still has every sample."""
    stored = orch.eval_samples(result.job_id)
    if not any(key in (result.metrics or {}) for key in (*PER_SAMPLE, eval_vision.IMAGES_KEY)):
        return stored
    lines = orch.eval_predictions(result.job_id)
    return with_thumbnails(pd.DataFrame(lines), result.job_id) if lines and len(lines) >= len(stored) else stored


def with_thumbnails(samples: pd.DataFrame, job_id: str) -> pd.DataFrame:
    """Image rows' ``image`` (a thumbnail the eval worker stored in its job folder) as the checked file to show, or
    None when it is not a file inside that job's images folder (evaluation/vision.thumbnail_file)."""
    if "image" not in samples:
        return samples
    folder = paths.run_dir(job_id)
    return samples.assign(image=[str(found) if (found := eval_vision.thumbnail_file(folder, value)) else None
                                 for value in samples["image"]])


@st.fragment(run_every=2.0)
def _live_progress(orch: Orchestrator, job_id: str) -> None:
    """While the eval runs: progress and the predictions written so far (read from predictions.jsonl)."""
    job = orch.get_run(job_id)
    if job is None:
        return
    if job.status.is_terminal():
        st.caption("The eval has ended: reload to see its results.")
    done, total = job.steps_done or 0, job.total_steps or 0
    st.progress(min(done / total, 1.0) if total else 0.0, text=f"{done} of {total} samples · {safe(job.phase)}")
    partial = orch.eval_predictions(job_id)
    if partial:
        st.caption(f"{len(partial)} prediction(s) so far")
        render_samples(with_thumbnails(pd.DataFrame(partial), job_id), key="live")


def render_metrics(metrics: dict, baseline: EvalResultRecord | None) -> None:
    base = baseline.metrics if baseline is not None and baseline.status is RunStatus.COMPLETED else None
    rows = metric_rows(metrics, base)
    if metrics.get("partial"):
        st.warning("Stopped early: these metrics cover the samples done before the stop.", icon="💾")
    if rows:
        cols = st.columns(len(rows))
        for col, row in zip(cols, rows):
            base_text = f"base model: {fmt.number(row['baseline'])}" if row["baseline"] is not None else ""
            col.metric(row["metric"], fmt.number(row["value"]),
                       delta=None if row["delta"] is None else f"{row['delta']:+.4f}",
                       delta_color="normal" if row["higher"] else "inverse", border=True,
                       help=" · ".join(filter(None, [METRIC_HELP.get(row["key"], ""), base_text])) or None)
    if metrics.get("preference_implicit_reward") is False and "preference_accuracy" in metrics:
        st.caption("Preference accuracy here is the plain log-prob margin: this model has no reference to compare "
                   "with (a base model, or full fine-tuned weights).")
    if base is not None:
        st.caption(f"Deltas against the base model {safe(baseline.base_model)} on the same data and settings.")
    elif baseline is not None:
        st.caption(f"Base-model baseline: {JobKind.EVAL.status_label(baseline.status).lower()}.")
    else:
        st.caption("No base-model baseline on the same data and settings.")
    st.caption(f"{metrics.get('samples', 0)} sample(s)")
    lm_eval = metrics.get("lm_eval") if isinstance(metrics.get("lm_eval"), dict) else {}
    lm_eval = {task: values for task, values in lm_eval.items() if isinstance(values, dict)}
    if lm_eval:
        st.markdown("**lm-evaluation-harness**")
        st.dataframe(pd.DataFrame([{"task": task, "metric": name, "value": value}
                                   for task, values in lm_eval.items() for name, value in values.items()]),
                     hide_index=True)


def render_samples(samples: pd.DataFrame, key: str = "done") -> None:
    if samples.empty:
        st.caption("No scored samples.")
        return
    choices = [c for c in SORTABLE if c in samples and samples[c].notna().any()]
    by = st.selectbox("Sort by (worst first)", choices, format_func=SORTABLE.get, key=f"{K}sort_{key}") \
        if choices else None
    shown = worst_first(samples, by) if by else samples
    columns = [c for c in ("index", "rank", "wer", "cer", "tool_exact", "tool_arguments", "rouge_l", "bleu", "exact",
                           "judge", "loss", "preferred", "margin", "reward", "prompt", "reference", "answer")
               if c in shown and (c not in SORTABLE and c != "preferred" or shown[c].notna().any())]
    retrieved = "rank" in shown  # an embedding model's rows: a query, its relevant passage, the top hit
    heard = "wer" in shown  # a speech model's rows: a clip, its reference transcript, the model's
    st.dataframe(shown[columns], hide_index=True, column_config={
        "index": st.column_config.NumberColumn("#"),
        "rank": st.column_config.NumberColumn("Rank", format="%d", help="Where the first relevant passage ranked "
                                                                       "(1: the top hit; empty: not in the top 100)"),
        "wer": st.column_config.NumberColumn("WER", format="%.3f"),
        "cer": st.column_config.NumberColumn("CER", format="%.3f"),
        "rouge_l": st.column_config.NumberColumn("ROUGE-L", format="%.3f"),
        "bleu": st.column_config.NumberColumn("BLEU", format="%.1f"),
        "exact": st.column_config.NumberColumn("Exact", format="%.0f"),
        "judge": st.column_config.NumberColumn("Judge", format="%.0f"),
        "loss": st.column_config.NumberColumn("Loss", format="%.3f"),
        "preferred": st.column_config.NumberColumn("Prefers chosen", format="%.0f"),
        "margin": st.column_config.NumberColumn("Margin", format="%.3f"),
        "reward": st.column_config.NumberColumn("Reward", format="%.3f"),
        "tool_exact": st.column_config.NumberColumn("Calls exact", format="%.0f"),
        "tool_arguments": st.column_config.NumberColumn("Arguments", format="%.2f"),
        "prompt": st.column_config.TextColumn("Query" if retrieved else "Clip" if heard else "Prompt", width="medium"),
        "reference": st.column_config.TextColumn("Relevant passage" if retrieved else "Reference", width="medium"),
        "answer": st.column_config.TextColumn("Top hit" if retrieved else "Transcript" if heard else "Answer",
                                              width="medium"),
    })
    if heard:
        _clip_detail(shown, key)
        return
    indices = list(shown["index"])
    pick = st.selectbox("Relevant passage vs top hit" if retrieved else "Reference vs answer", indices,
                        key=f"{K}detail_{key}", format_func=lambda i: f"{'query' if retrieved else 'sample'} {i}")
    row = shown[shown["index"] == pick].iloc[0]
    if "image" in shown:  # an image row: the picture the model was asked about, beside its question
        picture, question = st.columns([1, 3])
        if isinstance(row.get("image"), str):
            picture.image(row["image"], width=160, caption="the image the model saw")
        else:
            picture.caption("No thumbnail (this row had no image, or its thumbnail is gone from the eval's folder).")
        question.markdown("**Prompt**  \n" + safe(row["prompt"], 4000))
    else:
        st.markdown(f"**{'Query' if retrieved else 'Prompt'}**  \n" + safe(row["prompt"], 4000))
    ref_col, ans_col = st.columns(2)
    ref_col.markdown(f"**{'Relevant passage' if retrieved else 'Reference'}**  \n" + safe(row["reference"], 4000))
    ans_col.markdown(f"**{'Top hit' if retrieved else 'Answer'}**  \n" + safe(row["answer"], 4000))
    if retrieved and isinstance(row.get("hits"), list) and row["hits"]:
        st.dataframe(hits_table(row["hits"]), hide_index=True, column_config={
            "text": st.column_config.TextColumn("Passage", width="large"),
            "score": st.column_config.NumberColumn("Score", format="%.3f")})


def _clip_detail(shown: pd.DataFrame, key: str) -> None:
    """One clip (worst first): its audio, the reference and the model's transcript, and jiwer's word alignment."""
    pick = st.selectbox("Clip", list(shown["index"]), key=f"{K}clip_{key}",
                        format_func=lambda i: f"clip {i}: {shown[shown['index'] == i].iloc[0]['prompt']}")
    row = shown[shown["index"] == pick].iloc[0]
    clip = playable_clip(row.get("audio"))
    if clip is not None:
        st.audio(clip, format="audio/wav")
    else:
        st.caption("The clip is not playable here (bytes in the test data, or its file is gone or outside the allowed "
                   "folders).")
    ref_col, ans_col = st.columns(2)
    ref_col.markdown("**Reference**  \n" + safe(row["reference"], 4000))
    ans_col.markdown("**Transcript**  \n" + safe(row["answer"], 4000))
    if isinstance(row.get("alignment"), str) and row["alignment"]:
        st.code(row["alignment"], language=None)  # REF / HYP with S, D, I marks: plain text


def playable_clip(value: Any) -> bytes | None:
    """A clip path read from predictions.jsonl, as the player's decoded WAV (data.audio.playable_wav), only when it
    names a clip where user data lives (a worker wrote the file, but it may run user code: a page never serves a path
    it has not checked, nor a file's own bytes); None otherwise."""
    if not isinstance(value, str) or not value:
        return None
    try:
        found = paths.resolve_data_ref(value, paths.allowed_data_roots())
        return audio_data.playable_wav(str(found)) if found.is_file() else None
    except (paths.UnsafePathError, ValueError):
        return None


def hits_table(hits: list) -> pd.DataFrame:
    """A query's top hits (predictions.jsonl), best first: rank, whether relevant, score, id and text."""
    rows = [{"rank": rank, "relevant": bool(hit.get("relevant")), "score": _number(hit.get("score")),
             "id": str(hit.get("id", "")), "text": str(hit.get("text", ""))}
            for rank, hit in enumerate(hits, 1) if isinstance(hit, dict)]
    return pd.DataFrame(rows, columns=["rank", "relevant", "score", "id", "text"])


# ---------------------------------------------------------------------- starting one
def render_start_form(orch: Orchestrator, run: RunRecord, actor: Actor) -> None:
    steps = model_source.checkpoint_steps(run.id)
    sources = ["final", *[f"step {s}" for s in steps], "base"]
    which = st.selectbox("Model", sources, key=K + "source",
                         format_func=lambda s: {"final": "Final model", "base": "Base model (no fine-tuning)"}.get(s, s))
    data_kind = st.radio("Test data", ["upload", "path", "eval_split", "hub"], horizontal=True, key=K + "data_kind",
                         format_func={"upload": "Upload a file", "path": "Local file", "eval_split": "This run's eval split",
                                      "hub": "Hub dataset (online)"}.get)
    if data_kind == "upload":
        st.file_uploader("Test file", type=UPLOAD_TYPES, key=K + "upload",
                         help="Any training format: alpaca (instruction/output), chatml messages or sharegpt; the "
                              "last assistant reply is the reference answer. Rows with images (a vision run): give "
                              "the file as a local path instead, so its images are read from its folder")
    elif data_kind == "path":
        st.text_input("Path to a test file (retrieval: or a BEIR-like folder)", key=K + "path",
                      help="Image rows (a vision run): image paths are taken from the file's folder and must stay "
                           "under the allowed folders")
    elif data_kind == "hub":
        hub_col, split_col = st.columns([3, 1])
        hub_col.text_input("Dataset id", key=K + "hub", placeholder="org/name")
        split_col.text_input("Split", value="test", key=K + "hub_split")
    method = _method(run.id)
    default = list(_kind_of_method(method).eval_defaults or DEFAULT_METRICS)
    metrics = st.multiselect("Metrics", list(METRICS), default=default,
                             key=K + "metrics",
                             help="preference_accuracy: test data of preference pairs (prompt/chosen/rejected); "
                                  "reward: a GRPO run's reward functions on the answers to the test prompts; "
                                  "retrieval (an embedding run, alone): a BEIR-like folder (corpus.jsonl, "
                                  "queries.jsonl, qrels) or a file of anchor/positive pairs; wer, cer (a speech run): "
                                  "a file with audio and text columns, or an audio folder with metadata.jsonl")
    a, b, c = st.columns(3)
    max_samples = a.number_input("Max samples (0: all)", min_value=0, value=200, step=10, key=K + "max_samples")
    max_new = b.number_input("Max new tokens", min_value=1, max_value=4096, value=128, key=K + "max_new")
    temperature = c.number_input("Temperature (0: greedy)", min_value=0.0, max_value=2.0, value=0.0, step=0.1,
                                 key=K + "temperature")
    with st.expander("LLM judge and benchmarks"):
        judge_url = st.text_input("Judge URL (OpenAI-compatible)", key=K + "judge_url", placeholder="http://127.0.0.1:8000/v1")
        judge_model = st.text_input("Judge model", key=K + "judge_model")
        judge_key_env = st.text_input("Environment variable holding the judge's API key", key=K + "judge_key_env",
                                      help="Its name, e.g. JUDGE_API_KEY: the key itself is never stored")
        rubric = st.text_area("Rubric", value=DEFAULT_RUBRIC, key=K + "rubric", height=160)
        tasks = st.text_input("lm-evaluation-harness tasks (comma-separated names or local task YAML paths)",
                              key=K + "tasks")
    baseline = st.checkbox("Compare with the base model (computed once per test data and settings)", value=True,
                           key=K + "baseline", disabled=which == "base")
    launcher, gpus = job_place(K + "launcher", "eval", "; its test file must be readable there too")
    if not st.button("Start evaluation", type="primary", icon="🧪", key=K + "start"):
        return
    data, problem = _data_value(data_kind, run.id)
    if problem:
        st.error(safe(shown(problem, actor)))
        return
    try:
        source = (model_source.ModelSource(model=model_source.run_config(run.id).model_name) if which == "base" else
                  model_source.ModelSource(run_id=run.id,
                                           checkpoint=None if which == "final" else int(which.split()[1])))
        spec = EvalSpec(source=source, data=data, metrics=list(metrics), max_samples=int(max_samples),
                        max_new_tokens=int(max_new), temperature=float(temperature), judge_url=judge_url.strip(),
                        judge_model=judge_model.strip(), judge_key_env=judge_key_env.strip(), judge_rubric=rubric,
                        lm_eval_tasks=[t.strip() for t in tasks.split(",") if t.strip()],
                        hub_split=st.session_state.get(K + "hub_split", "test") or "test",
                        baseline=bool(baseline) and which != "base",
                        batch_size=32 if "retrieval" in metrics else EvalSpec.batch_size,  # texts encoded together
                        reward_run=run.id if "reward" in metrics else "",  # the base model scored with its rewards
                        launcher=launcher, ray_gpus_per_worker=gpus)
        job_id, baseline_id = orch.start_eval(spec, actor=actor)
    except ConfigError as exc:
        st.error("  \n".join(f"**{safe(e.field)}**: {safe(shown(e.message, actor))}" for e in exc.errors))
        return
    except (model_source.SourceError, RunRefused) as exc:
        st.error(safe(shown(exc, actor)))
        return
    st.success(f"Evaluation {code(job_id)} submitted" + (f"; base-model baseline {code(baseline_id)}" if baseline_id else ""),
               icon="🧪")


def _kind_of_method(method: str) -> kinds.ModelKind:
    """The model kind of a run of ``method`` (text when unknown): its row names the metrics the form picks first."""
    return kinds.of_output(methods.METHODS[method].output if method in methods.METHODS else "text")


def _method(run_id: str) -> str:
    try:
        return model_source.run_config(run_id).method
    except model_source.SourceError:
        return ""


def _data_value(kind: str, run_id: str) -> tuple[str, str]:
    """(the spec's data value, a problem to show)."""
    state = st.session_state
    if kind == "eval_split":
        return EVAL_SPLIT_PREFIX + run_id, ""
    if kind == "hub":
        hub = (state.get(K + "hub") or "").strip()
        return (HUB_PREFIX + hub, "") if hub else ("", "data: enter a hub dataset id")
    if kind == "path":
        path = (state.get(K + "path") or "").strip()
        return (path, "") if path else ("", "data: enter the path of a test file")
    upload = state.get(K + "upload")
    if upload is None:
        return "", "data: choose a test file to upload (.jsonl, .json, .csv or .parquet)"
    try:
        return str(save_upload(upload.name, upload)), ""  # content-addressed: the same file is stored once
    except DatasetError as exc:
        return "", f"data: {exc.message}"
