"""Errors that reach the user as one clear line (exit code 2), never as a traceback."""


class UserError(Exception):
    """Bad input from the user: a config, a task, a name. The CLI prints it and exits 2."""


class ConfigError(UserError):
    """A configuration file or override that does not validate."""


class TaskError(UserError):
    """A task directory or task set that cannot be loaded."""


class PluginNotFound(UserError):
    """An unknown agent, sandbox or task-source name."""
