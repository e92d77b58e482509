"""The eval worker: one process per eval job (``python -m trainer_core.worker RUN_DIR`` for kind eval).

Lifecycle, top to bottom: read the spec -> read the test data -> load the model source -> per batch of
samples: generate, score, write a line of predictions.jsonl and report -> lm-evaluation-harness tasks ->
results.json -> report. Prompts are built exactly as training builds them (the run's chat template, its
format mapping, the prompt/completion split of ``token_cache``), so the loss here is the loss training
reports on the same rows. Stop ends between samples and keeps the results so far; Cancel ends without them.
``preference_accuracy`` (pairs) and ``reward`` (a GRPO run's rewards on the answers) are worker/eval_metrics.py;
an eval asking for neither generation nor reward metrics (only preference_accuracy, perplexity) generates nothing.
``retrieval`` (an embedding model) takes its own short path, ``run_retrieval``: load with sentence-transformers,
run its InformationRetrievalEvaluator, then a row per query and the result, as the other metrics report them.
Image rows (a vision model; evaluation/vision.py) take the same lifecycle with the model's processor: each question
is answered with its image (worker/vision_eval.py), scored by the text metrics, and keeps a thumbnail in the job folder.

Kept whole: the eval worker's lifecycle (load, answer or score each sample, baseline, conclude) with one runner per
kind of eval (text, retrieval, speech, images) over the same reporting.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path

from trainer_core.specs import jobspec, model_source
from trainer_core.evaluation import retrieval, speech
from trainer_core.evaluation import vision as eval_vision
from trainer_core.evaluation import samples as eval_samples
from trainer_core.evaluation import scoring, tool_scoring
from trainer_core.evaluation.judge import Judge, JudgeUnavailable, with_tools
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.protocol import control, events as ev
from trainer_core.protocol.status import RunStatus
from trainer_core.worker.job import JobWorker
from trainer_core.data.tool_calls import template_messages
from trainer_core.worker.safe_prompt import chat_batch, chat_ids

PREDICTIONS = "predictions.jsonl"
RESULTS = "results.json"
TEXT_CAP = 20_000  # characters of a prompt/answer kept in an event (predictions.jsonl keeps them whole)


class Cancelled(Exception):
    """A Stop or Cancel request before any sample was scored."""

    def __init__(self, action: control.Action):
        super().__init__(action.value)
        self.action = action


class NothingToScore(Exception):
    """No test row can be scored; the message says why and what to change."""


def prompt_text(messages: list[dict]) -> str:
    """A prompt's turns as plain text: the one user turn alone, or 'role: content' per turn (an image part as
    <image>)."""
    if len(messages) == 1:
        return eval_samples.part_text(messages[0]["content"])
    return "\n\n".join(f"{m['role']}: {eval_samples.part_text(m['content'])}" for m in messages)


class Evaluator(JobWorker):
    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        self.begin()
        try:
            spec = jobspec.read_spec(self.run_dir)
            assert isinstance(spec, EvalSpec)
            if spec.judge_key_env and os.environ.get(spec.judge_key_env):
                self.secrets.append(os.environ[spec.judge_key_env])
            if retrieval.wanted(spec):
                return self.run_retrieval(spec)
            if speech.wanted(spec):
                return self.run_speech(spec)
            self.status(RunStatus.STARTING, "reading test data")
            samples, left_out = eval_samples.load_samples(spec) if spec.data.strip() else ([], None)
            if left_out:
                self.warn(left_out)  # one warning, however many rows and reasons
            fingerprint = eval_samples.fingerprint(spec) if spec.data.strip() else ""
            self.check_cancel()

            self.status(RunStatus.STARTING, "loading model")
            resolved = model_source.resolve(spec.source)
            seeing = any(sample.images for sample in samples)  # image rows: answered with their images
            model, tokenizer, device = self.load_seeing(resolved) if seeing else self.load(resolved)
            if any(sample.tools for sample in samples) and not seeing:
                self.show_tools(tokenizer)
            samples = self.fitting_images(samples, model, tokenizer, spec) if seeing else \
                self.fitting(samples, model, tokenizer, spec)
            self.check_cancel()
            if eval_samples.PAIRS_METRIC in spec.metrics and not _metrics().has_reference(model) \
                    and not spec.source.is_base:
                self.warn(f"{resolved.label} is full fine-tuned weights, with no base in memory to compare with: "
                          "preference_accuracy uses its plain log-prob margin, as for a base model")
            scorer = None
            if eval_samples.REWARD_METRIC in spec.metrics and samples:
                scorer = _metrics().RewardScorer(spec.reward_run or spec.source.run_id, self.warn)

            if samples:
                self.status(RunStatus.RUNNING, "generating")
            rows, action = self.evaluate(spec, samples, model, tokenizer, device, scorer)
            metrics = scoring.overall([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], spec.metrics) \
                if samples else {}
            if scorer is not None and scorer.failed:  # the metric is missing, never a total of fewer rewards
                for name in ["", *scorer.failed]:
                    metrics.pop(f"reward/{name}" if name else "reward", None)
            if seeing:  # the Evaluation tab reads the rows' thumbnails from predictions.jsonl
                metrics[eval_vision.IMAGES_KEY] = sum(1 for sample in samples[:len(rows)] if sample.images)
            if eval_samples.PAIRS_METRIC in spec.metrics and samples:
                metrics["preference_implicit_reward"] = _metrics().has_reference(model)
            if action is control.Action.CANCEL:
                self.finish(RunStatus.CANCELLED, len(rows))
                return 0
            if spec.lm_eval_tasks and action is None:
                self.status(RunStatus.RUNNING, "lm-evaluation-harness")
                from trainer_core.worker import benchmarks

                metrics["lm_eval"] = benchmarks.run_tasks(spec, model, tokenizer, log=self.log)
            metrics["partial"] = action is not None
            self.conclude(spec, resolved, fingerprint, metrics, len(samples), len(rows), action)
            return 0
        except Cancelled as request:  # before any sample: nothing to keep either way, but a Stop is a Stop
            stopped = request.action is control.Action.STOP
            self.log(f"{'stopped' if stopped else 'cancelled'} before any sample was scored: nothing to keep")
            self.finish(RunStatus.STOPPED if stopped else RunStatus.CANCELLED, 0)
            return 0
        except BaseException as exc:  # process boundary: report every failure, then exit non-zero
            self.fail(exc)
            return 1
        finally:
            self.end()

    def run_retrieval(self, spec: EvalSpec) -> int:
        """An embedding model on a retrieval set: read it, load the model, evaluate (one pass of the evaluator: Stop
        and Cancel are honoured before it and after it), a row per query, the result."""
        self.status(RunStatus.STARTING, "reading the retrieval set")
        ir = retrieval.load_set(spec)
        fingerprint = retrieval.set_fingerprint(ir)  # the baseline's key (eval_samples.fingerprint's for retrieval)
        ir = retrieval.capped(ir, spec.max_samples)
        self.log(f"{len(ir.queries):,} queries against a corpus of {len(ir.corpus):,} passages")
        self.check_cancel()
        self.status(RunStatus.STARTING, "loading model")
        from trainer_core.worker import retrieval_eval  # sentence-transformers, torch: for this metric only

        resolved = model_source.resolve(spec.source)
        model = retrieval_eval.load_model(resolved, spec.max_seq_length, self.warn, self.log)
        self.check_cancel()
        self.status(RunStatus.RUNNING, "encoding queries and corpus")
        started = time.time()
        metrics, rows = retrieval_eval.evaluate(model, ir, spec, self.run_dir)
        self.log(f"{len(rows)} queries scored in {time.time() - started:.1f} s")
        action = self.requested()
        if action is control.Action.CANCEL:
            self.finish(RunStatus.CANCELLED, 0)
            return 0
        with Predictions(self.run_dir / PREDICTIONS, self.warn) as predictions:
            for row in rows:
                line = {"index": row.index, "query_id": row.query_id, "prompt": row.query, "reference": row.relevant,
                        "answer": row.top, "rank": row.rank, "hits": row.hits}
                predictions.write(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n", row.index)
                self.events.emit(ev.EvalSampleEvent(index=row.index, prompt=row.query[:TEXT_CAP],
                                                    reference=row.relevant[:TEXT_CAP], answer=row.top[:TEXT_CAP]))
        elapsed = time.time() - started
        self.events.emit(ev.ProgressEvent(step=len(rows), total_steps=len(rows), elapsed_s=elapsed, eta_s=0.0))
        metrics["partial"] = False  # the evaluator scores every query in one pass: a Stop keeps whole results
        self.conclude(spec, resolved, fingerprint, metrics, len(rows), len(rows), action)
        return 0

    def run_speech(self, spec: EvalSpec) -> int:
        """A speech-to-text model on test clips: transcribe them a batch at a time (Stop/Cancel between batches),
        a row per clip with its WER, CER and word alignment, then the set's WER and CER (jiwer, over all words, as
        training's eval reports them)."""
        import torch
        from transformers import AutoProcessor

        from trainer_core.worker.methods import stt
        from trainer_core.worker.sources import load_source, processor_folder

        self.status(RunStatus.STARTING, "reading the test clips")
        rows, left_out = speech.load_clips(dataclasses.replace(spec, max_samples=0))  # read once, hashed whole
        if left_out:  # the set's WER covers the clips scored: say which were not, and why
            self.warn(left_out)
        fingerprint = speech.set_fingerprint(rows)  # the baseline's key (eval_samples.fingerprint's for speech)
        rows = rows[:spec.max_samples] if spec.max_samples else rows
        self.log(f"{len(rows):,} test clip(s)")
        self.check_cancel()
        self.status(RunStatus.STARTING, "loading model")
        resolved = model_source.resolve(spec.source)
        device = "cuda" if torch.cuda.is_available() and os.environ.get("FINETUNE_STUDIO_FORCE_CPU") != "1" else "cpu"
        model, _ = load_source(resolved, device, log=self.log)
        processor = AutoProcessor.from_pretrained(processor_folder(resolved, log=self.log))
        self.log(f"Loaded {resolved.label} on {device}")
        self.check_cancel()
        self.status(RunStatus.RUNNING, "transcribing")
        started, references, hypotheses, action = time.time(), [], [], None
        batch = max(1, int(spec.batch_size))
        with Predictions(self.run_dir / PREDICTIONS, self.warn) as predictions:
            for first in range(0, len(rows), batch):
                action = self.requested()
                if action is not None:
                    break
                chunk = rows[first:first + batch]
                texts = stt.transcribe(model, processor, [r["audio"] for r in chunk], spec.max_new_tokens)
                for offset, (row, text) in enumerate(zip(chunk, texts)):
                    index = first + offset
                    rates = stt.error_rates([row["text"]], [text])
                    name = speech.clip_name(row["audio"], index)
                    line = {"index": index, "prompt": name, "reference": row["text"], "answer": text,
                            "wer": rates.get("wer"), "cer": rates.get("cer"),
                            "alignment": stt.alignment(row["text"], text),
                            "audio": row["audio"] if isinstance(row["audio"], str) else None}
                    predictions.write(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n", index)
                    # the sample table has no error-rate columns: WER/CER per clip live in predictions.jsonl
                    self.events.emit(ev.EvalSampleEvent(index=index, prompt=name, reference=row["text"][:TEXT_CAP],
                                                        answer=text[:TEXT_CAP]))
                    references.append(row["text"])
                    hypotheses.append(text)
                elapsed = time.time() - started
                done = len(references)
                self.events.emit(ev.ProgressEvent(step=done, total_steps=len(rows), elapsed_s=elapsed,
                                                  eta_s=elapsed / done * (len(rows) - done)))
        if action is control.Action.CANCEL:
            self.finish(RunStatus.CANCELLED, len(references))
            return 0
        if not references:  # a Stop before the first batch: nothing scored, nothing cached as a baseline
            raise Cancelled(action or control.Action.STOP)
        metrics: dict = dict(stt.error_rates(references, hypotheses))
        metrics.update(clips=len(references), samples=len(references), seconds=round(time.time() - started, 3),
                       partial=action is not None)
        self.conclude(spec, resolved, fingerprint, metrics, len(rows), len(references), action)
        return 0

    def load(self, resolved: model_source.ResolvedSource):
        import torch

        from trainer_core.worker.sources import load_source

        device = "cuda" if torch.cuda.is_available() and os.environ.get("FINETUNE_STUDIO_FORCE_CPU") != "1" else "cpu"
        model, tokenizer = load_source(resolved, device, log=self.log)
        if not tokenizer.chat_template:
            raise ValueError(f"{resolved.label} has no chat template, so prompts cannot be built as in training: "
                             "evaluate an instruct/chat model, or a run (its tokenizer carries the template it "
                             "trained with)")
        tokenizer.padding_side = "left"  # generation continues every prompt of a batch from its last token
        self.log(f"Loaded {resolved.label} on {device}")
        return model, tokenizer, device

    def show_tools(self, tokenizer) -> None:
        """Rows with tools (metric tool_calls): the model sees each row's tools through its chat template (a run's is the one it trained
        with); a template that ignores tools gets the Hermes tool template, as a run on tool data does (tool_template
        auto), so a base model and its runs are asked the same way."""
        from trainer_core.export import tool_templates
        from trainer_core.worker.tool_template import own_renders_tools

        try:
            choice = tool_templates.choose(own_renders_tools(tokenizer), tokenizer.chat_template,
                                           tokenizer.eos_token or "", "auto")
        except tool_templates.ToolTemplateError as exc:
            raise NothingToScore(f"{exc} (tool_calls shows the model each row's tools)") from None
        if choice.template is not None:
            tokenizer.chat_template = choice.template
        self.log(f"Tools shown with {choice.label}")

    def load_seeing(self, resolved: model_source.ResolvedSource):
        """(model, processor, device) of a vision-language model: the processor it trained with renders every row."""
        import torch
        from transformers import AutoProcessor, ProcessorMixin

        from trainer_core.worker.sources import load_source, processor_folder

        if not resolved.sees_images:  # validation refuses it; a job.json edited by hand meets it here
            raise NothingToScore(f"source: {resolved.label} reads text only, but the test rows hold images: evaluate "
                                 "a vision run or a vision-language base model")
        device = "cuda" if torch.cuda.is_available() and os.environ.get("FINETUNE_STUDIO_FORCE_CPU") != "1" else "cpu"
        model, _ = load_source(resolved, device, log=self.log)
        processor = AutoProcessor.from_pretrained(processor_folder(resolved, log=self.log))
        if not isinstance(processor, ProcessorMixin) or not processor.chat_template:
            raise NothingToScore(f"{resolved.label} has no processor with a chat template, so its image rows cannot "
                                 "be rendered as in training: evaluate a vision run (it saved its processor)")
        self.log(f"Loaded {resolved.label} on {device} with its processor")
        return model, processor, device

    def fitting_images(self, samples: list, model, processor, spec: EvalSpec) -> list:
        """``fitting`` for image rows: each prompt with its images' tokens (every image opened here, so an unreadable
        one is named with its row before anything is generated)."""
        from trainer_core.worker import vision_eval

        context = vision_eval.context_of(model)
        lengths = [vision_eval.prompt_length(processor, sample, spec.image_max_side) for sample in samples]  # ImageUnreadable names the row
        if not context:
            return samples
        new_tokens = spec.max_new_tokens if generates(spec) else 0
        fit = [sample for sample, length in zip(samples, lengths) if length + new_tokens <= context]
        if not fit:
            raise NothingToScore(f"none of the {len(samples):,} test row(s) fits the model's context of {context:,} "
                                 f"tokens with its images and max_new_tokens {spec.max_new_tokens}: lower "
                                 "max_new_tokens, or resize the images")
        if len(fit) < len(samples):
            self.warn(f"Left out {len(samples) - len(fit):,} of {len(samples):,} test row(s) whose prompt, images and "
                      f"max_new_tokens ({spec.max_new_tokens}) do not fit the model's context of {context:,} tokens")
        return fit

    def fitting(self, samples: list, model, tokenizer, spec: EvalSpec) -> list:
        """The samples whose prompt and answer fit the model's context; the others are left out with one warning
        (generating them would fail, or run out of memory padding the whole batch to their length)."""
        context = getattr(model.config, "max_position_embeddings", None)
        if not context or not samples:
            return samples
        new_tokens = spec.max_new_tokens if generates(spec) else 0
        fit = []
        for sample in samples:
            ids = prompt_ids(tokenizer, sample)  # message text as text (worker/safe_prompt.py)
            pair = _metrics().pair_lengths(tokenizer, sample.prompt, sample.chosen, sample.rejected) \
                if eval_samples.PAIRS_METRIC in spec.metrics else 0
            if len(ids) + new_tokens <= context and pair <= context:
                fit.append(sample)
        if not fit:  # nothing would be scored: a failure, never a completed (and cached) eval of 0 samples
            raise NothingToScore(f"none of the {len(samples):,} test row(s) fits the model's context of {context:,} "
                                 f"tokens with max_new_tokens {spec.max_new_tokens}: shorten the rows, lower "
                                 "max_new_tokens, or evaluate a model with a longer context")
        if len(fit) < len(samples):
            self.warn(f"Left out {len(samples) - len(fit):,} of {len(samples):,} test row(s) whose prompt and "
                      f"max_new_tokens ({spec.max_new_tokens}) do not fit the model's context of {context:,} tokens: "
                      "shorten those rows or lower max_new_tokens")
        return fit

    def evaluate(self, spec: EvalSpec, samples: list, model, tokenizer, device: str,
                 scorer: "RewardScorer | None" = None):
        """Generate and score every sample; returns ([(scores, answer, reference)], the control action that
        ended it early or None)."""
        judge = self.make_judge(spec)
        seeing = any(s.images for s in samples)  # image rows: ``tokenizer`` is the model's processor
        rows: list[tuple[scoring.SampleScores, str, str]] = []
        started = time.time()
        action = None
        # "w": the worker runs once per job folder; the file grows a line per sample, flushed as it goes.
        predictions = Predictions(self.run_dir / PREDICTIONS, self.warn)
        with predictions:
            for first in range(0, len(samples), spec.batch_size):
                action = self.requested()
                if action is not None:
                    break
                batch = samples[first:first + spec.batch_size]
                if not generates(spec):
                    answers = [""] * len(batch)
                elif seeing:  # every row of an image set through the processor (one without an image too)
                    answers = _vision().generate(model, tokenizer, batch, spec, device)
                else:
                    answers = generate(model, tokenizer, [s.prompt for s in batch], spec, device,
                                       tools=[s.tools for s in batch])
                rewarded = scorer.score(batch, answers) if scorer is not None else [(None, None)] * len(batch)
                for sample, answer, (reward, rewards) in zip(batch, answers, rewarded):
                    action = self.requested()
                    if action is not None:
                        break
                    scores = scoring.score_text(answer, sample.reference, spec.metrics)
                    if "perplexity" in spec.metrics and seeing:
                        scores.loss, scores.tokens = _vision().answer_loss(model, tokenizer, sample, device,
                                                                           spec.image_max_side)
                    elif "perplexity" in spec.metrics:
                        scores.loss, scores.tokens = answer_loss(model, tokenizer, sample.prompt, sample.reference,
                                                                 device)
                    scores.reward, scores.rewards = reward, rewards
                    extra = {}
                    if eval_samples.TOOL_METRIC in spec.metrics:
                        scores.tool = tool_scoring.score_tool_answer(list(sample.calls), answer, sample.tools)
                        extra = tool_scoring.per_sample(scores.tool)
                    if eval_samples.PAIRS_METRIC in spec.metrics:
                        scores.preferred, scores.margin, extra = _metrics().prefers(model, tokenizer, sample, device)
                    prompt = prompt_text(sample.prompt)
                    if judge is not None:  # the judge sees the tools the model was offered
                        judge = self.judge_one(judge, scores, with_tools(prompt, sample.tools), sample.reference,
                                               answer)
                    rows.append((scores, answer, sample.reference))
                    line = {"index": sample.index, "prompt": prompt, "reference": sample.reference, "answer": answer,
                            **{k: v for k, v in vars(scores).items() if k not in ("tokens", "tool")},
                            "tokens": scores.tokens,
                            **extra}
                    if sample.images:  # a thumbnail in this job's folder: what the model saw, shown beside it
                        line["image"] = _vision().save_thumbnail(sample, self.run_dir)
                    predictions.write(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n", len(rows) - 1)
                    self.events.emit(ev.EvalSampleEvent(
                        index=sample.index, prompt=prompt[:TEXT_CAP], reference=sample.reference[:TEXT_CAP],
                        answer=answer[:TEXT_CAP], exact=scores.exact, rouge_l=scores.rouge_l, bleu=scores.bleu,
                        loss=scores.loss, tokens=scores.tokens, judge=scores.judge))
                    done = len(rows)
                    elapsed = time.time() - started
                    self.events.emit(ev.ProgressEvent(step=done, total_steps=len(samples), elapsed_s=elapsed,
                                                      eta_s=elapsed / done * (len(samples) - done)))
                if action is not None:
                    break
        if judge is not None:
            judge.close()
        if rows:
            self.log(f"{len(rows)} sample(s) in {time.time() - started:.1f} s "
                     f"({(time.time() - started) / len(rows):.2f} s per sample)")
        return rows, action

    def make_judge(self, spec: EvalSpec) -> Judge | None:
        if "judge" not in spec.metrics:
            return None
        key = os.environ.get(spec.judge_key_env, "") if spec.judge_key_env else ""
        if spec.judge_key_env and not key:
            self.warn(f"{spec.judge_key_env} is not set in the worker's environment: calling the judge without a key")
        return Judge(spec.judge_url, spec.judge_model, spec.judge_rubric, api_key=key)

    def judge_one(self, judge: Judge, scores: scoring.SampleScores, prompt: str, reference: str,
                  answer: str) -> Judge | None:
        """Score one answer; an unreachable judge is one warning for the run and no more calls."""
        try:
            scores.judge, reply = judge.score(prompt, reference, answer)
        except JudgeUnavailable as exc:
            self.warn(f"LLM judge unavailable, the judge column stays empty for this eval: {exc}")
            judge.close()
            return None
        if scores.judge is None:
            self.log(f"the judge gave no 1-10 score (a reply of {len(reply):,} characters)")  # never its text
        return judge

    def conclude(self, spec: EvalSpec, resolved, fingerprint: str, metrics: dict, total: int, done: int,
                 action: control.Action | None) -> None:
        """An eval's end with results, whatever it scored: results.json, the result event (the store and the
        baseline cache take it from there), then completed, or stopped when a Stop cut it short."""
        self.write_results(spec, resolved, fingerprint, metrics, total)
        self.events.emit(ev.EvalResultEvent(
            source_key=spec.source.key, base_model=resolved.base_model, data_fingerprint=fingerprint,
            settings_hash=eval_samples.settings_hash(spec), metrics=metrics, source_run_id=spec.source.run_id,
            checkpoint=spec.source.checkpoint, data_label=spec.dataset_label))
        self.finish(RunStatus.STOPPED if action else RunStatus.COMPLETED, done)

    def write_results(self, spec: EvalSpec, resolved, fingerprint: str, metrics: dict, total: int) -> None:
        data = {"source": spec.source.key, "label": resolved.label, "base_model": resolved.base_model,
                "data": spec.data, "data_fingerprint": fingerprint, "settings_hash": eval_samples.settings_hash(spec),
                "samples_total": total, "metrics": metrics}
        tmp = self.run_dir / f".{RESULTS}.tmp"
        tmp.write_text(json.dumps(data, indent=1, allow_nan=False))
        os.replace(tmp, self.run_dir / RESULTS)  # complete or absent, never half-written

    # ------------------------------------------------------------------ reporting and control
    def finish(self, status: RunStatus, done: int) -> None:
        self.events.emit(ev.CompleteEvent(status=status.value, output_dir=str(self.run_dir), steps=done))
        self.log(f"finished: {status.value} after {done} sample(s)")

    def fail(self, exc: BaseException) -> None:
        named = isinstance(exc, NothingToScore) or type(exc).__name__ == "ImageUnreadable"  # their text names the fix
        self.report_error(str(exc) if named else f"{type(exc).__name__}: {exc}", exc)

    def check_cancel(self) -> None:
        action = self.requested()
        if action is not None:  # before any sample: nothing to keep
            raise Cancelled(action)


class Predictions:
    """predictions.jsonl, a line per sample, flushed as it goes. A file deleted or replaced while the eval
    runs (its lines would go to a file nobody can read) is noticed before the next line: one warning, and a
    new file from there on."""

    def __init__(self, path: Path, warn):
        self.path, self.warn = path, warn
        self.out = None

    def __enter__(self) -> "Predictions":
        self.out = open(self.path, "w", encoding="utf-8")
        return self

    def __exit__(self, *exc) -> None:
        self.out.close()

    def write(self, line: str, written_before: int) -> None:
        if not self._still_ours():
            self.out.close()
            self.out = open(self.path, "w", encoding="utf-8")
            self.warn(f"{self.path.name} was deleted or replaced while the eval ran: started it again; the "
                      f"{written_before:,} sample(s) scored before are in the job's events and the Evaluation tab, "
                      "not in the new file")
        self.out.write(line)
        self.out.flush()

    def _still_ours(self) -> bool:
        try:
            now, ours = os.stat(self.path), os.fstat(self.out.fileno())
            return (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino)
        except FileNotFoundError:
            return False


# ---------------------------------------------------------------------- model calls
def generates(spec: EvalSpec) -> bool:
    """Whether the eval needs the model's own answers (a metric scores them)."""
    return any(metric in eval_samples.GENERATION_METRICS for metric in spec.metrics)


def prompt_ids(tokenizer, sample) -> list[int]:
    """A sample's prompt ids (``tool_prompt_ids`` with its tools)."""
    return tool_prompt_ids(tokenizer, sample.prompt, sample.tools)


def tool_prompt_ids(tokenizer, prompt: list[dict], tools: str) -> list[int]:
    """A prompt's ids; with tools (JSON text, "" for none) rendered with them, its turns' calls parsed as templates
    take them."""
    if not tools:
        return chat_ids(tokenizer, prompt)
    messages, shown = template_messages({"messages": prompt, "tools": tools})
    return chat_ids(tokenizer, messages, tools=shown)


def generate(model, tokenizer, prompts: list[list[dict]], spec: EvalSpec, device: str,
             tools: list[str] | None = None) -> list[str]:
    """Answers to a batch of chat prompts (left-padded; ``tools``: each prompt's tools as JSON text, shown to the
    model), greedy unless the spec sets a temperature."""
    import torch
    from transformers import set_seed

    set_seed(spec.seed)
    if tools and any(tools):
        inputs = tokenizer.pad({"input_ids": [tool_prompt_ids(tokenizer, p, t) for p, t in zip(prompts, tools)]},
                               padding=True, return_tensors="pt").to(device)
    else:  # left-padded; message text as text (worker/safe_prompt.py)
        inputs = chat_batch(tokenizer, prompts).to(device)
    sampling = spec.temperature > 0
    options = dict(max_new_tokens=spec.max_new_tokens, do_sample=sampling, repetition_penalty=spec.repetition_penalty,
                   pad_token_id=tokenizer.pad_token_id)
    if sampling:
        options.update(temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k or None)
    else:  # the model's generation_config may carry sampling values; greedy must not warn about or use them
        options.update(temperature=None, top_p=None, top_k=None)
    with torch.inference_mode():
        output = model.generate(**inputs, **options)
    new_tokens = output[:, inputs["input_ids"].shape[1]:]
    return [text.strip() for text in tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]


def answer_loss(model, tokenizer, prompt: list[dict], reference: str, device: str) -> tuple[float | None, int]:
    """(mean negative log-likelihood of the reference answer's tokens given the prompt, their count): the
    tokens training on completions trains on (``token_cache.encode``, end-of-turn token included); the
    prompt's tokens are masked out."""
    import torch
    import torch.nn.functional as F

    from trainer_core.worker.token_cache import encode

    encoded = encode(tokenizer, {"prompt": prompt, "completion": [{"role": "assistant", "content": reference}]})
    ids = torch.tensor([encoded.input_ids], device=device)
    mask = torch.tensor(encoded.completion_mask[1:], dtype=torch.bool, device=device)
    tokens = int(mask.sum())
    if not tokens:
        return None, 0
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, :-1].float()
    nll = F.cross_entropy(logits[mask], ids[0, 1:][mask], reduction="sum")
    loss = float(nll) / tokens
    return (loss if math.isfinite(loss) else None), tokens


def main(run_dir: Path) -> int:
    """The entry point of an eval job (``python -m trainer_core.worker RUN_DIR`` picks it by kind)."""
    return Evaluator(run_dir).run()


def _vision():
    """worker/vision_eval.py, imported for image rows: it imports torch, PIL and transformers at its top."""
    from trainer_core.worker import vision_eval

    return vision_eval


def _metrics():
    """worker/eval_metrics.py, imported when an eval scores pairs or rewards: it imports torch and trl at its
    top, and this module is imported without them (the dashboard's tests use its pure helpers)."""
    from trainer_core.worker import eval_metrics

    return eval_metrics
