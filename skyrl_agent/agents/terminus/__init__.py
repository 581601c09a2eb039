"""Terminus: an agent that types keystrokes into a tmux terminal and reads the screen."""

from skyrl_agent.agents.terminus.agent import TerminusAgent

__all__ = ["TerminusAgent"]
