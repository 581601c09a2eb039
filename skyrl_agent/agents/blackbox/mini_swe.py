"""mini-swe-agent (its DefaultAgent and litellm model class, `mini.yaml` settings) against the
capture proxy, its bash commands run in the episode's sandbox."""

from __future__ import annotations

import asyncio
import os
import platform
from typing import Any

from skyrl_agent.agents.blackbox.base import MODEL_NAME, BlackBoxAgent, SandboxBridge, require
from skyrl_agent.capture import CaptureHandle
from skyrl_agent.envs.env import Env
from skyrl_agent.types import FinishReason

require("minisweagent", "mini-swe-agent")

_EXIT = {"Submitted": FinishReason.STOP, "LimitsExceeded": FinishReason.MAX_TURNS,
         "TimeExceeded": FinishReason.AGENT_TIMEOUT}


class MiniSweAgent(BlackBoxAgent):
    """mini-swe-agent (package mini-swe-agent) through the capture proxy."""

    name = "mini-swe-agent"

    def __init__(self, max_turns: int = 50, command_timeout_s: float = 60.0,
                 config_name: str = "mini") -> None:
        super().__init__(max_turns)
        self.command_timeout_s = command_timeout_s
        self.config_name = config_name

    async def drive(self, env: Env, handle: CaptureHandle) -> FinishReason:
        os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")  # its import prints a banner
        import yaml
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.config import get_config_path

        config = yaml.safe_load(get_config_path(self.config_name).read_text())
        bridge = SandboxBridge(env, asyncio.get_running_loop())
        model = _model_class()(
            model_name=f"openai/{MODEL_NAME}", cost_tracking="ignore_errors",
            model_kwargs={"api_base": handle.base_url, "api_key": handle.key,
                          "drop_params": True},
            **{k: v for k, v in config.get("model", {}).items()
               if k not in ("model_name", "model_kwargs", "cost_tracking")})
        environment = _environment_class()(
            bridge=bridge, cwd=env.workdir, timeout=int(self.command_timeout_s),
            env=config.get("environment", {}).get("env", {}))
        agent = DefaultAgent(model, environment, **{
            **config.get("agent", {}), "step_limit": self.max_turns, "cost_limit": 0})
        result = await bridge.run(lambda: agent.run(env.instruction.strip()))
        status = str(result.get("exit_status", ""))
        self.count("format_errors", sum(
            1 for m in agent.messages if m.get("extra", {}).get("interrupt_type") == "FormatError"))
        self.count("commands", environment.commands)
        return _EXIT.get(status, FinishReason.STOP)


def _model_class() -> type:
    import litellm
    import openai
    from minisweagent.models.litellm_model import LitellmModel

    class CapturedLitellmModel(LitellmModel):
        # The proxy is local and answers at once: an error will not go away by waiting (its
        # default retries back off for minutes).
        abort_exceptions = [  # noqa: RUF012 - the base class's own attribute, extended
            *LitellmModel.abort_exceptions, openai.APIError, litellm.exceptions.APIError]

    return CapturedLitellmModel


def _environment_class() -> type:
    from minisweagent.environments.local import LocalEnvironment

    class SandboxEnvironment(LocalEnvironment):
        """mini-swe-agent's environment protocol over the episode's sandbox: each command in a
        fresh shell in the working directory, stdout and stderr together, as its local one."""

        def __init__(self, *, bridge: SandboxBridge, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.bridge = bridge
            self.commands = 0

        def execute(self, action: dict, cwd: str = "", *,
                    timeout: int | None = None) -> dict[str, Any]:
            self.commands += 1
            limit = timeout or self.config.timeout
            result = self.bridge.exec(str(action.get("command", "")), timeout=limit,
                                      cwd=cwd or self.config.cwd,
                                      variables=self.config.env)
            output: dict[str, Any] = {"output": result.stdout + result.stderr,
                                      "returncode": result.exit_code, "exception_info": ""}
            if result.timed_out:
                output |= {"returncode": -1,
                           "exception_info": f"the command timed out after {limit} s"}
            self._check_finished(output)  # its own completion rule (raises Submitted)
            return output

        def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
            # Not the host's environment variables (the local environment's default).
            return {**self.config.model_dump(), **platform.uname()._asdict(), **kwargs}

    return SandboxEnvironment
