"""The New run page's vision panels: what the model's config says about images (trainer_core.planning.modality), and the
first image rows of the chosen file as thumbnails with the tokens each image takes. Config files and images only:
no ML stack. Paths are resolved and checked by the data loader (only where user data lives) before an image is
opened; a thumbnail is decoded from the header up (ui.image_check: size checked first, JPEG decoded scaled down),
cached per file, and handed to the page as PNG bytes, never a path; a row whose image does not decode is named with
the fix, and the page goes on."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from trainer_core.planning import model_info
from trainer_core.data import DatasetError
from trainer_core.data import images as image_data
from trainer_core import kinds
from trainer_core.planning.modality import ModalityInfo, detect_modality
from ui import image_check
from ui.text import safe

THUMBNAILS = 4  # image rows shown under the dataset picker
THUMB_PX = 96
THUMB_DECODED_PX = 2 * THUMB_PX  # a side of the PNG sent (sharp on high-density screens)
NOT_IMAGE_FIX = "replace it with a PNG, JPEG, WebP or GIF file, or remove the row"


@st.cache_data(ttl=600, max_entries=32, show_spinner=False)
def modality_cached(name: str, _token: str | None = None) -> tuple[ModalityInfo | None, str]:
    """(info, "") or (None, why). Failures are cached too: an offline hub id is not retried per rerun."""
    try:
        return detect_modality(name, token=_token), ""
    except model_info.ModelInfoError as exc:
        return None, exc.message


def modality_panel(name: str, token: str | None, max_seq_length: int) -> ModalityInfo | None:
    """A line saying what the detector found for a vision-language or speech model (text models need no extra
    line)."""
    if not name:
        return None
    info, _ = modality_cached(name, token)
    if info is not None and "speech" in kinds.get(info.kind).data_shapes:  # speech-to-text and text-to-speech
        st.info(safe(info.summary()), icon="🔊")
        return info
    if info is None or not info.is_vision:
        return info
    st.info(safe(info.summary()) + " Image rows train with its processor; text-only data trains as text.", icon="🖼️")
    if info.image_tokens and max_seq_length <= info.image_tokens:
        st.warning(f"**max_seq_length** ({max_seq_length}) leaves no room for one image ({info.image_tokens} tokens): "
                   f"raise it above {info.image_tokens} plus the text's length.")
    return info


def image_format_note(rows: list[dict]) -> bool:
    """For image rows: say what was detected (they need no column pickers) and return True."""
    if not image_data.has_images(rows):
        return False
    data = image_data.normalize(rows, None, "", "local_datasets", allow_empty=True)
    dropped = sum(data.dropped.values())
    st.caption(f"Auto-detected format: **{image_data.FORMAT}** ({safe(data.reason)})"
               + (f"; {dropped} of the first {len(rows)} rows would be dropped" if dropped else "") + ".")
    return True


def image_rows(rows: list[dict], folder: Path) -> tuple[list[tuple[int, dict]], str]:
    """The first image rows as (index in the file, row in the trainer's shape), their paths resolved from ``folder``
    ([] when none); or a problem (a URL, a path that is not user data) as the loader words it."""
    if not image_data.has_images(rows):
        return [], ""
    try:
        resolved = image_data.resolve_rows(rows[:THUMBNAILS * 3], folder, "local_datasets")
    except DatasetError as exc:
        return [], exc.message
    shown = []
    for index, row in enumerate(resolved):
        kept = image_data.normalize([row], None, "", "local_datasets", allow_empty=True).rows
        if kept:
            shown.append((index, kept[0]))
    return shown[:THUMBNAILS], ""


@st.cache_data(max_entries=64, show_spinner=False)
def _thumbnail_of_file(path: str, stamp: tuple[int, int]) -> tuple[bytes | None, str]:
    """(PNG, "") or (None, why) for one image file; ``stamp`` (mtime, size): an edited file is read again."""
    return _thumbnail(path)


@st.cache_data(max_entries=64, show_spinner=False)
def _thumbnail_of_bytes(data: bytes) -> tuple[bytes | None, str]:
    return _thumbnail(data)


def _thumbnail(source: bytes | str) -> tuple[bytes | None, str]:
    try:
        return image_check.thumbnail_png(source, THUMB_DECODED_PX), ""
    except ValueError as exc:
        fix = NOT_IMAGE_FIX if str(exc) == image_check.NOT_AN_IMAGE else "resize it, or remove the row"
        return None, f"{exc}: {fix}"


def thumbnail(ref) -> tuple[bytes | None, str]:
    """A row's image as thumbnail PNG bytes, or (None, why with the fix); (None, "") for a value that is neither a
    path nor bytes (the training check says what is wrong with it)."""
    if isinstance(ref, (bytes, bytearray)):
        return _thumbnail_of_bytes(bytes(ref))
    if not isinstance(ref, str):
        return None, ""
    try:
        stat = Path(ref).stat()
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc}): check the file, or remove the row"
    return _thumbnail_of_file(ref, (stat.st_mtime_ns, stat.st_size))


def thumbnails_panel(rows: list[dict], source: Path | None, info: ModalityInfo | None) -> None:
    """Thumbnails of the first image rows of ``source`` (the first dataset file), each with the tokens its images
    take in the model's sequence; a row whose first image does not decode gets a warning naming it, not a picture."""
    if source is None:
        return
    shown, problem = image_rows(rows, source if source.is_dir() else source.parent)
    if problem:
        st.warning(f"**local_datasets**: {safe(problem)}")
        return
    if not shown:
        return
    per_image = info.image_tokens if info is not None and info.is_vision else 0
    st.markdown("**Images** (the first rows, as the model will see them)")
    problems = []
    for column, (index, row) in zip(st.columns(len(shown)), shown):
        ref = row["images"][0] if row["images"] else None
        picture, why = thumbnail(ref)
        if picture is not None:
            column.image(picture, width=THUMB_PX)
        elif why:
            name = Path(ref).name if isinstance(ref, str) else "(bytes in the row)"
            problems.append(f"row {index}: image {name!r} {why}")
        question = next((p["text"] for m in row["messages"] if m["role"] == "user"
                         for p in m["content"] if p["type"] == "text"), "")
        tokens = (f"{per_image * len(row['images'])} image tokens" if per_image
                  else "image tokens: see the model's processor")
        column.caption(f"{len(row['images'])} image(s) · {tokens} · {safe(question[:60])}")
    for problem in problems:
        st.warning(f"**local_datasets**: {safe(problem)}")
