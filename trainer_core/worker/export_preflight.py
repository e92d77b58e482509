"""The export's preflight (trainer_core/worker/export.py): every check before anything long starts or anything is
written — the source and its weights, free disk for what the targets write, the destination folder, the hub repo and
token for a push."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from trainer_core.specs import model_source
from trainer_core.export import card, staging as staging_folders, tools
from trainer_core.export.spec import HUB_TOKEN_ENV, ExportSpec
from trainer_core.worker.export_plan import ExportError, Plan
from trainer_core.worker.export_tools import tree_size


DISK_MARGIN = 1.10  # the estimate leaves 10% for tokenizer files, metadata and the file system



class Preflight:
    """ExportWorker's checks before the first stage."""

    def preflight(self, spec: ExportSpec) -> Plan:
        """Every problem that would stop the export later, found now and reported together."""
        errors = [f"{e.field}: {e.message}" for e in spec.validate()]
        if errors:
            raise ExportError("; ".join(errors))
        resolved = model_source.resolve(spec.source)
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
        from trainer_core.planning import model_info

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
        if "onnx" in spec.targets:
            need += params * 4  # float32 ONNX weights
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

