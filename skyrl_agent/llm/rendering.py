"""Rendering only the new messages of a growing chat, as token ids, with the model's template.

Re-tokenizing a whole transcript each turn is what makes trainer and sampler disagree: the
template and the tokenizer do not round-trip what the model sampled. Instead a conversation is
rendered once, and afterwards only the text the template would put after the last assistant
reply is tokenized and appended to the ids already sent and sampled.

The template's shape is learned once per tokenizer (and tool list) by rendering a probe
conversation:
- what it writes after an assistant message (e.g. `<|im_end|>\\n` for ChatML), split into the
  end-of-turn token the model samples itself and the separator that follows it;
- what it writes for new messages after that
  (e.g. `<|im_start|>user\\n...<|im_start|>assistant\\n`).

New messages are the per-step cost of every agent, so for a plain message (a role and a text)
the text around its content is learned per role (`RoleShape`) and reused, with no template
render. A role gets a shape only when probes of awkward contents, alone and two in a row, render
exactly as the shape says (a template that trims, escapes or looks at the content gets none);
anything else is rendered by the template.

A vision model's messages may hold images: content parts `{"type": "image", "data": bytes}`
beside `{"type": "text", "text": ...}` (see `image_part`). The template (the processor's) writes
its image placeholder where each goes, and the processor expands each to the image's span of
image tokens; the `render_*` methods return the ids with the images placed.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from skyrl_agent.model.vision import ImageInputs, Rendered

Message = dict[str, Any]
_PROBE_HEAD: list[Message] = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
_MARKER = "PROBE-REPLY-4f1c"


_SHAPE_PROBES = ("", "A", "  two\nlines \t", "{{ x }} {% raw %} \\ \"q\" 'q' é 日本",
                 "<|im_end|><|eot_id|></s>[INST]", '{"a": [1, 2]}\n\n',
                 "<tool_response>\nr\n</tool_response>", "<think>t</think>a", "/no_think")
"""Contents a template might trim, escape, or branch on (tool responses, thinking switches)."""


class TemplateError(ValueError):
    """The model's chat template cannot be rendered incrementally."""


@dataclass(frozen=True)
class RoleShape:
    """How the template writes a plain message of one role after an assistant reply."""

    before: str
    """The text before the content (e.g. `<|im_start|>user\\n`)."""
    after: str
    """The text after it (e.g. `<|im_end|>\\n`)."""
    generation_prompt: str
    """What follows the last new message (e.g. `<|im_start|>assistant\\n`)."""

    def render(self, contents: Sequence[str]) -> str:
        return "".join(f"{self.before}{c}{self.after}" for c in contents) + self.generation_prompt


