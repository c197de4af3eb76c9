"""The one error a run stops with: its message says why, and the command prints it without a traceback."""


class RunError(Exception):
    """The run cannot start or continue; the message says why."""
