"""Whether an output folder may take a film-folder command's run: the same run resumes, another run's or another
command's results are refused (``--overwrite`` deletes the command's own kind of results first).

A run is described by a JSON run record (the films, the settings, the weights) the command keeps in the folder; the
same record means the same run. :func:`check_run_folder` is shared by ``anatomy zones``, ``anatomy pose`` and
``segment lungs --images``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cxrground.errors import ConfigError


def read_run_record(path: Path) -> Any:
    """The JSON value of the run record at ``path``; None when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def record_changes(old: Any, record: Mapping[str, Any]) -> str:
    """What differs between an earlier run record ``old`` and ``record``: ``changed: k1, k2`` (the keys of ``record``
    whose values differ, sorted), or ``an unreadable run record`` when ``old`` is no record."""
    changed = sorted(k for k in record if not isinstance(old, dict) or old.get(k) != record[k])
    return "changed: " + ", ".join(changed) if changed else "an unreadable run record"


def check_run_folder(out: Path, record: Mapping[str, Any], *, command: str, run_file: str, results: Iterable[str],
                     foreign: Iterable[str], out_option: str, overwrite: bool, clear: Callable[[], None],
                     older: Callable[[Mapping[str, Any]], str | None] | None = None) -> None:
    """Refuse the output folder ``out`` of ``command`` when it holds another command's results (any of the names
    ``foreign``: their ``failures.jsonl`` is not ours to replace), or, unless ``overwrite``, another run of this
    command: a run record ``run_file`` other than ``record`` (the message names the keys that differ; ``older``
    may give a message of its own for a record an older version wrote), or results (``results``) without a run
    record. With ``overwrite``, ``clear`` deletes this command's results first. The same run record resumes."""
    found = [name for name in foreign if (out / name).exists()]
    if found:
        raise ConfigError(f"output folder {out} holds another command's results ({', '.join(found)}); use another "
                          f"{out_option}")
    if overwrite:
        clear()
        return
    path = out / run_file
    if path.is_file():
        old = read_run_record(path)
        if old == record:
            return
        if older is not None and isinstance(old, dict) and (why := older(old)):
            raise ConfigError(why)
        raise ConfigError(f"output folder {out} holds another {command} run ({record_changes(old, record)}); use "
                          f"another {out_option} or --overwrite")
    if any((out / name).exists() for name in results):
        raise ConfigError(f"output folder {out} holds the results of another run (no run record {run_file}); use "
                          f"another {out_option} or --overwrite")
