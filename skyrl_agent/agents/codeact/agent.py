"""CodeAct behaviour with OpenHands' tool set: one tool call per reply, its result comes back."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skyrl_agent.agents.base import ModelAgent, clip, task_content
from skyrl_agent.agents.codeact import prompts
from skyrl_agent.agents.codeact.editor import FileEditor
from skyrl_agent.agents.codeact.tools import TOOLS, VISION_TOOLS
from skyrl_agent.envs.env import Env
from skyrl_agent.llm.rendering import Message, image_part
from skyrl_agent.llm.session import LLMSession
from skyrl_agent.llm.tool_calls import NoToolCall, ToolCall, parse_tool_calls
from skyrl_agent.model.vision import ImageError
from skyrl_agent.sandboxes.artifacts import ArtifactLimitExceeded
from skyrl_agent.types import FinishReason

if TYPE_CHECKING:
    from skyrl_agent.tasks.families.base import Step

_CWD_MARK = "__SKYRL_CWD__"


class CodeActAgent(ModelAgent):
    """Calls execute_bash / str_replace_editor / think until it calls finish."""

    name = "openhands"
    tools = TOOLS
    vision_tools = VISION_TOOLS

    def __init__(self, max_turns: int = 50, command_timeout_s: float = 120.0,
                 max_output_chars: int = 10000) -> None:
        super().__init__(max_turns)
        self.command_timeout_s = command_timeout_s
        self.max_output_chars = max_output_chars

    @classmethod
    def demonstration(cls, commands: Sequence[str], plan: str) -> list[str]:
        """One execute_bash call running every command, then finish."""
        script = "\n".join(commands)
        return [f"{plan}\n\n<function=execute_bash>\n<parameter=command>\n{script}\n"
                "</parameter>\n</function>",
                "The commands ran.\n\n<function=finish>\n<parameter=message>\nThe task is "
                "done.\n</parameter>\n</function>"]

    @classmethod
    def walkthrough(cls, steps: Sequence[Step], plan: str) -> list[str]:
        """One execute_bash call per step, its text the finding of the step before, then
        finish."""
        replies = []
        for number, step in enumerate(steps):
            said = f"Found {steps[number - 1].finding}." if number else plan
            script = "\n".join(step.commands)
            replies.append(f"{said}\n\n<function=execute_bash>\n<parameter=command>\n{script}\n"
                           "</parameter>\n</function>")
        return [*replies, f"Done: {steps[-1].finding}.\n\n<function=finish>\n"
                          "<parameter=message>\nThe task is done.\n</parameter>\n</function>"]

    async def act(self, env: Env, llm: LLMSession) -> FinishReason:
        self.cwd = env.workdir
        editor = FileEditor(env)
        messages: list[Message] = [
            {"role": "system", "content": prompts.system(llm.sees_images)},
            {"role": "user", "content": task_content(env, llm, prompts.TASK,
                                                     workdir=env.workdir)}]
        for _ in range(self.max_turns):
            reply = await llm.chat(messages)
            try:
                calls = parse_tool_calls(reply.text)
            except NoToolCall as exc:
                self.count("parse_errors")
                messages = [{"role": "user", "content": prompts.NO_TOOL.format(error=exc)}]
                continue
            call = calls[0]
            if call.name == "finish":
                return FinishReason.STOP
            image: bytes | None = None
            if call.name == "view_image" and llm.sees_images:
                output, image = await self._view_image(env, call.arguments)
            else:
                output = await self._execute(env, editor, call)
            if len(calls) > 1:
                output += "\n" + prompts.EXTRA_CALLS.format(count=len(calls) - 1)
            result = prompts.RESULT.format(tool=call.name,
                                           output=clip(output, self.max_output_chars))
            messages = [{"role": "user", "content": result if image is None else [
                {"type": "text", "text": result + "\n"}, image_part(image)]}]
        return FinishReason.MAX_TURNS

    async def _execute(self, env: Env, editor: FileEditor, call: ToolCall) -> str:
        self.count(f"calls_{call.name}")
        if call.name == "execute_bash":
            return await self._bash(env, call.arguments)
        if call.name == "str_replace_editor":
            return await editor(call.arguments)
        if call.name == "think":
            return "Your thought has been noted."
        self.count("unknown_tools")
        return (f"ERROR: there is no tool named {call.name!r}; use execute_bash, "
                "str_replace_editor, think or finish.")

    async def _view_image(self, env: Env, arguments: dict) -> tuple[str, bytes | None]:
        """The image file at `path`, shown with the result; a clear error for anything that
        is not a readable PNG or JPEG (the agent may point it at anything)."""
        self.count("calls_view_image")
        path = arguments.get("path")
        if not isinstance(path, str) or not path.strip():
            return "ERROR: view_image needs a `path`.", None
        try:
            return f"The image {path}:", await env.read_image(path.strip())
        except FileNotFoundError:
            return f"ERROR: {path} is not a file.", None
        except (ImageError, ArtifactLimitExceeded) as exc:
            return f"ERROR: {path} cannot be shown: {exc}", None

    async def _bash(self, env: Env, arguments: dict) -> str:
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            return "ERROR: execute_bash needs a non-empty `command`."
        timeout = self.command_timeout_s
        with contextlib.suppress(TypeError, ValueError):  # a malformed timeout: the default
            timeout = min(float(arguments.get("timeout", timeout)), self.command_timeout_s)
        # The working directory persists between calls: report it after the command.
        script = (f"cd {shlex.quote(self.cwd)} 2>/dev/null\n{command}\n__rc=$?\n"
                  f"printf '\\n{_CWD_MARK}%s\\n' \"$(pwd)\"\nexit $__rc")
        result = await env.exec(script, timeout=max(timeout, 1.0))
        stdout, mark, cwd = result.stdout.rpartition(_CWD_MARK)
        if mark and cwd.strip():
            self.cwd = cwd.strip()
        else:  # the command exited the shell early: keep the old working directory
            stdout = result.stdout
        output = stdout.rstrip("\n")
        if result.stderr.strip():
            output += ("\n" if output else "") + result.stderr.rstrip("\n")
        if result.timed_out:
            self.count("command_timeouts")
            return f"{output}\n[The command was stopped after {timeout:g} s (timeout).]"
        return f"{output}\n[exit code {result.exit_code}]"
