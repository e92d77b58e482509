"""Run by the recipe worker with the Data Designer venv's Python (.venv-dd: NVIDIA NeMo Data Designer pins a
huggingface-hub and pyarrow the training stack does not take); imports nothing of the studio. Two commands:

    create PLAN        generate the plan's records into its artifact folder, a batch at a time; after each batch a
                       JSON line on stdout: {"event": "batch", "path": ..., "records": n, "tokens_in": ...}
    preview PLAN OUT   generate a handful of records in memory; they and the teacher's usage go to the JSON file OUT

PLAN is a JSON file the worker writes: the Data Designer config (``config``: its own format, model aliases served
by ``providers``), ``providers`` ([{"name", "endpoint", "key_env"}]: the key is read from that environment variable,
never from a file or the command line), ``num_records``, ``buffer_size``, ``artifact_path``, ``dataset_name`` and
``resume`` (continue the batches already on disk: Data Designer's ResumeMode.ALWAYS).

Two of Data Designer's methods are replaced (the pinned 0.9.7's): the dataset profiler, which fetches tiktoken's
encodings from the internet (this host may have none, and a hung download would hang the job) and whose column
statistics the studio does not use; and the resource provider's creation, kept so each batch reports the teacher's
token and request counts as they grow.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path


def _designer(plan: dict):
    from data_designer.config.models import ModelProvider
    from data_designer.config.run_config import RunConfig
    from data_designer.interface.data_designer import DataDesigner

    class StudioDesigner(DataDesigner):
        provider = None

        def _create_resource_provider(self, *args, **kwargs):
            StudioDesigner.provider = super()._create_resource_provider(*args, **kwargs)
            return StudioDesigner.provider

        def _create_dataset_profiler(self, *args, **kwargs):
            return _NoProfile()

    providers = [ModelProvider(name=p["name"], endpoint=p["endpoint"], provider_type="openai",
                               api_key=os.environ.get(p.get("key_env") or "", "") or "not-needed")
                 for p in plan["providers"]]
    designer = StudioDesigner(artifact_path=plan["artifact_path"], model_providers=providers or None)
    designer.set_run_config(RunConfig(buffer_size=int(plan["buffer_size"]),
                                      disable_early_shutdown=bool(plan.get("disable_early_shutdown", False))))
    return designer, StudioDesigner


class _NoProfile:
    def profile_dataset(self, *args, **kwargs):
        return None


class _Failures(logging.Handler):
    """The warnings and errors Data Designer logs while it runs (a teacher's bad answer, a dropped record): the
    latest few go with each batch, so a record that did not come back has a reason."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = " ".join(record.getMessage().replace("|----------", " ").replace(" | ", " ").split())[:400]
        if text and "column profile" not in text and "may be incomplete" not in text:
            self.messages = (self.messages + [text])[-5:]


def _usage(holder) -> dict:
    """The teacher's token and request counts so far, over every model alias."""
    totals = {"tokens_in": 0, "tokens_out": 0, "requests_ok": 0, "requests_failed": 0}
    registry = getattr(holder.provider, "model_registry", None) if holder.provider is not None else None
    if registry is None:
        return totals
    for stats in registry.get_model_usage_snapshot().values():
        totals["tokens_in"] += int(stats.token_usage.input_tokens or 0)
        totals["tokens_out"] += int(stats.token_usage.output_tokens or 0)
        totals["requests_ok"] += int(stats.request_usage.successful_requests or 0)
        totals["requests_failed"] += int(stats.request_usage.failed_requests or 0)
    return totals


def _say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def create(plan_file: str) -> int:
    from data_designer.config.config_builder import DataDesignerConfigBuilder
    from data_designer.engine.storage.artifact_storage import ResumeMode

    plan = json.loads(Path(plan_file).read_text())
    designer, holder = _designer(plan)
    failures = _Failures()  # after Data Designer set up its logging (it replaces the root logger's handlers)
    logging.getLogger().addHandler(failures)
    builder = DataDesignerConfigBuilder.from_config(plan["config"])

    def batch_done(path) -> None:
        _say({"event": "batch", "path": str(path), **_usage(holder), "problems": failures.messages})
        failures.messages = []

    designer.create(builder, num_records=int(plan["num_records"]), dataset_name=plan["dataset_name"],
                    resume=ResumeMode.ALWAYS if plan.get("resume") else ResumeMode.NEVER,
                    on_batch_complete=batch_done)
    _say({"event": "done", **_usage(holder)})
    return 0


def preview(plan_file: str, out_file: str) -> int:
    from data_designer.config.config_builder import DataDesignerConfigBuilder

    plan = json.loads(Path(plan_file).read_text())
    designer, holder = _designer(plan)
    failures = _Failures()  # after Data Designer set up its logging (it replaces the root logger's handlers)
    logging.getLogger().addHandler(failures)
    builder = DataDesignerConfigBuilder.from_config(plan["config"])
    started = time.monotonic()
    results = designer.preview(builder, num_records=int(plan["num_records"]))
    frame = results.dataset
    rows = json.loads(frame.to_json(orient="records", force_ascii=False)) if frame is not None else []
    Path(out_file).write_text(json.dumps({"rows": rows, "elapsed_s": time.monotonic() - started,
                                          "problems": failures.messages, **_usage(holder)}))
    return 0


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["create"] and len(argv) == 2:
            return create(argv[1])
        if argv[:1] == ["preview"] and len(argv) == 3:
            return preview(argv[1], argv[2])
    except Exception as exc:  # noqa: BLE001 - the worker shows the message; the traceback goes to its log
        import traceback

        traceback.print_exc()
        _say({"event": "error", "type": type(exc).__name__, "message": " ".join(str(exc).split())[:2000]})
        return 2
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