class ChatRenderer:
    """Token ids for a conversation's start, and for the messages that extend it."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None,
                 images: ImageInputs | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the model has no chat template")
        self.tokenizer = tokenizer
        self.tools = tools
        self.images = images
        """A vision model's image inputs; its processor's template renders the messages."""
        self._template_owner = images.processor if images is not None else tokenizer
        learned = _learned_for(self._template_owner, tools)
        if learned.probe is None:
            with_reply = self._text([*_PROBE_HEAD, {"role": "assistant", "content": _MARKER}],
                                    False)
            if _MARKER not in with_reply:
                raise TemplateError("the chat template drops assistant messages")
            learned.probe = with_reply
        self._probe = with_reply = learned.probe
        after_reply = with_reply[with_reply.rindex(_MARKER) + len(_MARKER):]
        eos = tokenizer.eos_token or ""
        if eos and after_reply.startswith(eos):
            self.end_of_turn, self.separator = eos, after_reply[len(eos):]
        else:
            self.end_of_turn, self.separator = "", after_reply
        self.end_of_turn_ids = frozenset(
            i for i in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(eos or "")) if
            isinstance(i, int) and i >= 0)
        self._shapes = learned.shapes

    def _text(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        return self._template_owner.apply_chat_template(
            list(messages), tools=self.tools, tokenize=False,
            add_generation_prompt=add_generation_prompt)

    def _encode(self, text: str, beside_others: bool = False) -> list[int]:
        """The ids of `text`; `beside_others` for long texts tokenized off the event loop: the
        batch call lets other threads run meanwhile (a single `encode` holds the GIL)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return self.tokenizer.encode(text, add_special_tokens=False)
        # The Rust tokenizer directly: same ids, a fraction of the cost.
        if beside_others:
            return backend.encode_batch([text], add_special_tokens=False)[0].ids
        return backend.encode(text, add_special_tokens=False).ids

    def start(self, messages: Sequence[Message]) -> list[int]:
        """The ids of a fresh conversation, ending with the assistant generation prompt."""
        return _ids_only(self.render_start(messages))

    def extend(self, completion_ids: Sequence[int], messages: Sequence[Message]) -> list[int]:
        """Ids to append after a sampled completion so that `messages` follow it.

        A completion cut off by max_tokens did not sample its end-of-turn token; it is added
        here (as prompt, never as a trained token).
        """
        return _ids_only(self.render_extend(completion_ids, messages))

    def render_start(self, messages: Sequence[Message]) -> Rendered:
        """`start`, with the images of the messages placed (offsets from the first id)."""
        template, pictures = split_images(messages)
        return self._encode_with(self._text(template, True), pictures)

    def render_extend(self, completion_ids: Sequence[int],
                      messages: Sequence[Message]) -> Rendered:
        """`extend`, with the images of the messages placed (offsets from the first new id)."""
        template, pictures = split_images(messages)
        closed = bool(completion_ids) and completion_ids[-1] in self.end_of_turn_ids
        text = ("" if closed else self.end_of_turn) + self.separator + self.new_messages(template)
        return self._encode_with(text, pictures)

    def _encode_with(self, text: str, pictures: list[bytes],
                     beside_others: bool = False) -> Rendered:
        if not pictures:
            return Rendered(self._encode(text, beside_others), ())
        if self.images is None:
            raise TemplateError("the messages hold images but the model is not a vision model")
        return self.images.render_text(text, pictures)

    def new_messages(self, messages: Sequence[Message]) -> str:
        """The template's text for `messages` following an assistant reply, plus the prompt."""
        roles = {message.get("role") for message in messages}
        if len(roles) == 1 and all(_plain(message) for message in messages):
            shape = self.role_shape(str(messages[0]["role"]))
            if shape is not None:
                return shape.render([message["content"] for message in messages])
        return self._rendered_after_reply(messages)

    def _rendered_after_reply(self, messages: Sequence[Message],
                              add_generation_prompt: bool = True) -> str:
        probe = [*_PROBE_HEAD, {"role": "assistant", "content": _MARKER}]
        full = self._text([*probe, *messages], add_generation_prompt)
        if not full.startswith(self._probe):
            raise TemplateError("the chat template rewrites earlier messages when new ones "
                                "follow; it cannot be rendered incrementally")
        return full[len(self._probe):]

    def role_shape(self, role: str) -> RoleShape | None:
        """The learned shape of a plain `role` message, or None when the template does not
        write every probe content verbatim between the same two texts (learned once)."""
        if role not in self._shapes:
            self._shapes[role] = self._learn_shape(role)
        return self._shapes[role]

    def _learn_shape(self, role: str) -> RoleShape | None:
        try:
            alone = self._rendered_after_reply([{"role": role, "content": _MARKER}], False)
            prompted = self._rendered_after_reply([{"role": role, "content": _MARKER}])
        except Exception:  # noqa: BLE001 - a template that refuses the role: no shape
            return None
        if alone.count(_MARKER) != 1 or not prompted.startswith(alone):
            return None
        before, after = alone.split(_MARKER)
        shape = RoleShape(before, after, prompted[len(alone):])
        cases = [[c] for c in _SHAPE_PROBES] + [list(_SHAPE_PROBES[1:3]), ["", "A"]]
        for contents in cases:
            messages = [{"role": role, "content": c} for c in contents]
            try:
                if self._rendered_after_reply(messages) != shape.render(contents):
                    return None
            except Exception:  # noqa: BLE001 - e.g. a template that refuses empty content
                return None
        return shape

    def full(self, messages: Sequence[Message]) -> list[int]:
        """A from-scratch rendering of the whole conversation (for the drift metric only),
        ending where a recorded conversation ends: after the last end-of-turn token."""
        template, pictures = split_images(messages)
        text = self._text(template, False)
        if self.separator and text.endswith(self.separator):
            text = text[: -len(self.separator)]
        return self._encode_with(text, pictures, beside_others=True).ids


@dataclass
class _Learned:
    """What renderers learn of one template with one tool list: every session of a model
    shares it, so the probe renders run once per model, not once per session."""

    probe: str | None = None
    shapes: dict[str, RoleShape | None] = field(default_factory=dict)


_LEARNED: dict[int, tuple[weakref.ref[Any], dict[tuple[str, str], _Learned]]] = {}
"""id(template owner) -> (a weak reference to it, (template, tools) -> what was learned)."""


def _learned_for(owner: Any, tools: list[dict[str, Any]] | None) -> _Learned:
    key = (str(getattr(owner, "chat_template", "")),
           json.dumps(tools, sort_keys=True, default=str))
    owner_id = id(owner)
    entry = _LEARNED.get(owner_id)
    if entry is None or entry[0]() is not owner:
        try:
            reference = weakref.ref(owner, lambda _: _LEARNED.pop(owner_id, None))
        except TypeError:  # not weakly referable: learn per renderer
            return _Learned()
        entry = _LEARNED[owner_id] = (reference, {})
    return entry[1].setdefault(key, _Learned())


def image_part(data: bytes) -> dict[str, Any]:
    """A content part that shows the model an image (PNG or JPEG bytes)."""
    return {"type": "image", "data": data}


def split_images(messages: Sequence[Message]) -> tuple[list[Message], list[bytes]]:
    """Messages as the template takes them (each image part a bare `{"type": "image"}`) and
    the images, in order. Text-only messages pass through as they are."""
    if not any(isinstance(m.get("content"), list) for m in messages):
        return list(messages), []
    pictures: list[bytes] = []
    template: list[Message] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.get("type") == "image":
                    pictures.append(part["data"])
                    parts.append({"type": "image"})
                else:
                    parts.append(part)
            message = {**message, "content": parts}
        template.append(message)
    return template, pictures


def _ids_only(rendered: Rendered) -> list[int]:
    if rendered.images:
        raise TemplateError("these messages hold images: render them with render_start or "
                            "render_extend, which place them")
    return rendered.ids


def _plain(message: Message) -> bool:
    """A message of only a role and a text content (what a RoleShape can write)."""
    return message.keys() == {"role", "content"} and isinstance(message["content"], str)
