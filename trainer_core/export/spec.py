"""The export job's spec (job.json): what to export, where, and whether to verify and push it. No ML stack."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from trainer_core import kinds
from trainer_core.config import promptsets
from trainer_core.config import FieldError
from trainer_core.export import tools
from trainer_core.specs.model_source import SourceError, resolve
from trainer_core.specs.jobspec import JobSpec, register
from trainer_core.launchers import ray as ray_jobs
from trainer_core.planning import model_info, modality
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind
from trainer_core.serving.spec import embed_python

TARGETS = ("adapter", "merged", "gguf", "onnx")
MERGED_DTYPES = ("bfloat16", "float16")
HUB_TOKEN_ENV = "HF_TOKEN"
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
MAX_NEW_TOKENS_MAX = 256
# Why a text-to-speech (Sesame CSM) run has no GGUF; the export's model card says it too (the kind's row says it).
TTS_NO_GGUF = kinds.tts.NO_GGUF
# ONNX is written by sentence-transformers' own exporter (optimum), which needs transformers < 4.58: it runs in the
# embedding server's venv (.venv-embed), as the serve job's infinity does.
ONNX_INSTALL_FIX = ("onnx: the ONNX exporter (sentence-transformers with optimum[onnxruntime]) is not installed: run "
                    "`make install`, which builds .venv-embed/ beside the studio's venv (or point "
                    "FINETUNE_STUDIO_EMBED_VENV at a venv with sentence-transformers and optimum[onnxruntime])")
EXPORTS_FOLDER = "exports"  # under the data root and each allowed root: the only places an out_dir may be


def model_config(resolved) -> dict:
    """The config.json of a resolved source's model: the full fine-tune's own, else its base model's (a folder, or a
    hub id's cached or downloaded config). {} when it cannot be read (the worker names that when it loads it)."""
    try:
        folder = resolved.model_dir if resolved.model_dir is not None else \
            modality._folder(resolved.base_model, None)  # the folder detect_modality read (sees_images)
        return model_info.folder_facts(Path(folder)).config
    except (model_info.ModelInfoError, OSError, ValueError):
        return {}


def vision_gguf_problem(resolved) -> str | None:
    """Why a vision-language model gets no GGUF here: llama.cpp's installed converter cannot write its language GGUF
    and its mmproj projector file (tools.vision_gguf_problem reads the converter's own tables)."""
    problem = tools.vision_gguf_problem(model_config(resolved))
    return (f"gguf: {problem}: export merged instead (it loads in transformers with its processor)" if problem
            else None)


def vision_gguf_offered(model_name: str) -> bool:
    """Whether a vision run of ``model_name`` (a folder, or a hub id's cached config) exports to GGUF with its mmproj
    file here: the Export form then offers GGUF first, as for a text model."""
    try:
        config = modality.model_facts(model_name).config
    except (model_info.ModelInfoError, OSError, ValueError):
        return False
    return tools.converter_script() is not None and tools.vision_gguf_problem(config) is None


def export_folders() -> list[Path]:
    """Where a chosen out_dir may be: the ``exports/`` folder of the data root and of each allowed root. The
    rest of them (run folders, models, datasets, the project's own files) is no place for artifacts."""
    return [root.resolve() / EXPORTS_FOLDER for root in paths.allowed_data_roots()]


