"""The export's external tools (trainer_core/worker/export.py): llama.cpp's converter and llama-quantize run in their
own process group, killed with the worker however it dies (PR_SET_PDEATHSIG) and on Cancel; the Ollama Modelfile;
and the hashing of what was written (SHA256SUMS)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from trainer_core.export import chat_templates, tool_templates, tools
from trainer_core.protocol import control, secrets
from trainer_core.worker.export_plan import ExportError, Interrupted, Plan, Staged


CONVERTER_LOG_LINES = 15  # of the converter's output, quoted in the error when it fails


HASH_BLOCK = 8 << 20


SUMS_FILE = "SHA256SUMS"


TOOL_POLL_S = 0.5  # how often a running converter's worker looks for Cancel and SIGTERM


PR_SET_PDEATHSIG = 1  # linux/prctl.h


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None  # bound here:



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



class Conversion:
    """ExportWorker's GGUF stages: convert, quantize, write the Modelfile."""

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

    def convert(self, script: Path, model_dir: Path, outtype: str, out: Path, mmproj: bool = False) -> None:
        """llama.cpp's own converter, in a process of its own whose PYTHONPATH starts with its folder (its `gguf`
        package never meets ours) and whose environment holds no secrets. ``mmproj``: a vision-language model's
        projector file (its vision tower and projector) instead of its language model."""
        env = tool_env()
        env["PYTHONPATH"] = str(script.parent)
        env["HF_HUB_OFFLINE"] = "1"  # it reads the local folder only
        self.run_tool([sys.executable, str(script), str(model_dir), "--outtype", outtype, "--outfile", str(out),
                       *(["--mmproj"] if mmproj else [])], "convert_hf_to_gguf" + (" --mmproj" if mmproj else ""), env)

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
        """The Modelfile from the chat template: its family's TEMPLATE, or, when the template renders tools in the
        Hermes form (a run trained with the Hermes tool template), one that renders {{ .Tools }} and the calls."""
        template = plan.tokenizer.chat_template
        eos = plan.tokenizer.eos_token or ""
        detected = chat_templates.detect(template, eos)
        if detected is None:
            self.warn("The chat template matches none of the known families "
                      f"({', '.join(chat_templates.FAMILY_NAMES)}): the Modelfile has no TEMPLATE (a wrong one "
                      "makes the model answer gibberish); write one by hand for Ollama.")
        tools = tool_templates.hermes_tools(template, eos) if detected is not None else None
        first = next(s.name for s in plan.staged if s.artifact == "gguf")
        (plan.staging / "Modelfile").write_text(chat_templates.modelfile(
            first, detected, template, plan.resolved.label,
            tools_template=tool_templates.go_tool_template(tools) if tools is not None else None))
        family = (detected.family.name + (" with tools" if tools is not None else "")) if detected else "no TEMPLATE"
        plan.staged.append(Staged("Modelfile", "modelfile", family, f"Ollama Modelfile ({family}) for {first}"))
