"""Terminus behaviour: JSON replies with keystrokes for a tmux pane; the pane is the observation."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skyrl_agent.agents.base import ModelAgent, clip, task_content
from skyrl_agent.agents.terminus import prompts
from skyrl_agent.agents.terminus.parsing import MalformedReply, TerminusReply, parse_reply
from skyrl_agent.envs.env import Env
from skyrl_agent.llm.rendering import Message
from skyrl_agent.llm.session import LLMSession
from skyrl_agent.types import FinishReason

if TYPE_CHECKING:
    from skyrl_agent.tasks.families.base import Step

DEMO_WAIT_S = 1.0
"""A demonstration's wait after typing its commands (the generated tasks' are instant)."""


class TerminusAgent(ModelAgent):
    """Types into a terminal until it declares the task complete twice in a row."""

    name = "terminus"

    def __init__(self, max_turns: int = 50, max_wait_s: float = 30.0,
                 max_screen_chars: int = 8000) -> None:
        super().__init__(max_turns)
        self.max_wait_s = max_wait_s
        self.max_screen_chars = max_screen_chars

    @classmethod
    def demonstration(cls, commands: Sequence[str], plan: str) -> list[str]:
        """Type the commands (one keystroke string: fewer tokens than one entry each) and
        declare the task complete, then confirm."""
        keys = "".join(f"{c}\n" for c in commands)
        act = {"analysis": "Nothing has been done yet.", "plan": plan,
               "commands": [{"keystrokes": keys, "duration": DEMO_WAIT_S}], "task_complete": True}
        confirm = {"analysis": "The commands have run.", "plan": "The task is complete.",
                   "commands": [], "task_complete": True}
        return [json.dumps(act), json.dumps(confirm)]

    @classmethod
    def walkthrough(cls, steps: Sequence[Step], plan: str) -> list[str]:
        """One reply per step, its analysis the finding of the step before (so what was found
        stays in the replies until a summary carries it), then the confirmation."""
        replies = []
        for number, step in enumerate(steps):
            last = number == len(steps) - 1
            analysis = (f"Found {steps[number - 1].finding}." if number
                        else "Nothing has been done yet.")
            keys = "".join(f"{c}\n" for c in step.commands)
            replies.append(json.dumps({
                "analysis": analysis, "plan": plan if number == 0 else "Next step.",
                "commands": [{"keystrokes": keys, "duration": DEMO_WAIT_S}],
                "task_complete": last}))
        return [*replies, json.dumps({"analysis": f"Done: {steps[-1].finding}.",
                                      "plan": "The task is complete.", "commands": [],
                                      "task_complete": True})]

    async def act(self, env: Env, llm: LLMSession) -> FinishReason:
        screen = await self._screen(env)
        messages: list[Message] = [
            {"role": "system", "content": prompts.SYSTEM},
            {"role": "user", "content": task_content(env, llm, prompts.TASK,
                                                     screen=screen)}]
        asked_to_confirm = False
        for _ in range(self.max_turns):
            reply = await llm.chat(messages)
            try:
                parsed = parse_reply(reply.text)
            except MalformedReply as exc:
                self.count("parse_errors")
                messages = [{"role": "user", "content": prompts.MALFORMED.format(error=exc)}]
                continue
            notes = await self._run_commands(env, parsed)
            screen = await self._screen(env)
            if parsed.task_complete:
                if asked_to_confirm:
                    return FinishReason.STOP
                asked_to_confirm = True
                messages = [{"role": "user", "content": prompts.CONFIRM.format(screen=screen)}]
                continue
            asked_to_confirm = False
            text = prompts.SCREEN.format(screen=screen)
            messages = [{"role": "user", "content": "\n".join([*notes, text])}]
        return FinishReason.MAX_TURNS

    async def _run_commands(self, env: Env, reply: TerminusReply) -> list[str]:
        notes = []
        for command in reply.commands:
            wait = min(command.duration_s, self.max_wait_s)
            if command.duration_s > self.max_wait_s:
                self.count("capped_waits")
                notes.append(prompts.CAPPED.format(wanted=command.duration_s, cap=self.max_wait_s))
            await env.terminal.send_keys(command.keystrokes, wait)
            self.count("commands")
        return notes

    async def _screen(self, env: Env) -> str:
        return clip(await env.terminal.capture(), self.max_screen_chars)
