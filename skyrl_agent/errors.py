"""Errors that reach the user as one clear line, never as a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: a config, a task, a name. The CLI prints it and exits 2."""


class ConfigError(UserError):
    """A configuration file or override that does not validate."""


class TaskError(UserError):
    """A task directory or task set that cannot be loaded."""


class PluginNotFound(UserError):
    """An unknown agent, sandbox or task-source name."""


class RunStopped(Exception):
    """A run that had to stop for a reason outside the user's input (its model server died, a
    SIGTERM). Stored work is kept and the same command resumes. The CLI prints one line."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[type[RunStopped], tuple[str, int]]:
        return type(self), (str(self), self.exit_code)  # keeps the exit code across processes
