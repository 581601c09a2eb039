"""Tinker's image chunks: a ModelInput lists token chunks and image chunks in order, and an
image chunk stands for as many positions as the model's processor gives the image.

A forward_backward datum's arrays cover those positions, so an image chunk there must say how
many it takes (`expected_tokens`); the positions are filled with the model's image token once the
model is known, and a count that differs from the processor's is refused. A sampling prompt's
image chunks are expanded the same way (the count may be left out there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from skyrl_agent.backends.backend import Datum
from skyrl_agent.model.vision import ImageError, ImageInputs, Rendered, image_inputs
from skyrl_agent.tinker.errors import TinkerUserError

IMAGE_SLOT = -1
"""The id an image chunk's positions hold until the model's image token is known."""


def vision_of(folder: Path, name: str) -> ImageInputs:
    inputs = image_inputs(folder)
    if inputs is None:
        raise TinkerUserError(f"{name} is not a vision model; it takes no image chunks")
    return inputs


def with_image_tokens(data: Sequence[Datum], folder: Path, name: str) -> list[Datum]:
    """The data with each image's positions holding the image token, each image's count
    checked against the processor's and no image token outside an image."""
    out = []
    for index, datum in enumerate(data):
        if not datum.images:
            out.append(datum)
            continue
        inputs = vision_of(folder, name)
        ids = tuple(inputs.token_id if i == IMAGE_SLOT else i for i in datum.model_input)
        try:
            inputs.check_placement(ids, datum.images)
        except ImageError as exc:
            raise TinkerUserError(f"datum {index}: {exc}") from None
        out.append(replace(datum, model_input=ids))
    return out


def prompt_with_images(chunks: Sequence[object], folder: Path, name: str) -> Rendered:
    """A sampling prompt's chunks (the SDK's pydantic types) as ids with images placed."""
    parts: list[Sequence[int] | bytes] = []
    for chunk in chunks:
        kind = getattr(chunk, "type", None)
        if kind == "encoded_text":
            parts.append([int(t) for t in chunk.tokens])  # type: ignore[attr-defined]
        elif kind == "image":
            parts.append(bytes(chunk.data))  # type: ignore[attr-defined]
        else:
            raise TinkerUserError(f"prompt chunks of type {kind!r} are not supported")
    if not any(isinstance(part, bytes) for part in parts):
        return Rendered([t for part in parts for t in part], ())
    inputs = vision_of(folder, name)
    expected = [getattr(c, "expected_tokens", None) for c in chunks
                if getattr(c, "type", None) == "image"]
    try:
        rendered = inputs.expand(parts)
        for image, wanted in zip(rendered.images, expected, strict=True):
            inputs.check_expected(image.data, wanted)
    except ImageError as exc:
        raise TinkerUserError(str(exc)) from None
    return rendered
