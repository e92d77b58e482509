"""The one check of an image a user hands the dashboard, before its pixels are decoded: the Playground's
attachments and New run's thumbnails. Pillow reads the header (format and size) without the pixels; the size is held
to the serve gate's pixel limit, which a 1,000-byte PNG claiming 100,000 x 100,000 px would otherwise turn into
gigabytes of memory in the shared dashboard process."""
from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from trainer_core.serving.gate import MAX_IMAGE_PIXELS

NOT_AN_IMAGE = "is not an image that can be read"


def header(source: bytes | str | Path) -> tuple[str, tuple[int, int]]:
    """(format, (width, height)) from the image's header alone; ValueError(NOT_AN_IMAGE) when Pillow cannot read
    one, or naming the pixels when the header claims so many that Pillow's own guard refuses it."""
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            return image.format or "", image.size
    except Image.DecompressionBombError:
        raise ValueError(f"claims far more pixels than the {MAX_IMAGE_PIXELS:,} the dashboard decodes") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise ValueError(NOT_AN_IMAGE) from None


def thumbnail_png(source: bytes | str | Path, side: int) -> bytes:
    """A PNG of at most ``side`` px a side, decoded at the smallest scale the format allows (JPEG's draft decodes an
    8x smaller image directly). ValueError naming the problem: not an image, or more than MAX_IMAGE_PIXELS to
    decode even at that scale."""
    header(source)
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            image.draft("RGB", (side, side))  # JPEG: the decoder itself scales down; other formats: no change
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ValueError(f"is {width:,} x {height:,} pixels, more than the {MAX_IMAGE_PIXELS:,} the dashboard "
                                 "decodes (the serve gate's limit too)")
            image.thumbnail((side, side))
            out = io.BytesIO()
            image.convert("RGBA" if image.mode in ("RGBA", "LA", "P") else "RGB").save(out, "PNG")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError, SyntaxError):
        raise ValueError(NOT_AN_IMAGE) from None  # a header that reads, then pixels that do not
    return out.getvalue()
