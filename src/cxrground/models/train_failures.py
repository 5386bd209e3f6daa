"""The images an ``ils train`` run cannot read, the same for every backend (baseline, LISA).

An image :func:`~cxrground.io.image.read_image` refuses (missing, empty, truncated or not an image) is a
:class:`~cxrground.errors.Failure` of stage ``train-images``; its pairs are left out and the rest train. A run records:

- ``CKPT/failures.jsonl`` (:func:`write_failures`): one line per unreadable image (``path``, ``stage``, ``reason``,
  ``error``, ``split``), rewritten by every run (empty when every image was read);
- ``data`` in ``checkpoint.json`` (:func:`usable_pairs`): per split the pairs looked at (``pairs``), those used
  (``used``: their image could be read), the sha256 of the used pair ids (``sha256``) and the unreadable images
  (``failed_images``), and over the splits the unreadable images (``failures``) and the pairs they leave out
  (``pairs_left_out``).

A resume whose ``data`` differs from the checkpoint's (an image that became readable or unreadable since) is refused
(:func:`check_same_pairs`), and a split none of whose images can be read is an error naming the first failure
(:func:`no_usable_pairs`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError, Failure, InputError
from cxrground.io.files import atomic_write_text, sha256_json
from cxrground.io.image import read_image

__all__ = ["FAILURES_FILE", "STAGE", "SplitImages", "check_same_pairs", "failure_summary", "image_failure",
           "no_usable_pairs", "usable_pairs", "write_failures"]

#: The unreadable images of a run, beside ``checkpoint.json``.
FAILURES_FILE: Final[str] = "failures.jsonl"
#: The ``stage`` of their :class:`~cxrground.errors.Failure` records.
STAGE: Final[str] = "train-images"


@dataclass(frozen=True)
class SplitImages:
    """What a run could use of one split: the ``pairs`` it looked at, the ids of those it ``used`` (their image
    could be read) and the unreadable images (``failures``)."""

    name: str
    pairs: int
    used: Sequence[str]
    failures: Sequence[Failure]


def _distinct(splits: Iterable[SplitImages]) -> list[SplitImages]:
    """Each split once (the first record of a name: a validation split that is the training split adds nothing)."""
    seen: dict[str, SplitImages] = {}
    for s in splits:
        seen.setdefault(s.name, s)
    return list(seen.values())


def image_failure(path: Path) -> Failure | None:
    """``None`` when the image at ``path`` can be read, else the :class:`~cxrground.errors.Failure` saying why."""
    try:
        read_image(path)
    except InputError as exc:
        return Failure.from_exception(Path(path).absolute(), STAGE, exc)
    return None


def usable_pairs(splits: Iterable[SplitImages]) -> dict[str, Any]:
    """The ``data`` record of ``checkpoint.json`` (see the module docstring)."""
    record: dict[str, Any] = {}
    for s in _distinct(splits):
        record[s.name] = {"pairs": s.pairs, "used": len(s.used), "sha256": sha256_json(list(s.used)),
                          "failed_images": len(s.failures)}
    counts = list(record.values())
    record["failures"] = sum(v["failed_images"] for v in counts)
    record["pairs_left_out"] = sum(v["pairs"] - v["used"] for v in counts)
    return record


def write_failures(out: Path, splits: Iterable[SplitImages]) -> int:
    """Write ``out/failures.jsonl`` (atomically; one line per unreadable image, with its split); returns the count."""
    lines = [json.dumps({**f.to_dict(), "split": s.name}, sort_keys=True) + "\n" for s in _distinct(splits)
             for f in s.failures]
    atomic_write_text(Path(out) / FAILURES_FILE, "".join(lines))
    return len(lines)


def failure_summary(record: dict[str, Any], out: Path) -> str | None:
    """The one line a run prints about its unreadable images (``None`` when there are none)."""
    if not record.get("failures"):
        return None
    return (f"{record['failures']} unreadable images: {record['pairs_left_out']} pairs left out; see "
            f"{Path(out) / FAILURES_FILE}")


def check_same_pairs(recorded: dict[str, Any] | None, now: dict[str, Any], path: Path) -> None:
    """Refuse to resume when the pairs whose image can be read are not those the checkpoint ``path`` was trained on
    (an image that became readable or unreadable since); a checkpoint without the record is resumed as it is."""
    if recorded is None or recorded == now:
        return
    changed = [f"{name}: {now[name]['used']} of {now[name]['pairs']} pairs usable now, "
               f"{old.get('used')} of {old.get('pairs')} then" for name, old in recorded.items()
               if isinstance(old, dict) and now.get(name) != old and isinstance(now.get(name), dict)]
    raise ConfigError(f"cannot resume {path}: the usable pairs differ from the checkpoint's ("
                      f"{'; '.join(changed) or 'other splits'}; unreadable images are in {path / FAILURES_FILE}); "
                      "use another --out or --no-resume")


def no_usable_pairs(split: SplitImages, dataset: Path, out: Path) -> InputError:
    """The error of a split none of whose pairs can be used, naming the dataset file and the first failure."""
    if not split.failures:
        return InputError(f"split {split.name!r} has no pair to train on", dataset)
    first = split.failures[0]
    return InputError(f"no pair of split {split.name!r} has a readable image ({len(split.failures)} unreadable, the "
                      f"first {first.path}: {first.reason}; all in {Path(out) / FAILURES_FILE})", dataset)
