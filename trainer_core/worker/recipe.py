"""The data-recipe job: seed rows from documents or a dataset, NeMo Data Designer's generation against the recipe's
model endpoints (a child in Data Designer's own venv: recipe_child.py), and each finished batch checked (output
template, validators, duplicates) into kept and set-aside rows (trainer_core/recipes/store.py), then published as a
dataset version with its card.

Stop ends the generation and publishes the rows kept so far; Cancel publishes nothing; a job killed, failed or
stopped is continued by a new job with ``resume_from``: it takes over the old job's seeds, Data Designer's finished
batches (ResumeMode.ALWAYS) and rows, so no row is lost or made twice. The teacher's key reaches only the child that
calls it, through its environment.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer_core.protocol import control, events as ev, paths
from trainer_core.protocol.status import RunStatus
from trainer_core.recipes import store, user_code
from trainer_core.recipes.checking import Checker, RecipeError, endpoints, prepare_seeds
from trainer_core.recipes.spec import RecipeSpec
from trainer_core.specs import jobspec
from trainer_core.worker.job import JobWorker

CHILD = Path(__file__).with_name("recipe_child.py")
DD_VENV_ENV = "FINETUNE_STUDIO_DD_VENV"
DD_ARTIFACTS, DD_DATASET = "dd", "records"
TEACHER_WAIT_S = float(os.environ.get("FINETUNE_STUDIO_TEACHER_WAIT_S", "900"))
USAGE = ("tokens_in", "tokens_out", "requests_ok", "requests_failed")
TAKEN_OVER = ("seeds.jsonl", "sources.json", DD_ARTIFACTS, store.ROWS_DIR, "usage.json", user_code.FOLDER)


def dd_python() -> Path:
    """The Python of Data Designer's venv: FINETUNE_STUDIO_DD_VENV, else .venv-dd beside this venv."""
    venv = os.environ.get(DD_VENV_ENV) or str(Path(sys.prefix).parent / ".venv-dd")
    return Path(venv) / "bin" / "python"