@register
@dataclass
class ExportSpec(JobSpec):
    """Export a run's final model (``source.run_id``) or one of its checkpoints (``source.checkpoint``)."""

    KIND: ClassVar[JobKind] = JobKind.EXPORT
    # adapter: the adapter folder zipped (a full fine-tune: the model folder); merged: 16-bit safetensors with
    # the adapter merged in; gguf: llama.cpp's converter on the merged weights, plus an Ollama Modelfile; onnx
    # (embedding runs): the sentence-transformers folder with its model as ONNX (onnx/model.onnx).
    targets: list[str] = field(default_factory=lambda: ["merged", "gguf"])
    quantizations: list[str] = field(default_factory=lambda: ["q8_0"])  # GGUF types (tools.KNOWN_TYPES)
    merged_dtype: str = "bfloat16"
    out_dir: str = ""  # empty: the job folder's artifacts/; else a new (or empty) folder under export_folders()
    verify: bool = True  # reload the merged model and the GGUF and replay prompts next to the adapter
    prompt_set: str = "quick-check"  # trainer_core.config.promptsets
    max_new_tokens: int = 24
    push_repo_id: str = ""  # a hub repo id (org/name); the token comes from HF_TOKEN in the environment
    push_private: bool = True  # applies to a repo the push creates; an updated repo keeps its visibility
    # An existing repo is refused unless the user chose to update it, and then only one whose card this studio
    # wrote (its README.md front matter says finetune_studio: true), or any repo when an admin submitted it.
    push_update: bool = False
    push_update_any: bool = False  # set for admins only (the orchestrator refuses it from anyone else)
    # "local": on this host; "ray": a single-worker Ray job on the server's cluster (RAY_ADDRESS), the artifacts in
    # the job folder on the shared storage (docs/ray.md). A hub push runs on this host only: HF_TOKEN never goes to Ray.
    launcher: str = "local"
    ray_gpus_per_worker: float = 0.0  # launcher ray: the GPUs Ray gives the job on its node (0: it runs on the CPU)

    @property
    def model_label(self) -> str:
        return self.source.key

    @property
    def dataset_label(self) -> str:
        gguf = f" ({', '.join(self.quantizations)})" if "gguf" in self.targets else ""
        return ", ".join(self.targets) + gguf

    @property
    def total_steps(self) -> int:
        return len(self.stages())

    def stages(self) -> list[str]:
        """The worker's stages, in order (its progress is stage i of these)."""
        names = ["preflight"]
        if "adapter" in self.targets:
            names.append("adapter")
        if "merged" in self.targets or "gguf" in self.targets:
            names.append("merge")
        if "gguf" in self.targets:  # a vision model's projector file instead of a Modelfile (Ollama cannot run it)
            names += [f"gguf {q}" for q in self.quantizations] + ["mmproj" if self.sees_images() else "modelfile"]
        if "onnx" in self.targets:
            names.append("onnx")
        if self.verify and any(t in self.targets for t in ("merged", "gguf", "onnx")):
            names.append("verify")
        names += ["model card", "publish"]
        if self.push_repo_id:
            names.append("push")
        return names

    def env_names(self) -> list[str]:
        return [HUB_TOKEN_ENV] if self.push_repo_id else []

    def output_dir(self, job_dir: Path) -> Path:
        return paths.resolve_inside(self.out_dir, export_folders()) if self.out_dir else job_dir / "artifacts"

    def _model_problem(self, targets: list[str]) -> str | None:
        """Why the source's model cannot take these targets: merged and GGUF exports load it as a model that writes
        answers and verify it by its answers; a speech model is merged (verified by its transcripts) and a
        text-to-speech model merged (verified by what it speaks), neither converted to GGUF."""
        if not targets:
            return None
        try:
            resolved = resolve(self.source)
        except SourceError:
            return None  # the base class names the missing source
        kind = resolved.kind
        writer = [t for t in targets if kind.export_refusal(t) == kinds.NEEDS_WRITER]
        if writer:  # it writes no answers: say what it is for instead, and what to export
            fix = ("export the adapter instead" if resolved.adapter_dir is not None else
                   "a full fine-tune's weights folder is the whole model: copy it as it is")
            return f"{' and '.join(targets)}: {resolved.not_a_writer(kinds.NEEDS_WRITER)}; {fix}"
        refused = next((why for t in targets if (why := kind.export_refusal(t))), "")
        if refused:
            return refused
        if kind.lora_merge_refusal and resolved.adapter_dir is not None:
            return f"{' and '.join(targets)}: {kind.lora_merge_refusal}"
        if "onnx" in targets and not embed_python().exists():
            return ONNX_INSTALL_FIX
        if "gguf" in targets and kind.gguf_needs_converter:
            return vision_gguf_problem(resolved)
        return None

    def sees_images(self) -> bool:
        """Whether the source is a vision-language model (its GGUF export adds the mmproj projector file)."""
        try:
            return resolve(self.source).sees_images
        except SourceError:
            return False

    def admin_only(self) -> list[str]:
        if self.push_update_any is True:
            return super().admin_only() + [
                "push_update_any: only an admin may update a hub repo this studio did not create; push to a "
                "new repo id, or update one whose model card Finetune Studio wrote"]
        return super().admin_only()

    def validate(self) -> list[FieldError]:
        errors = super().validate()
        bad = lambda name, message: errors.append(FieldError(name, message))  # noqa: E731
        wrong = [(n, t) for n, t in (("merged_dtype", str), ("out_dir", str), ("prompt_set", str),
                                     ("push_repo_id", str), ("verify", bool), ("push_private", bool),
                                     ("push_update", bool), ("push_update_any", bool), ("launcher", str))
                 if not isinstance(getattr(self, n), t)]
        for name, kind in wrong:  # a job.json edited by hand: name the field instead of failing on it below
            bad(name, "true or false" if kind is bool else "text")
        if wrong:
            return errors
        if self.source.is_base:
            bad("source", "export works on a trained model: pick a run (its final model) or one of its checkpoints, "
                          "not a base model")
        if not isinstance(self.targets, list) or not self.targets:
            bad("targets", f"choose at least one of {', '.join(TARGETS)}")
        else:
            unknown = [t for t in self.targets if t not in TARGETS]
            if unknown:
                bad("targets", f"unknown target {str(unknown[0])[:20]!r}: choose from {', '.join(TARGETS)}")
            if len(set(self.targets)) != len(self.targets):
                bad("targets", "each target once")
            problem = self._model_problem([t for t in self.targets if t in ("merged", "gguf", "onnx")])
            if problem:
                bad("targets", problem)
        if "gguf" in (self.targets or []):
            self._validate_gguf(bad)
        if self.merged_dtype not in MERGED_DTYPES:
            bad("merged_dtype", f"choose {' or '.join(MERGED_DTYPES)} (16-bit weights)")
        if self.out_dir:
            problem = self._out_dir_problem()
            if problem:
                bad("out_dir", problem)
        if self.verify:
            try:
                promptsets.load(self.prompt_set)
            except promptsets.PromptSetError as exc:
                bad("prompt_set", str(exc))
            if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or \
                    not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_MAX:
                bad("max_new_tokens", f"a whole number from 1 to {MAX_NEW_TOKENS_MAX}")
        if self.push_repo_id:
            if not REPO_ID_RE.fullmatch(self.push_repo_id):
                bad("push_repo_id", "a hub repo id like your-name/model-name (letters, digits, '.', '_', '-')")
            elif not os.environ.get(HUB_TOKEN_ENV):
                bad("push_repo_id", f"a hub push needs a write token: set {HUB_TOKEN_ENV} in the environment of the "
                                    "dashboard or CLI (huggingface.co/settings/tokens), or leave the repo id empty")
        elif self.push_update:
            bad("push_update", "updating an existing repo needs push_repo_id (the repo to update)")
        if self.push_update_any and not self.push_update:
            bad("push_update_any", "only together with push_update")
        errors.extend(ray_jobs.spec_problems(self))
        shared, where = ray_jobs.shared_storage()  # unset: spec_problems said so already
        if self.launcher == "ray" and self.out_dir and shared and not any(e.field == "out_dir" for e in errors) \
                and not Path(self.out_dir).expanduser().resolve().is_relative_to(Path(shared).resolve()):
            bad("out_dir", f"launcher: ray: the job writes its artifacts from a node of the cluster, and {self.out_dir} "
                           f"is not on the shared storage {shared} ({where}): choose a folder under it, "
                           "or leave out_dir empty (the job folder's artifacts/)")
        return errors

    def _validate_gguf(self, bad) -> None:
        if not isinstance(self.quantizations, list) or not self.quantizations:
            bad("quantizations", f"choose at least one GGUF type: {', '.join(tools.available_types())}")
            return
        for name in self.quantizations:
            problem = tools.type_problem(str(name))
            if problem:
                bad("quantizations", problem)
        if len(set(self.quantizations)) != len(self.quantizations):
            bad("quantizations", "each type once")
        if tools.converter_script() is None:
            bad("targets", tools.missing_converter_message())

    def _out_dir_problem(self) -> str | None:
        roots = export_folders()
        try:
            folder = paths.resolve_inside(self.out_dir, roots)
        except paths.BadPathError as exc:
            return str(exc)
        except paths.UnsafePathError as exc:
            return f"{exc}: exports go in a new folder under {' or '.join(map(str, roots))}"
        if folder in roots:
            return f"{folder} is the export folder itself: name a new folder inside it, e.g. {folder / 'my-export'}"
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            return f"{folder} already exists and is not an empty folder: name a new folder (nothing is overwritten)"
        if folder.parent not in roots and not folder.parent.is_dir():  # an export folder itself is made on demand
            return f"{folder.parent} does not exist: create it first, or choose another folder"
        return None
