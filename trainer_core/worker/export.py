"""The export worker: a run's model as a zipped adapter, merged 16-bit weights, GGUF files with an Ollama
Modelfile, and a model card; verified by reloading what was written; optionally pushed to the hub.

Lifecycle, top to bottom: read the spec -> preflight (nothing long starts, and nothing is written, until every
check passed) -> adapter zip -> merge -> GGUF -> Modelfile -> verify -> model card -> publish -> push.
Everything is written into a staging folder next to the destination and renamed into place at the end, so an
export that fails or is cancelled leaves no half-written artifact; one killed outright leaves its staging folder
to the next export worker, which removes every stale one as it starts (export/staging.py), and takes its
converter along (the converter dies with it: PR_SET_PDEATHSIG). Stop and Cancel are honoured between stages
(Cancel and SIGTERM also during a conversion): Stop publishes the artifacts finished so far (with their card),
Cancel publishes nothing.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainer_core import jobspec, promptsets
from trainer_core.config import TrainConfig
from trainer_core.export import card, chat_templates, staging as staging_folders, tools
from trainer_core.export.spec import HUB_TOKEN_ENV, TTS_NO_GGUF, ExportSpec
from trainer_core.protocol import control, events as ev, paths, secrets
from trainer_core.protocol.status import RunStatus
from trainer_core.worker.job import JobWorker
from trainer_core.worker.redaction import OutputRedactor

DISK_MARGIN = 1.10  # the estimate leaves 10% for tokenizer files, metadata and the file system
CONVERTER_LOG_LINES = 15  # of the converter's output, quoted in the error when it fails
HASH_BLOCK = 8 << 20
SUMS_FILE = "SHA256SUMS"
TOOL_POLL_S = 0.5  # how often a running converter's worker looks for Cancel and SIGTERM
PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None  # bound here:
# the child between fork and exec calls only what is already resolved


class ExportError(RuntimeError):
    """An export that cannot go on: the message names the problem and the fix."""


class Interrupted(Exception):
    def __init__(self, action: control.Action):
        self.action = action


@dataclass
class Staged:
    """One artifact in the staging folder: its name there, its kind and detail for the artifacts table."""

    name: str
    artifact: str
    detail: str = ""
    what: str = ""  # for the model card's file list


@dataclass
class Plan:
    spec: ExportSpec
    resolved: jobspec.ResolvedSource
    final: Path
    staging: Path
    base_dir: str  # the base model's folder (or hub id)
    tokenizer: object = None
    staged: list[Staged] = field(default_factory=list)
    verify: list[dict] = field(default_factory=list)
    # a text-to-speech export with verify on: (sentence, samples, ended) the model spoke before it was saved
    spoken: list[tuple[str, object, bool]] = field(default_factory=list)
    hub_repo_exists: bool = False  # found by preflight: the push updates it instead of creating it

    @property
    def stem(self) -> str:
        return self.resolved.served_name or "model"

    @property
    def merged_dir(self) -> Path:
        return self.staging / "merged" if "merged" in self.spec.targets else self.staging / ".work" / "merged"


def tool_env() -> dict[str, str]:
    """The environment of the converter and llama-quantize: ours without the hub token a push needs (they
    read local files only)."""
    return {k: v for k, v in os.environ.items() if k not in secrets.SECRET_ENV.values()}


def die_with(parent: int):
    """A ``preexec_fn`` for a tool's process: SIGKILL when ``parent`` (the worker) dies, however it dies."""
    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the worker died before the request was in place
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


def kill_group(proc: subprocess.Popen) -> None:
    """The tool and anything it started (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> Path:
    """``SHA256SUMS`` of every file in ``folder`` (``sha256sum -c SHA256SUMS`` checks it); its own sha256 stands
    for the folder's in the artifacts table."""
    lines = [f"{sha256_file(p)}  {p.relative_to(folder).as_posix()}" for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != SUMS_FILE]
    path = folder / SUMS_FILE
    path.write_text("\n".join(lines) + "\n")
    return path


