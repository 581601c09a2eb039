"""Image bytes read defensively, wherever they come from (agents, clients, task folders): PNG or
JPEG only, a byte and a pixel bound checked before anything is decompressed. A leaf module, so
task loading and the model servers check images the same way."""

from __future__ import annotations

import io
from typing import Any

MAX_IMAGE_BYTES = 8 << 20
MAX_IMAGE_PIXELS = 4096 * 4096
IMAGE_FORMATS = {"PNG": "png", "JPEG": "jpeg"}


class ImageError(ValueError):
    """An image that is not one we read (format, size, or placement): a client error."""


def decode_image(data: bytes) -> Any:
    """A PIL RGB image from PNG/JPEG bytes, bounded before decompression (a crafted file can
    declare billions of pixels in a few bytes)."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"an image of {len(data)} bytes; at most {MAX_IMAGE_BYTES} are read")
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError:
        raise ImageError(f"an image of more than {MAX_IMAGE_PIXELS} pixels; at most "
                         f"{MAX_IMAGE_PIXELS} pixels are read") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise ImageError(f"not a readable image: {exc}") from None
    if image.format not in IMAGE_FORMATS:
        raise ImageError(f"image format {image.format}; only PNG and JPEG are read")
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageError(f"an image of {width}x{height} pixels; at most {MAX_IMAGE_PIXELS} "
                         "pixels are read")
    try:
        image.load()
    except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt data
        raise ImageError(f"not a readable image: {exc}") from None
    return image.convert("RGB")
