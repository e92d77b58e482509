"""Image + text datasets (dashboard side: no ML imports): detection, image references resolved and checked, and
every shape normalised to one row shape the worker's vision collator takes::

    {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "..."}]}, ...],
     "images": ["/abs/path.png", ...]}

``{"type": "image"}`` parts are placeholders filled from ``images`` in order (TRL's convention), so the number of
placeholders equals the number of images in every row kept.

Shapes read: messages whose content holds image parts (``{"type": "image", "image": ...}`` or OpenAI-style
``{"type": "image_url", "image_url": {"url": ...}}``); LLaVA style (an ``images`` list plus ``<image>`` in the text,
in ``messages`` or ShareGPT ``conversations``); flat ``{image, question, answer}`` / ``{image, text}``; and an image
folder with ``metadata.jsonl`` / ``metadata.csv`` (the Hugging Face imagefolder convention: a ``file_name`` column).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from trainer_core import kinds
from trainer_core.data import DatasetError
from trainer_core.data.formats import (MAX_DROP_EXAMPLES, ROLE_ALIASES, NormalizedData, as_turn_list,
                                       no_usable_rows)
from trainer_core.protocol import paths

FORMAT = "vision"
PLACEHOLDER = "<image>"
IMAGE_COLUMNS = ("images", "image", "file_name", "image_path")  # first found wins
CAPTION_PROMPT = "Describe the image."  # the user turn of a caption row ({image, text}), which has no question
_SAMPLE = 50  # rows looked at to decide whether a dataset holds images
URL_FIX = ("image URLs are not fetched: download the images into the dataset's folder and refer to them by "
           "relative path")


# ``file_name`` is also the audiofolder convention's column: there it names an image only by its suffix.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff")


def _holds_image(column: str, value: Any) -> bool:
    if value in (None, "", []):
        return False
    if column == "file_name" and isinstance(value, str):
        return value.strip().lower().endswith(IMAGE_SUFFIXES)
    return True


def has_images(rows: list[dict]) -> bool:
    """Whether the rows hold images: an image column, or image parts / ``<image>`` placeholders in chat turns."""
    for row in rows[:_SAMPLE]:
        if not isinstance(row, dict):
            continue
        if any(_holds_image(column, row.get(column)) for column in IMAGE_COLUMNS):
            return True
        for column in ("messages", "conversations"):
            if any(_image_parts(turn) for turn in as_turn_list(row.get(column)) or [] if isinstance(turn, dict)):
                return True
    return False


def _image_parts(turn: dict) -> list:
    content = turn.get("content", turn.get("value"))
    if not isinstance(content, list):
        return []
    return [part for part in content if isinstance(part, dict) and part.get("type") in ("image", "image_url")]


# ---------------------------------------------------------------------- image references
def resolve_rows(rows: list[dict], folder: Path | None, field_name: str) -> list[dict]:
    """The rows with every image given as a file path made absolute and checked. ``folder``: the dataset file's
    folder, which relative paths are taken from; None for a hub split, whose paths must be absolute and lie under the
    allowed roots or the ``datasets`` cache. A URL, a path or symlink that leads outside the roots, or a missing file
    is a DatasetError naming the row. Rows without images are returned as they are."""
    if not has_images(rows):
        return rows
    roots = paths.data_ref_roots(folder)
    out = []
    for index, row in enumerate(rows):
        def fix(ref: Any, index: int = index) -> Any:
            return _resolve_ref(ref, folder, roots, field_name, index)
        out.append(_map_refs(row, fix) if isinstance(row, dict) else row)
    return out


def refs_of(row: dict) -> list:
    """The images a row names (file paths once resolved, or bytes), in order."""
    found: list = []
    _map_refs(row, lambda ref: found.append(ref) or ref)
    return found


def _map_refs(row: dict, fix) -> dict:
    row = dict(row)
    for column in IMAGE_COLUMNS:
        value = row.get(column)
        if isinstance(value, list):
            row[column] = [fix(v) for v in value]
        elif value not in (None, ""):
            row[column] = fix(value)
    for column in ("messages", "conversations"):
        turns = as_turn_list(row.get(column))
        if turns is None:
            continue
        new_turns = []
        for turn in turns:
            if isinstance(turn, dict) and _image_parts(turn):
                key = "content" if "content" in turn else "value"
                turn = {**turn, key: [_fix_part(p, fix) for p in turn[key]]}
            new_turns.append(turn)
        row[column] = new_turns
    return row


def _fix_part(part: Any, fix) -> Any:
    if not isinstance(part, dict):
        return part
    if part.get("type") == "image" and part.get("image") not in (None, ""):
        return {**part, "image": fix(part["image"])}
    if part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return {"type": "image", "image": fix(url)}
    return part


def _resolve_ref(ref: Any, folder: Path | None, roots: list[Path], field_name: str, index: int) -> Any:
    if isinstance(ref, dict) and ref.get("bytes"):  # the datasets Image feature as stored in parquet
        return ref["bytes"]
    if isinstance(ref, dict) and ref.get("path"):
        ref = ref["path"]
    if not isinstance(ref, str):
        return ref  # bytes or an image object: nothing to resolve
    text = ref.strip()
    where = f"row {index}: image {text[:80]!r}"
    if text.lower().startswith(("http://", "https://", "ftp://")):
        raise DatasetError(field_name, f"{where} is a URL; {URL_FIX}")
    if text.lower().startswith("data:"):
        raise DatasetError(field_name, f"{where[:40]}... is a data URL; save the image as a file next to the dataset")
    problem = paths.path_problem(text)
    if problem:
        raise DatasetError(field_name, f"row {index}: {problem}")
    candidate = Path(text).expanduser()
    if not candidate.is_absolute():
        if folder is None:
            raise DatasetError(field_name, f"{where} is a relative path in a hub split, which has no folder to take "
                                           "it from: use the datasets Image feature (bytes)")
        candidate = folder / candidate
    try:
        resolved = paths.resolve_data_ref(candidate, roots)
    except paths.UnsafePathError as exc:
        raise DatasetError(field_name, f"row {index}: {exc}. Keep images (and what their links point to) "
                                       f"{paths.DATA_REF_PLACES}.") from None
    if not resolved.is_file():
        raise DatasetError(field_name, f"{where} does not exist ({resolved}): check the path, which is taken "
                                       "from the dataset file's folder")
    return str(resolved)


# ---------------------------------------------------------------------- normalisation
def normalize(rows: list[dict], mapping: dict[str, str] | None, system_prompt: str,
              field_name: str, allow_empty: bool = False) -> NormalizedData:
    """Image rows in the one vision shape (module docstring); unusable rows are dropped and counted."""
    mapping = dict(mapping or {})
    reason = _reason(rows, mapping)
    system = system_prompt.strip()
    out: list[dict] = []
    dropped: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    for index, row in enumerate(rows):
        value, problem = _convert(row, mapping) if isinstance(row, dict) else (None, "not a mapping")
        if problem:
            dropped[problem] += 1
            shown = examples.setdefault(problem, [])
            if len(shown) < MAX_DROP_EXAMPLES:
                shown.append(f"row {index}")
            continue
        messages, images = value
        if system and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": [{"type": "text", "text": system}]})
        out.append({"messages": messages, "images": images})
    data = NormalizedData(format=FORMAT, reason=reason, rows=out, dropped=dict(dropped),
                          drop_examples={k: v for k, v in examples.items() if v})
    if not out and not allow_empty:
        raise no_usable_rows(field_name, len(rows), data.dropped)
    return data


def _reason(rows: list[dict], mapping: dict[str, str]) -> str:
    columns = {c for row in rows[:_SAMPLE] if isinstance(row, dict) for c in row}
    image = next((c for c in IMAGE_COLUMNS if c in columns), None)
    if "messages" in columns or "conversations" in columns:
        chat = "messages" if "messages" in columns else "conversations"
        return (f"found images: a '{chat}' column with image parts" if image is None
                else f"found images: a '{image}' column with '{chat}' turns ({PLACEHOLDER} marks where each goes)")
    question, answer = mapping.get("question", "question"), mapping.get("answer", "answer")
    if question in columns and answer in columns:
        return f"found images: '{image}', '{question}' and '{answer}' columns"
    text = mapping.get("text", "text")
    return f"found images: '{image}' and '{text}' columns (captions)"


def _convert(row: dict, mapping: dict[str, str]) -> tuple[Any, str | None]:
    images = _row_images(row)
    for column in ("messages", "conversations"):
        turns = as_turn_list(row.get(column))
        if turns is not None:
            return _from_turns(turns, images)
    question = row.get(mapping.get("question", "question"))
    answer = row.get(mapping.get("answer", "answer"))
    if answer is None and question is None:
        answer, question = row.get(mapping.get("text", "text")), CAPTION_PROMPT
    if not images:
        return None, "no image"
    if not _is_text(question) or not _is_text(answer):
        return None, "missing question or answer text"
    user = [*({"type": "image"} for _ in images), {"type": "text", "text": str(question)}]
    return ([{"role": "user", "content": user},
             {"role": "assistant", "content": [{"type": "text", "text": str(answer)}]}], images), None


def _row_images(row: dict) -> list:
    for column in IMAGE_COLUMNS:
        value = row.get(column)
        if value not in (None, "", []):
            return list(value) if isinstance(value, list) else [value]
    return []


def _from_turns(turns: list, images: list) -> tuple[Any, str | None]:
    messages, inline = [], []
    for turn in turns:
        if not isinstance(turn, dict):
            return None, "malformed turn"
        role = ROLE_ALIASES.get(str(turn.get("role", turn.get("from", ""))).strip().lower())
        if role is None:
            return None, "unsupported role"
        content = turn.get("content", turn.get("value"))
        parts: list[dict] = []
        if isinstance(content, str):
            pieces = content.split(PLACEHOLDER)
            for i, piece in enumerate(pieces):
                if i:
                    parts.append({"type": "image"})
                if piece.strip():
                    parts.append({"type": "text", "text": piece.strip()})
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    return None, "malformed turn"
                if part.get("type") == "image":
                    parts.append({"type": "image"})
                    if part.get("image") not in (None, ""):
                        inline.append(part["image"])
                elif part.get("type") == "text" and _is_text(part.get("text")):
                    parts.append({"type": "text", "text": str(part["text"])})
        else:
            return None, "malformed turn"
        if parts:
            messages.append({"role": role, "content": parts})
    if not any(m["role"] == "assistant" for m in messages):
        return None, "no assistant turn"
    if not any(m["role"] == "user" for m in messages):
        return None, "no user turn"
    if inline and images:
        return None, "images both in the turns and in an images column: keep one"
    images = inline or images
    slots = sum(1 for m in messages for p in m["content"] if p["type"] == "image")
    if slots == 0 and images:  # no placeholder at all: the images go before the first user text (TRL's rule)
        first = next(m for m in messages if m["role"] == "user")
        first["content"] = [*({"type": "image"} for _ in images), *first["content"]]
        slots = len(images)
    if slots != len(images):
        return None, f"{PLACEHOLDER} placeholders and images differ in number"
    return (messages, images), None


def _is_text(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value).strip() != ""



# ---------------------------------------------------------------------- data against model and settings
def model_problems(cfg: Any, data_has_images: bool, field_name: str) -> list[DatasetError]:
    """What the model and the settings say about image data, before start (never the tensor-shape error at step
    1): images need a vision-language model, packing off, and room in max_seq_length for an image's tokens;
    ``is_dataset_image`` asks for images, so data without any is refused. A vision model on text-only data is no
    problem: it trains as text (the worker says so)."""
    from trainer_core.planning import model_info, modality  # reads the model's config files: only when images are in play

    problems = []
    if cfg.is_dataset_image and not data_has_images:
        problems.append(DatasetError("is_dataset_image", f"is on, but {field_name} holds no images (no image column, "
                                     "image parts or <image> placeholders): turn it off, or use image data"))
    if not data_has_images:
        return problems
    if cfg.packing:
        problems.append(DatasetError("packing", "rows with images cannot be packed together: turn packing off"))
    try:
        found = modality.detect_modality(cfg.model_name)
    except model_info.ModelInfoError:
        return problems  # the model field's own check says what is wrong with it
    if not found.is_vision:
        problems.append(DatasetError("model_name", f"{cfg.model_label} is a {kinds.get(found.kind).label.lower()} "
                                     f"model ({found.architecture}), but {field_name} holds images: "
                                     f"{kinds.get(modality.VISION).method_fix}, or a dataset without images"))
    elif found.image_tokens and cfg.max_seq_length <= found.image_tokens:
        problems.append(DatasetError("max_seq_length", f"is {cfg.max_seq_length}, but one image takes "
                                     f"{found.image_tokens} tokens in {cfg.model_label}: the <image> run would be "
                                     f"cut. Raise max_seq_length above {found.image_tokens} plus the text's length "
                                     f"(e.g. {found.image_tokens + 256})"
                                     + (", or resize the images (fewer tiles, fewer tokens)" if found.dynamic else "")))
    return problems