def tree_size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class ExportWorker(JobWorker):
    def __init__(self, run_dir: Path):
        super().__init__(run_dir)
        self.secrets = [s for s in [*secrets.from_env(os.environ).values()] if s]
        self.stage_index = 0
        self.total = 0
        self.started = time.time()

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        redactor = OutputRedactor(self.secrets) if self.secrets else None
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
            if redactor is not None:
                redactor.close()

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
            self.stage("modelfile")
            self.write_modelfile(plan)
        if spec.verify and ("merged" in spec.targets or "gguf" in spec.targets):
            self.stage("verify")
            self.verify(plan)
        shutil.rmtree(plan.staging / ".work", ignore_errors=True)

    # ------------------------------------------------------------------ preflight
    def preflight(self, spec: ExportSpec) -> Plan:
        """Every problem that would stop the export later, found now and reported together."""
        errors = [f"{e.field}: {e.message}" for e in spec.validate()]
        if errors:
            raise ExportError("; ".join(errors))
        resolved = jobspec.resolve(spec.source)
        final = spec.output_dir(self.run_dir)
        staging = staging_folders.staging_path(final)
        from transformers import AutoConfig, AutoTokenizer

        from trainer_core.worker.sources import base_folder

        base_dir = str(resolved.model_dir) if resolved.model_dir else base_folder(resolved, log=self.log)
        tokenizer_dir = resolved.weights_dir if (resolved.weights_dir / "tokenizer_config.json").exists() else base_dir
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        plan = Plan(spec, resolved, final, staging, base_dir, tokenizer)
        problems = []
        needs_model = "merged" in spec.targets or "gguf" in spec.targets
        # a Whisper model has no chat template; a vision model's is its processor's
        if needs_model and resolved.output == "text" and not resolved.sees_images and not tokenizer.chat_template:
            problems.append(f"the model has no chat template (tokenizer in {tokenizer_dir}): a merged model or GGUF "
                            "without one is prompted wrongly; set chat_template in the run's config and train again, "
                            "or export the adapter only")
        model_config = AutoConfig.from_pretrained(base_dir)
        # CSM: vocab_size counts one codebook's codes; its text embedding has text_vocab_size rows
        rows = getattr(model_config, "text_vocab_size", None) or getattr(model_config, "vocab_size", None) or \
            getattr(model_config.get_text_config(), "vocab_size", 0)
        if len(tokenizer) > rows:
            problems.append(f"the tokenizer has {len(tokenizer):,} tokens but the model's embedding has {rows:,} rows: "
                            "tokens were added without resizing the embedding; resize it (and save it with the "
                            "adapter) and train again, or remove the added tokens")
        problems += self.disk_problems(plan)
        problems += self.folder_problems(final)
        if spec.push_repo_id:
            problems += self.hub_problems(plan)
        if problems:
            raise ExportError("preflight found " + ("; ".join(problems) if len(problems) > 1 else problems[0]) +
                              ". Nothing was written.")
        self.log(f"preflight passed: {resolved.label} -> {final}")
        return plan

    def disk_problems(self, plan: Plan) -> list[str]:
        spec = plan.spec
        from trainer_core import model_info

        try:
            params = model_info.inspect_model(plan.base_dir).num_parameters
        except model_info.ModelInfoError as exc:
            self.warn(f"No size estimate for {plan.base_dir} ({exc}): the free-disk check is skipped")
            return []
        need = 0.0
        if "adapter" in spec.targets:
            need += tree_size(plan.resolved.weights_dir)
        if "merged" in spec.targets or "gguf" in spec.targets:
            need += params * 2
        if "gguf" in spec.targets:
            need += sum(params * tools.KNOWN_TYPES[q] for q in spec.quantizations)
            if any(q in tools.K_QUANT_TYPES for q in spec.quantizations) and "f16" not in spec.quantizations:
                need += params * 2  # llama-quantize starts from an f16 GGUF
        need *= DISK_MARGIN
        folder = plan.final.parent
        while not folder.exists():
            folder = folder.parent
        free = shutil.disk_usage(folder).free
        if need > free:
            return [f"the export needs about {need / 1e9:.2f} GB ({params / 1e6:,.0f}M parameters; "
                    f"{', '.join(spec.targets)}) but {folder} has {free / 1e9:.2f} GB free: free some space, or "
                    "choose another out_dir or fewer targets"]
        return []

    def folder_problems(self, final: Path) -> list[str]:
        parent = final.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            probe = tempfile.mkdtemp(prefix=".write-probe-", dir=parent)
            os.rmdir(probe)
        except OSError as exc:
            return [f"the output folder {parent} is not writable ({exc.strerror or exc}): choose another out_dir "
                    "or fix its permissions"]
        if final.exists() and (not final.is_dir() or any(final.iterdir())):
            return [f"{final} already exists and is not empty: nothing is overwritten; choose a new out_dir"]
        return []

    def hub_problems(self, plan: Plan) -> list[str]:
        spec = plan.spec
        token = os.environ.get(HUB_TOKEN_ENV, "")
        if not token:
            return [f"push_repo_id: a hub push needs a write token in {HUB_TOKEN_ENV}; set it, or leave the repo "
                    "id empty"]
        from huggingface_hub import HfApi
        from huggingface_hub import is_offline_mode

        if is_offline_mode():
            return ["push_repo_id: the hub is switched off here (HF_HUB_OFFLINE is set): unset it, or leave the "
                    "repo id empty and copy the artifacts yourself"]
        api = HfApi(token=token)
        try:
            api.whoami()
            problem = self.existing_repo_problem(api, plan)
        except Exception as exc:  # noqa: BLE001 - any failure here means: no push possible; say which
            reason = self.redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)[:200]
            return [f"push_repo_id: the hub cannot be reached with this token ({reason}): check the network and "
                    f"{HUB_TOKEN_ENV}, or leave the repo id empty"]
        return [problem] if problem else []

    def existing_repo_problem(self, api, plan: Plan) -> str | None:
        """A push never writes into an existing repo unless the user chose to update it, and then only one whose
        card this studio wrote, unless an admin submitted the export (push_update_any)."""
        from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError

        spec, repo = plan.spec, plan.spec.push_repo_id
        try:
            info = api.repo_info(repo, repo_type="model")
        except RepositoryNotFoundError:
            return None  # a new repo (or one this token cannot see: creating it then fails, and says so)
        plan.hub_repo_exists = True
        if not spec.push_update:
            return (f"push_repo_id: {repo} already exists on the hub, and an export never writes into an existing "
                    "repo unless asked: choose a new repo id, or choose to update the existing repo (form: "
                    "'Update an existing repo'; CLI: --update-existing) if Finetune Studio created it")
        if spec.push_private and not info.private:
            return (f"push_repo_id: {repo} is public, and the export was asked to push privately: make the repo "
                    "private on the hub first, choose a public push (CLI: --public), or choose a new repo id")
        if spec.push_update_any:
            return None
        with tempfile.TemporaryDirectory(prefix="card-") as folder:
            try:
                text = Path(api.hf_hub_download(repo, "README.md", repo_type="model", local_dir=folder)).read_text(
                    encoding="utf-8", errors="replace")
            except EntryNotFoundError:
                text = ""
        if card.is_studio_card(text):
            return None
        return (f"push_repo_id: {repo} was not created by Finetune Studio (its README.md front matter has no "
                f"`{card.MARKER_KEY}: true`), so an export does not update it: choose a new repo id, or ask an "
                "admin to push it")

    # ------------------------------------------------------------------ stages
    def zip_weights(self, plan: Plan) -> None:
        folder = plan.resolved.weights_dir
        kind = "adapter" if plan.resolved.adapter_dir else "model"
        name = f"{plan.stem}-{kind}"
        shutil.make_archive(str(plan.staging / name), "zip", root_dir=folder)
        what = "the LoRA adapter folder (apply it to the base model with PEFT)" if kind == "adapter" else \
            "the full fine-tuned model folder"
        plan.staged.append(Staged(f"{name}.zip", "adapter", kind, what))

    def merge(self, plan: Plan) -> None:
        """16-bit weights: the adapter merged into the base loaded in 16 bits (never into 4-bit weights, also
        for a QLoRA run: load_source loads the base unquantized)."""
        from trainer_core.worker.sources import MERGED_MARKER, merge_adapter

        dtype = plan.spec.merged_dtype
        target = plan.merged_dir
        if plan.resolved.output == "embedding":  # a full fine-tune's sentence-transformers folder, saved again
            from sentence_transformers import SentenceTransformer

            SentenceTransformer(str(plan.resolved.model_dir), device="cpu").save(str(target))
            if "merged" in plan.spec.targets:
                plan.staged.append(Staged("merged", "merged", "sentence-transformers", "the sentence-transformers "
                                          "folder (modules, pooling, tokenizer): SentenceTransformer(path) loads it"))
            return
        if plan.resolved.output == "audio":
            self.merge_speaker(plan)
            return
        if plan.resolved.adapter_dir is not None:
            merge_adapter(plan.resolved, target, dtype, log=self.log)
            (target / MERGED_MARKER).unlink(missing_ok=True)  # a cache stamp, not part of the model
        else:
            import torch

            from trainer_core.worker.sources import auto_class

            folder = str(plan.resolved.model_dir)
            model = auto_class(folder).from_pretrained(folder, dtype=getattr(torch, dtype))
            model.save_pretrained(target, safe_serialization=True)
            plan.tokenizer.save_pretrained(target)
            if plan.resolved.output == "speech" or plan.resolved.sees_images:  # the processor belongs to the model
                from transformers import AutoProcessor

                AutoProcessor.from_pretrained(folder).save_pretrained(target)
            del model
        if "merged" in plan.spec.targets:
            what = "with its processor: load with WhisperForConditionalGeneration and WhisperProcessor" \
                if plan.resolved.output == "speech" else "with the tokenizer: load with transformers"
            plan.staged.append(Staged("merged", "merged", dtype, f"merged weights ({dtype} safetensors) {what}"))

    def merge_speaker(self, plan: Plan) -> None:
        """A text-to-speech model (Sesame CSM): a LoRA run's adapter merged into CsmForConditionalGeneration (PEFT's
        merge_and_unload), a full fine-tune's model as it is; in the export's dtype, saved with the run's processor.
        With verify on, the model speaks the verify sentences before the folder is used again: the reloaded folder
        must speak them sample for sample alike (verify_audio)."""
        import torch
        from transformers import AutoProcessor

        from trainer_core.worker.sources import load_source, processor_folder

        dtype = plan.spec.merged_dtype
        target = plan.merged_dir
        model, _ = load_source(plan.resolved, "cpu", log=self.log)  # the base from the run's config, not the
        if plan.resolved.adapter_dir is not None:  # adapter_config's base_model_name_or_path
            self.log(f"merging the adapter {plan.resolved.adapter_dir} into its base model")
            model = model.merge_and_unload()
        processor = AutoProcessor.from_pretrained(processor_folder(plan.resolved, plan.base_dir))
        if plan.spec.verify:
            # Spoken in float32 from the weights as they are saved (rounded to the export's dtype in place), as the
            # reloaded folder is loaded: a CPU has no fast half-precision kernels. Only the saved tensors are
            # rounded; buffers that are not saved (rotary frequencies) stay as a fresh load computes them.
            with torch.no_grad():
                for tensor in model.state_dict().values():
                    if tensor.is_floating_point():
                        tensor.copy_(tensor.to(getattr(torch, dtype)))
            plan.spoken = speak_sentences(model, processor, plan.resolved.config)
        model.to(getattr(torch, dtype)).save_pretrained(target, safe_serialization=True)
        processor.save_pretrained(target)
        del model
        plan.staged.append(Staged("merged", "merged", dtype, f"merged weights ({dtype} safetensors, the Mimi codec "
                                  "inside) with the processor: load with transformers' CsmForConditionalGeneration "
                                  "and AutoProcessor (llama.cpp cannot run CSM)"))

    def gguf(self, plan: Plan, quant: str) -> None:
        script = tools.converter_script()
        if script is None:
            raise ExportError(tools.missing_converter_message())
        name = f"{plan.stem}-{quant}.gguf"
        out = plan.staging / name
        if quant in tools.CONVERTER_TYPES:
            self.convert(script, plan.merged_dir, quant, out)
        else:
            f16 = plan.staging / f"{plan.stem}-f16.gguf"
            if not f16.exists():
                f16 = plan.staging / ".work" / "f16.gguf"
                f16.parent.mkdir(exist_ok=True)
                if not f16.exists():
                    self.convert(script, plan.merged_dir, "f16", f16)
            binary = tools.llama_quantize()
            if binary is None:
                raise ExportError(tools.type_problem(quant))
            self.run_tool([binary, str(f16), str(out), quant.upper()], "llama-quantize")
        plan.staged.append(Staged(name, "gguf", quant, f"GGUF ({quant}) for llama.cpp, Ollama, LM Studio"))

    def convert(self, script: Path, model_dir: Path, outtype: str, out: Path) -> None:
        """llama.cpp's own converter, in a process of its own whose PYTHONPATH starts with its folder (its `gguf`
        package never meets ours) and whose environment holds no secrets."""
        env = tool_env()
        env["PYTHONPATH"] = str(script.parent)
        env["HF_HUB_OFFLINE"] = "1"  # it reads the local folder only
        self.run_tool([sys.executable, str(script), str(model_dir), "--outtype", outtype, "--outfile", str(out)],
                      "convert_hf_to_gguf", env)

    def run_tool(self, command: list[str], name: str, env: dict[str, str] | None = None) -> None:
        """Run a tool in a process group of its own that dies with the worker (SIGKILL included); Cancel and
        SIGTERM kill it at once, and it never outlives this call."""
        self.log(f"running {name}: {' '.join(command[1:])}")
        try:
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    errors="replace", env=env or tool_env(), stdin=subprocess.DEVNULL,
                                    process_group=0, preexec_fn=die_with(os.getpid()))
        except OSError as exc:
            raise ExportError(f"{name} could not be started ({exc.strerror or exc})") from None
        with proc:
            try:
                stdout, stderr = self.wait_tool(proc)
            finally:
                kill_group(proc)  # done, failed, interrupted or raising: nothing of it keeps running
        output = (stdout + stderr).replace("\r", "\n")
        lines = [line for line in output.splitlines() if line.strip()]
        print("\n".join(lines[-200:]), flush=True)
        if proc.returncode != 0:
            if self.sigterm.is_set():
                raise Interrupted(control.Action.CANCEL)
            tail = "\n".join(lines[-CONVERTER_LOG_LINES:])
            raise ExportError(f"{name} failed (exit code {proc.returncode}); its last lines:\n{tail}")

    def wait_tool(self, proc: subprocess.Popen) -> tuple[str, str]:
        while True:
            try:
                return proc.communicate(timeout=TOOL_POLL_S)  # retrying after the timeout loses no output
            except subprocess.TimeoutExpired:
                if self.requested() is control.Action.CANCEL:
                    raise Interrupted(control.Action.CANCEL) from None

    def write_modelfile(self, plan: Plan) -> None:
        template = plan.tokenizer.chat_template
        detected = chat_templates.detect(template, plan.tokenizer.eos_token or "")
        if detected is None:
            self.warn("The chat template matches none of the known families "
                      f"({', '.join(chat_templates.FAMILY_NAMES)}): the Modelfile has no TEMPLATE (a wrong one "
                      "makes the model answer gibberish); write one by hand for Ollama.")
        first = next(s.name for s in plan.staged if s.artifact == "gguf")
        (plan.staging / "Modelfile").write_text(chat_templates.modelfile(first, detected, template,
                                                                         plan.resolved.label))
        family = detected.family.name if detected else "no TEMPLATE"
        plan.staged.append(Staged("Modelfile", "modelfile", family, f"Ollama Modelfile ({family}) for {first}"))

    # ------------------------------------------------------------------ verify
    def verify(self, plan: Plan) -> None:
        """Reload every exported format and replay the prompt set greedily next to the unmerged adapter."""
        if plan.resolved.output == "speech":
            self.verify_speech(plan)
            return
        if plan.resolved.output == "audio":
            self.verify_audio(plan)
            return
        if plan.resolved.output == "embedding":
            self.verify_embedding(plan)
            return
        if plan.resolved.sees_images:
            self.verify_vision(plan)
            return
        import torch

        from trainer_core.worker.sources import load_source

        prompts = list(promptsets.load(plan.spec.prompt_set).prompts)
        model, tokenizer = load_source(plan.resolved, "cpu", log=self.log)
        reference = [generate(model, tokenizer, p, plan.spec.max_new_tokens) for p in prompts]
        del model
        formats: list[tuple[str, Path, str | None]] = []
        if "merged" in plan.spec.targets:
            formats.append(("merged", plan.merged_dir, None))
        formats += [(f"gguf {s.detail}", plan.staging, s.name) for s in plan.staged if s.artifact == "gguf"]
        from transformers import AutoModelForCausalLM, AutoTokenizer

        for label, folder, gguf_file in formats:
            self.check_control()
            try:
                model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_file, dtype=torch.float32)
                tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
            except Exception as exc:  # noqa: BLE001 - any load failure fails the export, with its reason
                what = f"the GGUF {gguf_file}" if gguf_file else "the merged model"
                raise ExportError(f"{what} cannot be loaded back ({type(exc).__name__}: {str(exc)[:300]}): the "
                                  "export failed and nothing was published") from None
            model.eval()
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            answers = [generate(model, tok, p, plan.spec.max_new_tokens) for p in prompts]
            del model
            result = compare(label, prompts, reference, answers, tokenizer)
            self.report_verify(plan, result)
            if gguf_file is not None and has_llama_cpp():
                texts = [tokenizer.decode(r, skip_special_tokens=True) for r in reference]
                self.check_control()
                answers = llama_cpp_answers(folder / gguf_file, [chat_prompt(tok, p) for p in prompts],
                                            plan.spec.max_new_tokens)
                self.report_verify(plan, compare_texts(f"{label} (llama.cpp)", prompts, texts, answers))

    def verify_speech(self, plan: Plan) -> None:
        """A speech model: the merged folder reloaded (with its processor) transcribes the run's own clips (its eval
        clips, else its first training clips) exactly as the source does."""
        import torch
        from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

        from trainer_core.worker.sources import load_source, processor_folder

        names, clips = speech_clips(plan.resolved.config)
        source_processor = AutoProcessor.from_pretrained(processor_folder(plan.resolved, plan.base_dir))
        model, _ = load_source(plan.resolved, "cpu", log=self.log)
        reference = [transcribe_clip(model, source_processor, clip, plan.spec.max_new_tokens) for clip in clips]
        del model
        self.check_control()
        try:
            merged = AutoModelForSpeechSeq2Seq.from_pretrained(str(plan.merged_dir), dtype=torch.float32).eval()
            processor = AutoProcessor.from_pretrained(str(plan.merged_dir))
        except Exception as exc:  # noqa: BLE001 - any load failure fails the export, with its reason
            raise ExportError(f"the merged model cannot be loaded back with its processor ({type(exc).__name__}: "
                              f"{str(exc)[:300]}): the export failed and nothing was published") from None
        answers = [transcribe_clip(merged, processor, clip, plan.spec.max_new_tokens) for clip in clips]
        self.report_verify(plan, compare_texts("merged", names, reference, answers))

    def verify_audio(self, plan: Plan) -> None:
        """A text-to-speech model: the merged folder reloaded with its processor speaks the verify sentences, with the
        same seed, sample for sample as the model did before it was saved (merge_speaker)."""
        import torch
        from transformers import AutoProcessor

        from trainer_core.worker.sources import auto_class

        self.check_control()
        folder = str(plan.merged_dir)
        try:
            model = auto_class(folder).from_pretrained(folder, dtype=torch.float32).eval()
            processor = AutoProcessor.from_pretrained(folder)
        except Exception as exc:  # noqa: BLE001 - any load failure fails the export, with its reason
            raise ExportError(f"the merged model cannot be loaded back with its processor ({type(exc).__name__}: "
                              f"{str(exc)[:300]}): the export failed and nothing was published") from None
        spoken = speak_sentences(model, processor, plan.resolved.config)
        rate = int(processor.feature_extractor.sampling_rate)
        self.log("verify: the reloaded folder spoke " + ", ".join(f"{text[:40]!r} for {len(clip) / rate:.2f} s"
                                                                  for text, clip, _ in spoken))
        self.report_verify(plan, compare_clips("merged", plan.spoken, spoken, rate))

    def verify_vision(self, plan: Plan) -> None:
        """A vision-language model: the merged folder reloaded with its processor answers the run's own image rows
        (their questions and images, greedily) token for token as the run's model does."""
        import torch
        from transformers import AutoProcessor

        from trainer_core.worker.sources import auto_class, load_source, processor_folder

        names, prompts = vision_prompts(plan.resolved.config)
        model, _ = load_source(plan.resolved, "cpu", log=self.log)
        processor = AutoProcessor.from_pretrained(processor_folder(plan.resolved, plan.base_dir))
        reference = [answer_image(model, processor, p, plan.spec.max_new_tokens) for p in prompts]
        del model
        self.check_control()
        try:
            merged = auto_class(str(plan.merged_dir)).from_pretrained(str(plan.merged_dir), dtype=torch.float32).eval()
            merged_processor = AutoProcessor.from_pretrained(str(plan.merged_dir))
        except Exception as exc:  # noqa: BLE001 - any load failure fails the export, with its reason
            raise ExportError(f"the merged model cannot be loaded back with its processor ({type(exc).__name__}: "
                              f"{str(exc)[:300]}): the export failed and nothing was published") from None
        answers = [answer_image(merged, merged_processor, p, plan.spec.max_new_tokens) for p in prompts]
        self.report_verify(plan, compare("merged", names, reference, answers, processor.tokenizer))

    def verify_embedding(self, plan: Plan) -> None:
        """An embedding model: the exported folder reloaded with sentence-transformers embeds the run's own texts as
        the run's model does (cosine similarity of each pair of vectors at least EMBED_TOLERANCE)."""
        from sentence_transformers import SentenceTransformer

        texts = embedding_texts(plan.resolved.config)
        source = SentenceTransformer(str(plan.resolved.model_dir), device="cpu")
        reference = source.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        del source
        self.check_control()
        try:
            exported = SentenceTransformer(str(plan.merged_dir), device="cpu")
        except Exception as exc:  # noqa: BLE001 - any load failure fails the export, with its reason
            raise ExportError(f"the exported folder cannot be loaded back with sentence-transformers "
                              f"({type(exc).__name__}: {str(exc)[:300]}): the export failed and nothing was "
                              "published") from None
        vectors = exported.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        similarity = (reference * vectors).sum(axis=1)
        same = [bool(s >= EMBED_TOLERANCE) for s in similarity]
        first = next((f"text {i + 1} ({texts[i][:40]!r}): cosine {similarity[i]:.6f}"
                      for i, ok in enumerate(same) if not ok), "")
        self.report_verify(plan, dict(format="merged", identical=sum(same), total=len(texts), first_difference=first))

    def report_verify(self, plan: Plan, result: dict) -> None:
        plan.verify.append(result)
        self.events.emit(ev.VerifyEvent(**result))
        self.log(f"verify {result['format']}: {result['identical']}/{result['total']} identical")
        if result["identical"] < result["total"]:
            self.warn(f"{result['format']} drifts from the adapter: {result['identical']}/{result['total']} greedy "
                      f"answers identical; first difference: {result['first_difference']}")

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
    def source_events(resolved: jobspec.ResolvedSource) -> Path:
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
        message = str(exc) if isinstance(exc, (ExportError, jobspec.SourceError)) else f"{type(exc).__name__}: {exc}"
        self.report_error(message, exc)


