"""The progress bars of the batch commands, made in one place.

:func:`progress_bar` is a :func:`tqdm.auto.tqdm` bar on stderr that is drawn only when it is wanted (``progress``:
not ``--quiet`` / ``--no-progress``) and stderr is a terminal: a log file, a pipe or a CI job gets no
carriage-return bars.
"""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm

__all__ = ["progress_bar"]


def progress_bar(iterable: Any = None, *, progress: bool = True, **kwargs: Any) -> Any:
    """A tqdm bar over ``iterable`` (or one updated by hand, with ``total=``); ``kwargs`` go to tqdm. Not drawn
    when ``progress`` is false or stderr (tqdm's ``file``) is not a terminal (tqdm's ``disable=None``); iterating
    over it and its methods work either way."""
    return tqdm(iterable, disable=None if progress else True, **kwargs)
