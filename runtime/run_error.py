"""The one error a run stops with: its message says why, and the command prints it without a traceback."""

from __future__ import annotations


class RunError(Exception):
    """The run cannot start or continue; the message says why."""


def os_cause(exc: BaseException) -> OSError | None:
    """The OS error (with an errno) a failure comes down to, however it is wrapped: a Ray task's error around a
    worker's, torch.distributed.checkpoint's CheckpointException around each rank's, an exception's cause."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        item = todo.pop(0)
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, (tuple, list)):
            todo.extend(item)
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, BaseException):
            if isinstance(item, OSError) and item.errno:
                return item
            failures = getattr(item, "failures", None)  # CheckpointException: {rank: (exception, traceback)}
            todo.extend(x for x in (getattr(item, "cause", None), item.__cause__, item.__context__, failures) if x)
            todo.extend(a for a in item.args if isinstance(a, (BaseException, tuple, list, dict)))
    return None