def chat_prompt(tokenizer, prompt: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def generate(model, tokenizer, prompt: str, max_new_tokens: int) -> list[int]:
    """Greedy answer token ids to ``prompt`` under the tokenizer's chat template."""
    import torch

    text = chat_prompt(tokenizer, prompt)
    inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                             pad_token_id=tokenizer.pad_token_id)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def compare(label: str, prompts: list[str], reference: list[list[int]], answers: list[list[int]],
            tokenizer) -> dict:
    """VerifyEvent fields: how many answers are token for token the adapter's, and where the first one parts."""
    identical = sum(a == r for a, r in zip(answers, reference))
    first = ""
    for i, (a, r) in enumerate(zip(answers, reference)):
        if a == r:
            continue
        at = next((j for j, (x, y) in enumerate(zip(a, r)) if x != y), min(len(a), len(r)))
        ref_tok = tokenizer.decode(r[at:at + 1]) if at < len(r) else "(end)"
        got_tok = tokenizer.decode(a[at:at + 1]) if at < len(a) else "(end)"
        first = f"prompt {i + 1} ({prompts[i][:40]!r}), token {at + 1}: adapter {ref_tok!r}, {label} {got_tok!r}"
        break
    return dict(format=label, identical=identical, total=len(reference), first_difference=first)


