"""The model card (README.md) written with the artifacts: base model, data, method, config without secrets,
final and best metrics, the loss curve and the verify results. No ML stack: the worker gathers the facts."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainer_core.protocol import events as ev
from trainer_core.protocol.metrics import thin

TABLE_ROWS = 20  # the loss table, when no chart could be drawn: at most this many steps, spread over the run


@dataclass
class RunFacts:
    """What the source run's event log says about its training (the worker reads no database)."""

    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, train loss)
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    final_loss: float | None = None
    steps: int = 0

    @property
    def best_eval_loss(self) -> float | None:
        return min((loss for _, loss in self.eval_losses), default=None)


def read_facts(events_path: Path, up_to_step: int | None = None) -> RunFacts:
    """Losses and the outcome from a run's events.jsonl (up to a checkpoint's step when one is exported)."""
    facts = RunFacts()
    offset = 0
    while True:
        events, new_offset = ev.read_new(events_path, offset)
        if new_offset == offset:
            break
        offset = new_offset
        for event in events:
            step = getattr(event, "step", None)
            if up_to_step is not None and step is not None and step > up_to_step:
                continue
            if isinstance(event, ev.ProgressEvent) and event.loss is not None:
                facts.losses.append((event.step, event.loss))
                facts.steps = max(facts.steps, event.step)
            elif isinstance(event, ev.EvalEvent) and event.eval_loss is not None:
                facts.eval_losses.append((event.step, event.eval_loss))
            elif isinstance(event, ev.CompleteEvent) and up_to_step is None:
                facts.final_loss, facts.steps = event.final_loss, max(facts.steps, event.steps)
    if facts.final_loss is None and facts.losses:
        facts.final_loss = facts.losses[-1][1]
    return facts


MARKER_KEY = "finetune_studio"  # in the card's front matter: this studio wrote the repo (an update may go there)
FRONT_MATTER = {MARKER_KEY: True, "tags": ["finetune-studio"]}
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character (CommonMark escapes them all)


def text(value: object) -> str:
    """A user value as inline markdown text: one line, and every character that could start markup (a tag,
    a link, emphasis, a table cell's end, an entity) backslash-escaped, so it renders as exactly itself."""
    return _PUNCTUATION.sub(r"\\\1", _CONTROL.sub(" ", str(value)).strip())


def fenced(body: str, info: str = "") -> list[str]:
    """A fenced code block that ``body`` cannot close: its fence is longer than any backtick run inside."""
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, body, fence]


def front_matter() -> list[str]:
    return ["---", yaml.safe_dump(FRONT_MATTER, sort_keys=False).rstrip(), "---", ""]


def is_studio_card(card_text: str) -> bool:
    """Whether a model card's front matter carries this studio's marker (``finetune_studio: true``)."""
    match = re.match(r"---\r?\n(.*?)\r?\n---\r?\n", card_text, re.DOTALL)
    if match is None:
        return False
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return False
    return isinstance(meta, dict) and meta.get(MARKER_KEY) is True


def loss_table(losses: list[tuple[int, float]], rows: int = TABLE_ROWS) -> str:
    if not losses:
        return "_No training loss was recorded._"
    picked = thin(losses, rows)  # spread over the run, first and last step included
    return "\n".join(["| step | train loss |", "|---:|---:|"] + [f"| {s} | {loss:.4f} |" for s, loss in picked])


