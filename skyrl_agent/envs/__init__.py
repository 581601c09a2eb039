"""Environments: a task + a sandbox, and the episode lifecycle that verifies what it left."""

from skyrl_agent.envs.env import Env

__all__ = ["Env"]