VERIFY_CLIPS = 4  # a speech export's verify transcribes this many of the run's own clips
VERIFY_TEXTS = 8  # an embedding export's verify embeds this many of the run's own texts
EMBED_TOLERANCE = 0.9999  # cosine similarity of a text's vectors from the run's model and the export: "identical"


VERIFY_IMAGES = 4  # a vision export's verify answers this many of the run's own image rows


def vision_prompts(cfg) -> tuple[list[str], list[tuple[list[dict], list]]]:
    """(names, prompts): the first VERIFY_IMAGES image rows of a vision run (its eval rows, else its training rows)
    as (the turns before the first answer, the images they show), read as the run read them."""
    from trainer_core.data import DatasetError, loading

    try:
        data = loading.load_for_training(cfg)
    except (DatasetError, OSError) as exc:
        raise ExportError(f"the run's images cannot be read to verify the merged model ({exc}): restore its data, or "
                          "export with verify off") from None
    names, prompts = [], []
    for row in (data.eval_rows or data.rows):
        turns = row.get("messages") or []
        first_answer = next((i for i, t in enumerate(turns) if t.get("role") == "assistant"), len(turns))
        if not row.get("images") or first_answer == 0:
            continue
        asked = turns[:first_answer]
        text = " ".join(p.get("text", "") for t in asked if isinstance(t.get("content"), list) for p in t["content"]
                        if isinstance(p, dict) and p.get("type") == "text")
        names.append(text[:40] or f"row {len(names) + 1}")
        prompts.append((asked, list(row["images"])))
        if len(prompts) == VERIFY_IMAGES:
            break
    if not prompts:
        raise ExportError("the run's data has no image row with a question to verify the merged model with: export "
                          "with verify off")
    return names, prompts


