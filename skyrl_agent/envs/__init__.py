"""Environments: a task + a sandbox + its verifier."""

from skyrl_agent.envs.env import Env
from skyrl_agent.envs.verifier import verify

__all__ = ["Env", "verify"]
