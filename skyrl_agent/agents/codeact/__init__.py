"""CodeAct (OpenHands' tool set): bash, a file editor, think and finish, as function calls."""

from skyrl_agent.agents.codeact.agent import CodeActAgent

__all__ = ["CodeActAgent"]