def child_env(keys: dict[str, str]) -> dict[str, str]:
    """The child's environment: the worker's, without the studio on its path (Data Designer's venv has its own
    packages), and the model keys it sends."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(keys)
    return env


class Interrupted(Exception):
    def __init__(self, action: control.Action):
        super().__init__(action.value)
        self.action = action


class RecipeJob(JobWorker):
    def run(self) -> int:
        self.begin()
        self.child: subprocess.Popen | None = None
        try:
            spec = jobspec.read_spec(self.run_dir)
            assert isinstance(spec, RecipeSpec), type(spec)
            self.spec = spec
            self.status(RunStatus.STARTING, "preparing sources")
            if spec.resume_from:
                self.take_over(spec.resume_from)
            seeds = prepare_seeds(spec, self.run_dir, self.warn)
            self.status(RunStatus.STARTING, "waiting for the models" if spec.uses_teacher() else "starting")
            providers, model_configs, keys = endpoints(spec, self.run_dir, TEACHER_WAIT_S, self.interrupt)
            self.secrets += [v for v in keys.values() if v]
            self.checker = Checker(spec, self.run_dir)
            self.checker.remember(store.kept_rows(self.run_dir))
            self.usage = self._read_usage()
            self.started = time.monotonic()
            self.made_here = 0
            self.status(RunStatus.RUNNING, "generating")
            stopped = False
            try:
                self.catch_up()
                if store.counts(self.run_dir).made < spec.num_rows:
                    self.generate(seeds, providers, model_configs, keys)
            except Interrupted as exc:
                if exc.action is control.Action.CANCEL:
                    raise
                stopped = True
                self.warn("Stop requested: publishing the rows kept so far")
            self.catch_up()  # a batch Data Designer finished while it was being stopped
            folder = self.publish(stopped)
            self.events.emit(ev.CompleteEvent(status=(RunStatus.STOPPED if stopped else RunStatus.COMPLETED).value,
                                              output_dir=str(folder), steps=store.counts(self.run_dir).made))
            return 0
        except Interrupted as exc:  # Cancel; or Stop before any record was asked for (nothing to publish)
            ended = RunStatus.STOPPED if exc.action is control.Action.STOP else RunStatus.CANCELLED
            self.events.emit(ev.CompleteEvent(status=ended.value, steps=store.counts(self.run_dir).made))
            return 0
        except BaseException as exc:  # process boundary: report every failure, then exit non-zero
            made = store.counts(self.run_dir)
            kept = (f" The {made.kept} rows kept so far ({made.made} made) stay in this job's folder: resume it to "
                    "continue.") if made.made else ""
            message = str(exc) if isinstance(exc, RecipeError) else f"{type(exc).__name__}: {exc}"
            self.report_error(message + kept, exc)
            return 1
        finally:
            self._end_child()
            if getattr(self, "checker", None) is not None:
                self.checker.close()
            self.end()

    def interrupt(self) -> None:
        """Raises Interrupted when Stop or Cancel was asked for (while the models are waited for)."""
        action = self.requested()
        if action is not None:
            raise Interrupted(action)

    # ---- resume
    def take_over(self, old_id: str) -> None:
        """The old job's seeds, Data Designer's batches and rows, copied: the old folder stays as it was."""
        old = paths.run_dir(old_id)
        old_spec = jobspec.read_spec(old)
        if not isinstance(old_spec, RecipeSpec):
            raise RecipeError(f"resume_from: {old_id} is not a recipe job")
        if old_spec.batch_size != self.spec.batch_size:
            raise RecipeError(f"resume_from: {old_id} made batches of {old_spec.batch_size} records; resume with "
                              f"batch_size {old_spec.batch_size} (Data Designer continues batch by batch)")
        for name in TAKEN_OVER:
            source, target = old / name, self.run_dir / name
            if source.is_dir() and not target.exists():
                shutil.copytree(source, target, symlinks=True)
            elif source.is_file() and not target.exists():
                shutil.copy2(source, target)
        done = store.counts(self.run_dir)
        self.log(f"continuing {old_id}: {done.made} rows made, {done.kept} kept")

    # ---- generation
    def batch_files(self) -> list[Path]:
        folder = self.run_dir / DD_ARTIFACTS / DD_DATASET / "parquet-files"
        return sorted(folder.glob("batch_*.parquet")) if folder.is_dir() else []

    def catch_up(self, problems: list[str] | None = None) -> None:
        """Every batch Data Designer has finished and this job has not checked yet, checked and written."""
        done = set(store.processed(self.run_dir))
        for path in self.batch_files():
            index = int(path.stem.split("_")[-1])
            if index not in done:
                self.check_batch(index, path, problems or [])

    def expected(self, index: int) -> int:
        return max(0, min(self.spec.batch_size, self.spec.num_rows - index * self.spec.batch_size))

    def check_batch(self, index: int, path: Path, problems: list[str]) -> None:
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
        kept, rejected = self.checker.check_all(records, index)
        missing = self.expected(index) - len(records)
        failures = [p for p in problems if "failure" in p.lower() or "error" in p.lower()] or problems
        for i in range(max(0, missing)):  # Data Designer drops a record it could not make: counted, with its reason
            why = failures[min(i, len(failures) - 1)] if failures else "see the worker log"
            rejected.append({"reason": f"teacher: no usable answer for this record ({why})", "record": None,
                             "batch": index})
        store.write_batch(self.run_dir, index, kept, rejected)
        self.made_here += len(kept) + len(rejected)
        self.progress()

    def progress(self) -> None:
        tally = store.counts(self.run_dir)
        elapsed = time.monotonic() - self.started
        rate = self.made_here / elapsed if elapsed > 0 and self.made_here else None
        left = max(0, self.spec.num_rows - tally.made)
        tokens = self.usage["tokens_in"] + self.usage["tokens_out"]
        metrics = {**tally.as_metrics(), "rows_per_s": rate or 0.0, "tokens_in": float(self.usage["tokens_in"]),
                   "tokens_out": float(self.usage["tokens_out"]),
                   "requests_failed": float(self.usage["requests_failed"])}
        self.events.emit(ev.ProgressEvent(step=tally.made, total_steps=self.spec.num_rows, tokens_seen=tokens,
                                          tokens_per_s=(self.usage["tokens_out"] - self.usage["start_tokens_out"]) / elapsed
                                          if elapsed > 0 else None, elapsed_s=elapsed,
                                          eta_s=left / rate if rate else None, metrics=metrics))

    def generate(self, seeds: Path | None, providers: list[dict], model_configs: list[dict],
                 keys: dict[str, str]) -> None:
        config = dict(self.spec.recipe)
        config["model_configs"] = model_configs
        if seeds is not None:  # relative to the child's folder (this one): a resumed job's config is the same config
            config["seed_config"] = {"source": {"seed_type": "local", "path": seeds.name},
                                     "sampling_strategy": "ordered"}
        resume = any(self.batch_files()) or (self.run_dir / DD_ARTIFACTS / DD_DATASET).is_dir()
        plan = {"config": config, "providers": providers, "num_records": self.spec.num_rows,
                "buffer_size": self.spec.batch_size, "artifact_path": str(self.run_dir / DD_ARTIFACTS),
                "dataset_name": DD_DATASET, "resume": resume}
        plan_file = self.run_dir / "plan.json"
        plan_file.write_text(json.dumps(plan, indent=1))
        python = dd_python()
        if not python.is_file():
            raise RecipeError(f"NeMo Data Designer is not installed: run `make install`, which builds .venv-dd/ beside "
                              f"the studio's venv (or point {DD_VENV_ENV} at a venv with data-designer)")
        # Its output comes through this worker, redacted: an external teacher's key is not among the secrets the
        # worker's log filter was started with (worker/__main__.py), only in ``self.secrets``.
        self.child = subprocess.Popen([str(python), str(CHILD), "create", str(plan_file)], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env(keys),
                                      cwd=self.run_dir, start_new_session=True, text=True, errors="replace")
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump_lines, args=(self.child.stdout, lines), daemon=True).start()
        error = None
        while True:
            action = self.requested()
            if action is not None:
                self._end_child()
                raise Interrupted(action)
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            message = _parse(line)
            if message.get("event") == "batch":
                self._count(message)
                self.catch_up(message.get("problems") or [])
            elif message.get("event") == "done":
                self._count(message)
            elif message.get("event") == "error":
                error = message
            else:
                self.log(line.rstrip())
        code = self.child.wait()
        self.catch_up()
        if error is not None or code != 0:
            text = (error or {}).get("message") or f"Data Designer's child exited with {code} (see the worker log)"
            text = " ".join(text.replace("🛑", " ").replace("|----------", " ").replace(" | ", " ").split())
            raise RecipeError(f"recipe: {text}")

    def _count(self, message: dict) -> None:
        """The child's counts are its own run's: a resumed job adds them to what the jobs before it used."""
        for name in USAGE:
            self.usage[name] = self.usage["start_" + name] + int(message.get(name) or 0)
        (self.run_dir / "usage.json").write_text(json.dumps({name: self.usage[name] for name in USAGE}))

    def _read_usage(self) -> dict:
        try:
            saved = json.loads((self.run_dir / "usage.json").read_text())
        except (OSError, ValueError):
            saved = {}
        usage = {name: int(saved.get(name) or 0) for name in USAGE}
        usage.update({"start_" + name: value for name, value in list(usage.items())})  # a resumed job adds to these
        return usage

    def _end_child(self) -> None:
        child, self.child = getattr(self, "child", None), None
        if child is None or child.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(child.pid, sig)
            except ProcessLookupError:
                return
            try:
                child.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    # ---- the dataset
    def publish(self, stopped: bool) -> Path:
        spec = self.spec
        card = {"job_id": self.run_dir.name, "starter": spec.starter, "recipe": spec.recipe, "output": spec.output,
                "validators": spec.validators, "dedupe": spec.dedupe, "near_duplicate": spec.near_duplicate,
                "documents": spec.documents, "seed_dataset": spec.seed_dataset, "resumed_from": spec.resume_from,
                "seed_hub_dataset": f"{spec.seed_hub_dataset} ({spec.seed_hub_split})" if spec.seed_hub_dataset else "",
                "models": [{"alias": m.get("alias"), "source": m.get("source", ""), "url": m.get("url", ""),
                            "model": m.get("model", ""), "label": _label(m)} for m in spec.models],
                "served_by": spec.served_by, "stopped": stopped,
                "tokens": {"input": self.usage["tokens_in"], "output": self.usage["tokens_out"]},
                "requests_failed": self.usage["requests_failed"], "sources": _read_json(self.run_dir / "sources.json")}
        folder = store.publish(self.run_dir, spec.dataset_name, card)
        data = folder / store.DATA_FILE
        card = store.read_card(folder)
        self.events.emit(ev.ArtifactEvent(artifact="dataset", path=str(data), size=data.stat().st_size,
                                          sha256=card.get("sha256", ""), detail=f"{spec.dataset_name} {folder.name}"))
        self.log(f"published {card.get('kept')} rows ({card.get('rejected')} set aside) as {folder}")
        return folder


def _label(model: dict) -> str:
    return str(model.get("source") or f"{model.get('model')} at {model.get('url')}")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _parse(line: str) -> dict:
    try:
        found = json.loads(line)
        return found if isinstance(found, dict) else {}
    except ValueError:
        return {}


def _pump_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def main(run_dir: Path) -> int:
    """The entry point of a recipe job (``python -m trainer_core.worker RUN_DIR`` picks it by kind)."""
    return RecipeJob(run_dir).run()
