"""Agents: built-ins and plug-ins, all found through the `skyrl_agent.agents` entry points."""

from skyrl_agent.agents.base import Agent, agent_class

__all__ = ["Agent", "agent_class"]
