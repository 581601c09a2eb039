"""Images for vision-language models, shared by the server, the sessions and the trainers.

An image is always its encoded bytes. Wherever a forward runs (sampler or trainer), its pixels
are computed from those bytes by the model's own image processor, and it occupies a run of the
model's image token in the ids, as many as the processor says. So stored ids = sampled ids =
recomputed ids holds for multimodal turns as it does for text, and the pixels agree too.

Images come from agents and clients, so they are decoded defensively: PNG or JPEG only, a byte
and a pixel bound checked before anything is decompressed.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_agent.images import (  # noqa: F401 - read here by the server and sessions
    IMAGE_FORMATS,
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    ImageError,
    decode_image,
)
from skyrl_agent.types import PlacedImage

MAX_IMAGES = 32
"""Images in one prompt: each may decode to ~50 MB of pixels, and a forward decodes all of a
prompt's new images at once."""


NEVER = -1e9
"""The logit that makes a token's probability exactly 0 in float32, yet keeps a (weight-0)
logprob of it finite."""


def unsampled_image_token(logits: Any, images: ImageInputs | None) -> Any:
    """`logits` (…, vocab) with a vision model's image token made impossible: it stands for an
    image, so a sampled one would be an image span without an image. The sampler and the
    trainer both apply this, so their distributions (and logprobs) stay the same."""
    if images is None:
        return logits
    logits = logits.clone()
    logits[..., images.token_id] = NEVER
    return logits



def is_vision_model(folder: Path) -> bool:
    """Whether the Hugging Face folder holds a vision-language model (its config nests a
    vision tower's)."""
    config = folder / "config.json"
    return config.is_file() and "vision_config" in json.loads(config.read_text())


def load_pretrained(folder: Path, dtype: Any) -> Any:
    """The model in `folder`: a causal LM, or an image-text-to-text model for a VLM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    loader = AutoModelForImageTextToText if is_vision_model(folder) else AutoModelForCausalLM
    return loader.from_pretrained(folder, dtype=dtype)


@functools.cache
def image_inputs(folder: Path) -> ImageInputs | None:
    """The image inputs of the model in `folder` (None: not a vision model), loaded once."""
    return ImageInputs.for_model(folder)


def tokenizer_images(tokenizer: Any) -> ImageInputs | None:
    """The image inputs of the model folder `tokenizer` was loaded from (None: not a vision
    model, or not loaded from a folder)."""
    source = getattr(tokenizer, "name_or_path", "")
    return image_inputs(Path(source).resolve()) if source and Path(source).is_dir() else None


def text_config(config: Any) -> Any:
    """The language model's part of a (possibly multimodal) config."""
    return config.get_text_config()


@dataclass(frozen=True)
class Rendered:
    """A prompt with its images in place: ids (image spans hold the image token) and images."""

    ids: list[int]
    images: tuple[PlacedImage, ...]


