"""skyrl-agent: an RL gym for LLM agents in sandboxes."""

__version__ = "0.1.0"
