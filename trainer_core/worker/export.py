"""The export worker: a run's model as a zipped adapter, merged 16-bit weights, GGUF files with an Ollama
Modelfile (a vision-language model: its mmproj projector file instead), an embedding run's ONNX folder, and a model
card; verified by reloading what was written; optionally pushed to the hub.

Lifecycle, top to bottom: read the spec -> preflight (nothing long starts, and nothing is written, until every
check passed) -> adapter zip -> merge -> GGUF -> Modelfile or mmproj -> ONNX -> verify -> model card -> publish -> push.
Everything is written into a staging folder next to the destination and renamed into place at the end, so an
export that fails or is cancelled leaves no half-written artifact; one killed outright leaves its staging folder
to the next export worker, which removes every stale one as it starts (export/staging.py), and takes its
converter along (the converter dies with it: PR_SET_PDEATHSIG). Stop and Cancel are honoured between stages
(Cancel and SIGTERM also during a conversion): Stop publishes the artifacts finished so far (with their card),
Cancel publishes nothing.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from trainer_core.specs import jobspec, model_source
from trainer_core.config import TrainConfig
from trainer_core.export import card, staging as staging_folders
from trainer_core.export.spec import HUB_TOKEN_ENV, TTS_NO_GGUF, ExportSpec
from trainer_core.protocol import control, events as ev, paths, secrets
from trainer_core.protocol.status import RunStatus
from trainer_core.worker.job import JobWorker
from trainer_core.worker.export_plan import ExportError, Interrupted, Plan, Staged
from trainer_core.worker.export_merge import Merging
from trainer_core.worker.export_mmproj import Projector
from trainer_core.worker.export_onnx import OnnxExport
from trainer_core.worker.export_preflight import Preflight
from trainer_core.worker.export_tools import Conversion, sha256_file, tree_size, write_manifest
from trainer_core.worker.export_verify import Verification

# the child between fork and exec calls only what is already resolved






















class ExportWorker(Preflight, Merging, Conversion, Projector, OnnxExport, Verification, JobWorker):
    def __init__(self, run_dir: Path):
        super().__init__(run_dir)
        self.secrets = [s for s in [*secrets.from_env(os.environ).values()] if s]
        self.stage_index = 0
        self.total = 0
        self.started = time.time()

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        self.begin()
        plan: Plan | None = None
        lock: int | None = None
        try:
            for folder in staging_folders.remove_all_stale():  # left by export workers that were killed
                self.log(f"removed the stale staging folder {folder}")
            spec = jobspec.read_spec(self.run_dir)
            assert isinstance(spec, ExportSpec), type(spec)
            self.total = len(spec.stages())
            self.status(RunStatus.STARTING, "preflight")
            plan = self.preflight(spec)
            plan.staging, lock = staging_folders.create(plan.final)
            self.advance()  # preflight passed: it is one of the steps (a finished export shows n/n)
            self.status(RunStatus.RUNNING, "exporting")
            stopped = False
            try:
                self.work(plan)
            except Interrupted as exc:
                if exc.action is control.Action.CANCEL:
                    raise
                stopped = True  # Stop: publish what is finished, with its card
                self.warn("Stop requested: publishing the artifacts finished so far")
            self.stage("model card", check=False)
            self.write_card(plan)
            self.stage("publish", check=False)
            published = self.publish(plan)
            if plan.spec.push_repo_id and not stopped:
                self.stage("push")
                self.push(plan)
            self.events.emit(ev.CompleteEvent(status=(RunStatus.STOPPED if stopped else RunStatus.COMPLETED).value,
                                              output_dir=str(plan.final), steps=self.stage_index))
            self.log(f"finished: {len(published)} artifact(s) in {plan.final}")
            return 0
        except Interrupted:
            self.events.emit(ev.CompleteEvent(status=RunStatus.CANCELLED.value, steps=self.stage_index))
            return 0
        except BaseException as exc:  # process boundary: report every failure, then exit non-zero
            self.fail(exc)
            return 1
        finally:
            if plan is not None:
                shutil.rmtree(plan.staging, ignore_errors=True)  # gone once published; a failure leaves nothing
            if lock is not None:
                os.close(lock)
            self.end()

    def work(self, plan: Plan) -> None:
        spec = plan.spec
        if "adapter" in spec.targets:
            self.stage("adapter")
            self.zip_weights(plan)
        if "merged" in spec.targets or "gguf" in spec.targets:
            self.stage("merge")
            self.merge(plan)
        if "gguf" in spec.targets:
            for quant in spec.quantizations:
                self.stage(f"gguf {quant}")
                self.gguf(plan, quant)
            if plan.resolved.sees_images:  # the vision tower and projector: llama.cpp's mmproj file, no Modelfile
                self.stage("mmproj")
                self.mmproj(plan)
            else:
                self.stage("modelfile")
                self.write_modelfile(plan)
        if "onnx" in spec.targets:
            self.stage("onnx")
            self.onnx(plan)
        if spec.verify and any(t in spec.targets for t in ("merged", "gguf", "onnx")):
            self.stage("verify")
            self.verify(plan)
        shutil.rmtree(plan.staging / ".work", ignore_errors=True)

    # ------------------------------------------------------------------ preflight













    # ------------------------------------------------------------------ verify






    # ------------------------------------------------------------------ card, publish, push
    def write_card(self, plan: Plan) -> None:
        resolved = plan.resolved
        cfg = resolved.config or TrainConfig()
        facts = card.read_facts(self.source_events(resolved), resolved.source.checkpoint)
        chart = "loss.png" if draw_loss_chart(facts.losses, plan.staging / "loss.png") else None
        data = cfg.hf_dataset or ", ".join(Path(p).name for p in cfg.local_datasets)
        if plan.verify:
            (plan.staging / "verify.json").write_text(json.dumps(plan.verify, indent=1))
            plan.staged.append(Staged("verify.json", "verify", "", "the verify results"))
        files = [(s.name, s.what) for s in plan.staged]
        text = card.render(title=f"{plan.stem}", source_label=resolved.label, base_model=resolved.base_model,
                           method=cfg.method_label, data=data, config=cfg.to_public_dict(), facts=facts,
                           artifacts=files, verify=plan.verify, chart_file=chart, output=resolved.output,
                           no_gguf=TTS_NO_GGUF)
        (plan.staging / "README.md").write_text(text)
        plan.staged.append(Staged("README.md", "card", "", "this model card"))

    @staticmethod
    def source_events(resolved: model_source.ResolvedSource) -> Path:
        return paths.run_dir(resolved.source.run_id) / ev.LOG_NAME

    def publish(self, plan: Plan) -> list[Staged]:
        """Hash everything, then move the staging folder into place in one rename, then report each artifact."""
        # Scratch (merged weights for a GGUF, an f16 GGUF for k-quants) is no artifact: after a Stop it is
        # still there, as big as the model.
        shutil.rmtree(plan.staging / ".work", ignore_errors=True)
        rows = []
        for item in plan.staged:
            path = plan.staging / item.name
            digest_of = write_manifest(path) if path.is_dir() else path
            rows.append((item, tree_size(path), sha256_file(digest_of)))
        if plan.final.exists():
            plan.final.rmdir()  # empty (preflight checked): replaced by the staging folder
        os.replace(plan.staging, plan.final)
        for item, size, digest in rows:
            self.events.emit(ev.ArtifactEvent(artifact=item.artifact, path=str(plan.final / item.name), size=size,
                                              sha256=digest, source_run_id=plan.resolved.source.run_id,
                                              detail=item.detail))
            print(f"artifact: {plan.final / item.name}", flush=True)
        return plan.staged

    def push(self, plan: Plan) -> None:
        from huggingface_hub import HfApi

        spec = plan.spec
        api = HfApi(token=os.environ.get(HUB_TOKEN_ENV) or None)
        try:
            # Not exist_ok unless an update was chosen (and checked by preflight): a repo someone created since
            # preflight is a conflict here, never a silent write into it.
            api.create_repo(spec.push_repo_id, private=spec.push_private, exist_ok=spec.push_update)
            info = api.upload_folder(folder_path=str(plan.final), repo_id=spec.push_repo_id,
                                     commit_message=f"Export of {plan.resolved.label} (Finetune Studio)")
        except Exception as exc:  # noqa: BLE001 - the local artifacts are complete; say so with the reason
            reason = self.redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)[:300]
            raise ExportError(f"the push to {spec.push_repo_id} failed ({reason}); the artifacts are complete in "
                              f"{plan.final}: push them later with `huggingface-cli upload {spec.push_repo_id} "
                              f"{plan.final}`") from None
        visibility = "an existing repo, its visibility unchanged" if plan.hub_repo_exists else \
            "private" if spec.push_private else "public"
        self.status(RunStatus.RUNNING, "pushed", f"pushed to {getattr(info, 'commit_url', spec.push_repo_id)} "
                                                 f"({visibility})")

    # ------------------------------------------------------------------ reporting and control
    def stage(self, name: str, check: bool = True) -> None:
        if check:
            self.check_control()
        self.status(RunStatus.RUNNING, name)
        self.advance()

    def advance(self) -> None:
        self.stage_index += 1
        self.events.emit(ev.ProgressEvent(step=self.stage_index, total_steps=self.total,
                                          elapsed_s=time.time() - self.started))

    def check_control(self) -> None:
        action = self.requested()
        if action is not None:
            raise Interrupted(action)

    def fail(self, exc: BaseException) -> None:
        known = isinstance(exc, (ExportError, model_source.SourceError))
        message = str(exc) if known else f"{type(exc).__name__}: {exc}"
        self.report_error(message, exc)


































def draw_loss_chart(losses: list[tuple[int, float]], path: Path) -> bool:
    """A PNG of the loss curve when vl-convert is installed (it renders Vega-Lite offline); else the card
    carries a table of loss by step instead."""
    try:
        import vl_convert
    except ImportError:
        return False
    if not losses:
        return False
    import altair as alt
    import pandas as pd

    chart = alt.Chart(pd.DataFrame(losses, columns=["step", "loss"])).mark_line().encode(x="step", y="loss")
    path.write_bytes(vl_convert.vegalite_to_png(chart.to_dict()))
    return True


def main(run_dir: Path) -> int:
    """The entry point of an export job (``python -m trainer_core.worker RUN_DIR`` picks it by kind)."""
    return ExportWorker(run_dir).run()
