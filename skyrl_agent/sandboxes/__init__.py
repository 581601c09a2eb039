"""Sandboxes: isolated places to run agent commands and task tests (local bubblewrap, docker)."""

from skyrl_agent.sandboxes.base import (
                                        ExecResult,
                                        Sandbox,
                                        SandboxError,
                                        SandboxSpec,
                                        UnsupportedEnvironment,
                                        create_sandbox,
                                        sandbox_backend,
)

__all__ = ["ExecResult", "Sandbox", "SandboxError", "SandboxSpec", "UnsupportedEnvironment",
           "create_sandbox", "sandbox_backend"]