def _number(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "—"


# A text-to-speech model's card says how to load and run it: only transformers can (export/spec.TTS_NO_GGUF).
SPEAK_CODE = """import torch
from transformers import AutoProcessor, CsmForConditionalGeneration

folder = "merged"  # the folder beside this card
processor = AutoProcessor.from_pretrained(folder)
model = CsmForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
# the speaker id goes in the role ("0" here); the text is what it says
conversation = [{"role": "0", "content": [{"type": "text", "text": "Hello from my tuned voice."}]}]
inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True, return_tensors="pt")
audio = model.generate(**inputs, output_audio=True, max_new_tokens=125)  # 12.5 codec frames a second
processor.save_audio(audio, "speech.wav")"""


# An embedding run's ONNX folder: sentence-transformers loads it with its pooling and normalization; onnxruntime
# alone runs the transformer, and the pooling (mean over the attention mask here) is then the caller's.
ONNX_CODE = """from sentence_transformers import SentenceTransformer

model = SentenceTransformer("onnx", backend="onnx")  # the folder beside this card; needs optimum[onnxruntime]
vectors = model.encode(["A cat sits on the mat.", "The kitten is resting on a rug."])

# or onnxruntime alone (token embeddings; pool as onnx/1_Pooling/config.json says, e.g. mean over the mask)
import onnxruntime
from transformers import AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("onnx")
session = onnxruntime.InferenceSession("onnx/onnx/model.onnx")
inputs = tokenizer(["A cat sits on the mat."], return_tensors="np")
names = {i.name for i in session.get_inputs()}
token_embeddings = session.run(None, {k: v for k, v in inputs.items() if k in names})[0]"""


def usage_lines(output: str, no_gguf: str, files: tuple[str, ...] = ()) -> list[str]:
    """A "How to use" section for a model that is not a chat model and that only transformers runs, or for an
    embedding run's ONNX folder ([] for the others: their files say how to load them). ``no_gguf``: why there is no
    GGUF; ``files``: the artifacts' names."""
    if output == "embedding" and "onnx" in files:
        return ["## How to use", "",
                "The `onnx` folder is the sentence-transformers model with its transformer exported to ONNX "
                "(`onnx/model.onnx`, written by sentence-transformers' own exporter):", "",
                *fenced(ONNX_CODE, "python"), ""]
    if output != "audio":
        return []
    return ["## How to use", "",
            "A Sesame CSM text-to-speech model: the `merged` folder holds its weights (the Mimi codec inside) and its "
            f"processor. There is no GGUF: {no_gguf}.", "",
            *fenced(SPEAK_CODE, "python"), ""]


# How the verify table reads: a model that writes answers is compared with the unmerged adapter's answers; a
# text-to-speech model's reloaded folder speaks the verify sentences next to the model before it was saved.
VERIFY_TEXT = {
    "audio": ("The merged folder was loaded back with its processor and spoke the same sentences with the same seed "
              "as the model before it was saved:", "clips identical sample for sample"),
}
DEFAULT_VERIFY_TEXT = ("Each exported format was loaded back and answered the prompt set greedily next to the unmerged "
                       "adapter:", "answers identical to the adapter's")


def render(*, title: str, source_label: str, base_model: str, method: str, data: str, config: dict[str, Any],
           facts: RunFacts, artifacts: list[tuple[str, str]], verify: list[dict[str, Any]],
           chart_file: str | None, output: str = "text", no_gguf: str = "") -> str:
    """The card's markdown. ``artifacts``: (file name, what it is); ``verify``: VerifyEvent fields; ``output``:
    what the model is (MethodSpec.output). Every value that comes from users (names, paths, the config, verify's
    quoted answers) is quoted: escaped in text, a code block whose fence it cannot close for the config."""
    lines = front_matter() + [
        f"# {text(title)}", "",
        f"Exported from **{text(source_label)}** with Finetune Studio.", "",
        "| | |", "|---|---|",
        f"| Base model | {text(base_model)} |", f"| Method | {text(method)} |", f"| Data | {text(data or '—')} |",
        f"| Steps | {facts.steps} |", f"| Final train loss | {_number(facts.final_loss)} |",
        f"| Best eval loss | {_number(facts.best_eval_loss)} |", "",
        "## Files", ""]
    # File names and verify's format labels are ours (a slug and a fixed suffix); what they are may quote users.
    lines += [f"- `{name}`: {text(what)}" for name, what in artifacts] + [""]
    lines += usage_lines(output, no_gguf, tuple(name for name, _ in artifacts)) + ["## Training loss", ""]
    lines.append(f"![training loss]({chart_file})" if chart_file else loss_table(facts.losses))
    if verify:
        intro, column = VERIFY_TEXT.get(output, DEFAULT_VERIFY_TEXT)
        lines += ["", "## Verification", "", intro, "", f"| format | {column} | first difference |", "|---|---:|---|"]
        # a row that counts something else (an mmproj's tensors) says what: "22/22 tensors equal to ..."
        lines += [f"| {v['format']} | {v['identical']}/{v['total']}{' ' + text(v['unit']) if v.get('unit') else ''} | "
                  f"{text(v['first_difference'] or '—')} |" for v in verify]
    lines += ["", "## Training config (no secrets)", ""]
    lines += fenced(yaml.safe_dump(config, sort_keys=False).rstrip(), "yaml") + [""]
    return "\n".join(lines)
