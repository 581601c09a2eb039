"""Reading Terminus replies: one JSON object with analysis, plan, commands, task_complete."""

from __future__ import annotations

import json
from dataclasses import dataclass


class MalformedReply(ValueError):
    """The reply is not a usable Terminus JSON object; the message says why."""


@dataclass(frozen=True)
class Command:
    keystrokes: str
    duration_s: float


@dataclass(frozen=True)
class TerminusReply:
    analysis: str
    plan: str
    commands: tuple[Command, ...]
    task_complete: bool


def _first_object(text: str) -> dict:
    decoder = json.JSONDecoder()
    position = text.find("{")
    while position != -1:
        try:
            value, _ = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            position = text.find("{", position + 1)
            continue
        if isinstance(value, dict):
            return value
        position = text.find("{", position + 1)
    raise MalformedReply("no JSON object found in the reply")


def _command(index: int, raw: object, default_duration: float) -> Command:
    if not isinstance(raw, dict) or not isinstance(raw.get("keystrokes"), str):
        raise MalformedReply(f"commands[{index}] needs a string \"keystrokes\"")
    duration = raw.get("duration", default_duration)
    if isinstance(duration, bool) or not isinstance(duration, int | float) or duration < 0:
        raise MalformedReply(f"commands[{index}].duration must be a non-negative number")
    return Command(raw["keystrokes"], float(duration))


def parse_reply(text: str, default_duration: float = 1.0) -> TerminusReply:
    """The reply's JSON object, validated; MalformedReply says what is wrong."""
    data = _first_object(text)
    commands = data.get("commands", [])
    if not isinstance(commands, list):
        raise MalformedReply("\"commands\" must be a list")
    complete = data.get("task_complete", False)
    if not isinstance(complete, bool):
        raise MalformedReply("\"task_complete\" must be true or false")
    if not commands and not complete and "commands" not in data:
        raise MalformedReply("the object has neither \"commands\" nor \"task_complete\"")
    return TerminusReply(
        analysis=str(data.get("analysis", "")), plan=str(data.get("plan", "")),
        commands=tuple(_command(i, c, default_duration) for i, c in enumerate(commands)),
        task_complete=complete)
