"""The OpenHands SDK agent (packages openhands-sdk and openhands-tools) against the capture
proxy, its terminal tool executing in the episode's sandbox.

The SDK's `Agent` and `Conversation` run unchanged (in a worker thread: `Conversation.run` is
synchronous) with an LLM whose base URL is the proxy. Its `terminal` tool keeps its schema and
observation type, but the executor is ours: each command runs in the sandbox through `env`, in
the working directory the previous command left (as a persistent shell would). The SDK's own
workspace is a scratch folder on the host that the agent never writes to.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import tempfile
import uuid
from pathlib import Path
from typing import Any

from skyrl_agent.agents.blackbox.base import MODEL_NAME, BlackBoxAgent, SandboxBridge, require
from skyrl_agent.capture import CaptureHandle
from skyrl_agent.envs.env import Env
from skyrl_agent.types import FinishReason

require("openhands.sdk", "openhands-sdk",
        "install the `agents` extra of skyrl-agent, then pip install --no-deps "
        "openhands-sdk==1.58.2 openhands-tools==1.58.2 (scripts/setup.sh --dev does both)")

_CWD_MARK = "__SKYRL_CWD__"
_EXECUTORS: dict[str, Any] = {}
"""Executor per running conversation, found by the id in the tool's params."""


class OpenHandsSdkAgent(BlackBoxAgent):
    """The OpenHands SDK agent (package openhands-sdk) through the capture proxy."""

    name = "openhands-sdk"

    def __init__(self, max_turns: int = 50, command_timeout_s: float = 60.0) -> None:
        super().__init__(max_turns)
        self.command_timeout_s = command_timeout_s

    async def drive(self, env: Env, handle: CaptureHandle) -> FinishReason:
        from openhands.sdk import LLM, Agent, Conversation, Tool
        from pydantic import SecretStr

        bridge = SandboxBridge(env, asyncio.get_running_loop())
        executor = _executor(bridge, env.workdir, self.command_timeout_s)
        key = uuid.uuid4().hex
        _EXECUTORS[key] = executor
        # The session's own budgets: the proxy enforces them. The SDK refuses contexts under
        # 16k tokens unless told otherwise (advice for interactive use; our small models and
        # CPU budgets run with less).
        os.environ.setdefault("ALLOW_SHORT_CONTEXT_WINDOWS", "true")
        config = handle.session.llm.config
        llm = LLM(model=f"openai/{MODEL_NAME}", base_url=handle.base_url,
                  api_key=SecretStr(handle.key), num_retries=0, usage_id="skyrl-agent",
                  max_input_tokens=config.max_context_tokens,
                  max_output_tokens=config.max_tokens)
        agent = Agent(llm=llm, tools=[Tool(name=_tool_name(), params={"executor": key})])
        try:
            with tempfile.TemporaryDirectory(prefix="skyrl-openhands-") as scratch:
                conversation: Any = Conversation(  # its decorators confuse mypy
                    agent=agent, workspace=str(Path(scratch)), visualizer=None,
                    max_iteration_per_run=self.max_turns, stuck_detection=False)

                def work() -> str:
                    conversation.send_message(env.instruction.strip())
                    conversation.run()
                    return str(conversation.state.execution_status.value)

                status = await bridge.run(work)
        finally:
            _EXECUTORS.pop(key, None)
        self.count("commands", executor.commands)
        return FinishReason.STOP if status == "finished" else FinishReason.MAX_TURNS


def _tool_name() -> str:
    """The name our terminal tool is registered under (once per process)."""
    from openhands.sdk.tool import register_tool
    from openhands.tools.terminal import TerminalTool

    name = "skyrl_sandbox_terminal"

    class SandboxTerminalTool(TerminalTool):
        """The SDK's terminal tool with the episode's sandbox as its executor."""

        @classmethod
        def create(cls, conv_state: Any, **params: Any) -> Any:  # type: ignore[override]
            return super().create(conv_state, executor=_EXECUTORS[params["executor"]])

    if not getattr(_tool_name, "registered", False):
        register_tool(name, SandboxTerminalTool)
        _tool_name.registered = True  # type: ignore[attr-defined]
    return name


def _executor(bridge: SandboxBridge, workdir: str, timeout_s: float) -> Any:
    from openhands.sdk.tool import ToolExecutor
    from openhands.tools.terminal.definition import TerminalAction, TerminalObservation
    from openhands.tools.terminal.metadata import CmdOutputMetadata

    class SandboxExecutor(ToolExecutor[TerminalAction, TerminalObservation]):
        """Runs the terminal tool's commands in the sandbox; keeps the working directory."""

        def __init__(self) -> None:
            self.cwd = workdir
            self.commands = 0

        def __call__(self, action: TerminalAction,
                     conversation: Any = None) -> TerminalObservation:
            if action.is_input or action.reset:
                return TerminalObservation.from_text(
                    "This terminal runs one command at a time to completion; there is no "
                    "running process to send input to.", is_error=True, command=action.command)
            self.commands += 1
            limit = min(action.timeout or timeout_s, timeout_s)
            script = (f"cd {shlex.quote(self.cwd)} 2>/dev/null\n{action.command}\n__rc=$?\n"
                      f"printf '\\n{_CWD_MARK}%s\\n' \"$(pwd)\"\nexit $__rc")
            result = bridge.exec(script, timeout=max(limit, 1.0))
            stdout, mark, cwd = result.stdout.rpartition(_CWD_MARK)
            if mark and cwd.strip():
                self.cwd = cwd.strip()
            else:  # the command left the shell early: the old directory stays
                stdout = result.stdout
            output = (stdout.rstrip("\n") + "\n" + result.stderr).strip("\n")
            if result.timed_out:
                output += f"\n[The command was stopped after {limit:g} s.]"
            metadata = CmdOutputMetadata(exit_code=result.exit_code, working_dir=self.cwd)
            return TerminalObservation.from_text(
                output, command=action.command, exit_code=result.exit_code,
                timeout=result.timed_out, metadata=metadata)

    return SandboxExecutor()