class ImageInputs:
    """The model's processor, reduced to what token-exact turns need: how many placeholder
    tokens an image takes, the ids of a prompt with images in place, and the pixel inputs the
    model reads beside the ids."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.image_token: str = processor.image_token
        self.token_id: int = processor.tokenizer.convert_tokens_to_ids(self.image_token)
        self._counts: OrderedDict[str, int] = OrderedDict()

    @classmethod
    def for_model(cls, folder: Path) -> ImageInputs | None:
        """The image inputs of the VLM in `folder`; None for a text-only model."""
        if not is_vision_model(folder):
            return None
        from transformers import AutoProcessor

        return cls(AutoProcessor.from_pretrained(folder))

    def token_count(self, data: bytes, decoded: Any = None) -> int:
        """How many image tokens the processor gives this image (`decoded`: the image already
        decoded, when the caller has it)."""
        key = PlacedImage(data, 0, 1).sha256
        if key not in self._counts:
            image = decoded if decoded is not None else decode_image(data)
            ids = self.processor(text=self.image_token, images=[image],
                                 add_special_tokens=False)["input_ids"][0]
            self._counts[key] = sum(1 for i in ids if i == self.token_id)
            if len(self._counts) > 4096:
                self._counts.popitem(last=False)
        self._counts.move_to_end(key)
        return self._counts[key]

    def check_expected(self, data: bytes, expected: int | None) -> None:
        """The image takes `expected` tokens (None: no expectation), as the processor says."""
        if expected is not None and expected != self.token_count(data):
            raise ImageError(f"an image takes {self.token_count(data)} tokens, not the "
                             f"expected {expected}")

    def expand(self, chunks: Sequence[Sequence[int] | bytes]) -> Rendered:
        """Token chunks and images (bytes), in order, as ids with each image's span filled
        with the image token. Token chunks may not hold the image token themselves: an image
        span without its image would fail the forward."""
        check_image_count(sum(1 for chunk in chunks if isinstance(chunk, bytes)))
        ids: list[int] = []
        images: list[PlacedImage] = []
        for chunk in chunks:
            if isinstance(chunk, bytes):
                image = PlacedImage(chunk, len(ids), self.token_count(chunk))
                images.append(image)
                ids.extend([self.token_id] * image.length)
            else:
                if self.token_id in chunk:
                    raise ImageError(f"token id {self.token_id} ({self.image_token}) stands for "
                                     "an image; send the image itself as an image chunk")
                ids.extend(chunk)
        return Rendered(ids, tuple(images))

    def render_text(self, text: str, images: Sequence[bytes]) -> Rendered:
        """Text holding one image token per image (as a chat template writes them) tokenized
        by the processor itself, which expands each one to the image's span."""
        if text.count(self.image_token) != len(images):
            raise ImageError(f"{text.count(self.image_token)} image placeholders for "
                             f"{len(images)} images")
        check_image_count(len(images))
        decoded = [decode_image(data) for data in images]
        ids = list(self.processor(text=text, images=decoded or None,
                                  add_special_tokens=False)["input_ids"][0])
        placed, at = [], 0
        for data, image in zip(images, decoded, strict=True):
            length = self.token_count(data, image)
            at = ids.index(self.token_id, at)
            if ids[at : at + length] != [self.token_id] * length:
                raise ImageError("the processor's image spans do not match its token counts")
            placed.append(PlacedImage(data, at, length))
            at += length
        return Rendered(ids, tuple(placed))

    def check_placement(self, ids: Sequence[int], images: Sequence[PlacedImage]) -> None:
        """Every image token belongs to exactly one image's span, each span is whole, in
        order, and the right length for its image."""
        check_image_count(len(images))
        covered = 0
        previous_end = 0
        for image in images:
            if image.offset < previous_end or image.end > len(ids):
                raise ImageError(f"image span {image.offset}..{image.end} overlaps another or "
                                 f"runs past {len(ids)} tokens")
            if any(ids[i] != self.token_id for i in range(image.offset, image.end)):
                raise ImageError(f"image span {image.offset}..{image.end} holds other tokens")
            self.check_expected(image.data, image.length)
            covered += image.length
            previous_end = image.end
        stray = sum(1 for i in ids if i == self.token_id) - covered
        if stray:
            raise ImageError(f"{stray} image tokens belong to no image")

    def model_kwargs(self, images: Sequence[bytes], device: Any = None) -> dict[str, Any]:
        """The pixel inputs (pixel_values and whatever else this processor gives) for these
        images, in order; empty without images."""
        if not images:
            return {}
        out = self.processor.image_processor(images=[decode_image(d) for d in images],
                                             return_tensors="pt")
        return {name: value.to(device) if device is not None else value
                for name, value in out.items()}


def check_image_count(images: int) -> None:
    """At most MAX_IMAGES in one prompt (checked before any is decoded)."""
    if images > MAX_IMAGES:
        raise ImageError(f"{images} images in one prompt; at most {MAX_IMAGES} are taken")


def image_bytes(reference: str) -> bytes:
    """The bytes of an image sent inline: base64, or a `data:image/...;base64,` URL. A server
    never fetches a remote URL for a client (it would reach wherever the server can)."""
    import base64
    import binascii

    if reference.startswith("data:"):
        header, _, reference = reference.partition(",")
        if not header.endswith(";base64"):
            raise ImageError("an image data URL must be base64 (data:image/png;base64,...)")
    elif "://" in reference:
        raise ImageError("images are taken inline only (base64 or a data: URL), not fetched "
                         "from a URL")
    try:
        return base64.b64decode(reference, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("an image is not valid base64") from None


def split_image_parts(messages: Sequence[dict[str, Any]],
                      ) -> tuple[list[dict[str, Any]], list[bytes]]:
    """OpenAI chat messages with `image_url` content parts as the chat templates of HF
    processors take them (`{"type": "image"}` where each image goes), and the images in
    order."""
    images: list[bytes] = []
    converted = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            converted.append(message)
            continue
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                if not isinstance(url, str):
                    raise ImageError("an image_url part needs image_url.url")
                check_image_count(len(images) + 1)  # before taking in one more
                images.append(image_bytes(url))
                parts.append({"type": "image"})
            else:
                parts.append(part)
        converted.append({**message, "content": parts})
    return converted, images
