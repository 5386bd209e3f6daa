"""The progress bars of the batch commands, made in one place.

:func:`progress_bar` is a :func:`tqdm.auto.tqdm` bar on stderr, drawn when it is wanted (``progress``: not
``--quiet`` / ``--no-progress``). On a terminal it refreshes as tqdm does; written to a log file, a pipe or a CI job
(stderr not a terminal) it is written at most every :data:`LOG_INTERVAL_S` seconds, so a long job's log shows its
progress without filling with carriage-return updates.
"""

from __future__ import annotations

import sys
from typing import Any, Final

from tqdm.auto import tqdm

__all__ = ["LOG_INTERVAL_S", "progress_bar"]

#: Seconds between two updates of a bar written to something that is not a terminal.
LOG_INTERVAL_S: Final[float] = 30.0


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def progress_bar(iterable: Any = None, *, progress: bool = True, **kwargs: Any) -> Any:
    """A tqdm bar over ``iterable`` (or one updated by hand, with ``total=``); ``kwargs`` go to tqdm. Not drawn when
    ``progress`` is false; updated at most every :data:`LOG_INTERVAL_S` seconds (unless ``mininterval`` is given)
    when its stream (tqdm's ``file``, default stderr) is not a terminal; iterating over it and its methods work
    either way."""
    if not progress:
        return tqdm(iterable, disable=True, **kwargs)
    if not _is_terminal(kwargs.get("file") or sys.stderr):
        kwargs.setdefault("mininterval", LOG_INTERVAL_S)
    return tqdm(iterable, **kwargs)