def answer_image(model, processor, prompt: tuple[list[dict], list], max_new_tokens: int) -> list[int]:
    """Greedy answer token ids of a vision model to (turns, images) under the processor's chat template."""
    import io

    import torch
    from PIL import Image

    turns, images = prompt
    pictures = [Image.open(io.BytesIO(i) if isinstance(i, (bytes, bytearray)) else i).convert("RGB") for i in images]
    text = processor.apply_chat_template(turns, add_generation_prompt=True)
    inputs = processor(text=text, images=pictures, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def embedding_texts(cfg) -> list[str]:
    """Up to VERIFY_TEXTS distinct texts of an embedding run's data (its eval rows, else its training rows), read as
    the run read them. ExportError says why when they cannot be read."""
    from trainer_core.data import DatasetError, loading

    try:
        data = loading.load_for_training(cfg)
    except (DatasetError, OSError) as exc:
        raise ExportError(f"the run's texts cannot be read to verify the export ({exc}): restore its data, or "
                          "export with verify off") from None
    texts = [v for row in (data.eval_rows or data.rows) for v in row.values() if isinstance(v, str) and v.strip()]
    return list(dict.fromkeys(texts))[:VERIFY_TEXTS]


def speech_clips(cfg) -> tuple[list[str], list]:
    """(names, clips): the first VERIFY_CLIPS clips of a speech run's eval rows (else its training rows), read as
    the run read them (paths checked under the allowed roots). ExportError says why when they cannot be read."""
    from trainer_core.data import DatasetError, loading

    try:
        data = loading.load_for_training(cfg)
    except (DatasetError, OSError) as exc:
        raise ExportError(f"the run's clips cannot be read to verify the merged model ({exc}): restore its data, or "
                          "export with verify off") from None
    rows = (data.eval_rows or data.rows)[:VERIFY_CLIPS]
    names = [r["text"][:40] for r in rows]  # the clip's transcript names it in the verify result
    return names, [r["audio"] for r in rows]


def transcribe_clip(model, processor, clip, max_new_tokens: int) -> str:
    """The model's greedy transcript of one clip (decoded and resampled to the processor's rate)."""
    from trainer_core.worker.methods.stt import transcribe

    return transcribe(model, processor, [clip], max_new_tokens)[0]


VERIFY_SENTENCE = "The quick brown fox jumps over the lazy dog."  # spoken when the run names no sample texts
VERIFY_MAX_S = 4.0  # each verify clip is cut here: 50 frames, each one drawn from the one before, prove the weights


def speak_sentences(model, processor, cfg) -> list[tuple[str, object, bool]]:
    """(sentence, samples, ended) for each verify sentence of a text-to-speech run: its tts.sample_texts (up to
    two), else VERIFY_SENTENCE, in its default voice, up to its tts.max_sample_s (at most VERIFY_MAX_S), with the
    sampler's fixed seed."""
    from trainer_core.methods.tts import settings_of
    from trainer_core.worker.methods.tts import SEED, speak

    s = settings_of(cfg)
    sentences = [t.strip() for t in s.sample_texts[:2]] or [VERIFY_SENTENCE]
    seconds = min(s.max_sample_s, VERIFY_MAX_S)
    return [(text, *speak(model, processor, text, s.speaker, seconds, SEED)) for text in sentences]


def compare_clips(label: str, reference: list[tuple[str, object, bool]], spoken: list[tuple[str, object, bool]],
                  rate: int) -> dict:
    """VerifyEvent fields for spoken clips: how many are sample for sample the reference's, and where the first one
    parts (in seconds)."""
    import numpy as np

    identical, first = 0, ""
    for i, ((text, ref, ref_ended), (_, got, got_ended)) in enumerate(zip(reference, spoken)):
        if ref_ended == got_ended and np.array_equal(ref, got):
            identical += 1
            continue
        if not first:
            apart = np.flatnonzero(ref[:len(got)] != got[:len(ref)])
            at = int(apart[0]) if len(apart) else min(len(ref), len(got))
            first = (f"sentence {i + 1} ({text[:40]!r}): apart from {at / rate:.2f} s; {len(ref) / rate:.2f} s before "
                     f"saving, {len(got) / rate:.2f} s reloaded")
    return dict(format=label, identical=identical, total=len(reference), first_difference=first)


def has_llama_cpp() -> bool:
    """The optional ``llamacpp`` extra: xllamacpp, a prebuilt llama.cpp runtime (what Ollama and LM Studio run)."""
    return importlib.util.find_spec("xllamacpp") is not None


def llama_cpp_answers(gguf: Path, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy completions of already chat-formatted ``prompts`` by llama.cpp itself (xllamacpp)."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.n_ctx = 2048
    params.n_predict = max_new_tokens
    try:
        server = xllamacpp.Server(params)
        results = [server.handle_completions({"prompt": p, "n_predict": max_new_tokens, "temperature": 0.0,
                                              "top_k": 1, "cache_prompt": False}) for p in prompts]
        return [r["choices"][0]["text"] for r in results]
    except Exception as exc:  # noqa: BLE001 - llama.cpp refusing the file fails the export, with its reason
        raise ExportError(f"llama.cpp cannot run the GGUF {gguf.name} ({type(exc).__name__}: {str(exc)[:300]}): "
                          "the export failed and nothing was published") from None


def compare_texts(label: str, prompts: list[str], reference: list[str], answers: list[str]) -> dict:
    """VerifyEvent fields for a runtime that returns text: identical answers, and where the first one parts."""
    identical = sum(a == r for a, r in zip(answers, reference))
    first = ""
    for i, (a, r) in enumerate(zip(answers, reference)):
        if a != r:
            at = next((j for j, (x, y) in enumerate(zip(a, r)) if x != y), min(len(a), len(r)))
            first = (f"prompt {i + 1} ({prompts[i][:40]!r}), character {at + 1}: adapter {r[at:at + 12]!r}, "
                     f"{label} {a[at:at + 12]!r}")
            break
    return dict(format=label, identical=identical, total=len(reference), first_difference=first)


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
