"""The package's exception types and the failure record used by batch readers.

Every problem with user input (an image, a mask, a report, a DICOM) raises an
:class:`InputError` subclass whose message names the file and the reason.
Batch readers catch these, keep a :class:`Failure` per bad input and go on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


class CXRGroundError(Exception):
    """Base class of every error raised on purpose by cxrground."""


class InputError(CXRGroundError):
    """A user-supplied input cannot be used; ``path`` names it (or is None for in-memory data)."""

    def __init__(self, reason: str, path: str | Path | None = None) -> None:
        self.reason = reason
        self.path = str(path) if path is not None else None
        super().__init__(f"{self.path}: {reason}" if self.path else reason)

    def with_reason(self, reason: str) -> InputError:
        """This error (its type, path and other fields) saying ``reason`` instead, e.g. with its likely cause added."""
        other = type(self).__new__(type(self))
        other.__dict__.update(self.__dict__)
        InputError.__init__(other, reason, self.path)
        return other


class ImageReadError(InputError):
    """An image or DICOM file could not be read or converted."""


class MaskError(InputError):
    """A mask is malformed: wrong shape, wrong dtype or values, corrupt encoding."""


class MaskShapeError(MaskError):
    """A mask's shape differs from the shape it must have; the message names both."""

    def __init__(
        self,
        expected: tuple[int, ...],
        got: tuple[int, ...],
        what: str = "mask",
        path: str | Path | None = None,
    ) -> None:
        self.expected = tuple(int(v) for v in expected)
        self.got = tuple(int(v) for v in got)
        super().__init__(f"{what} has shape {self.got}, expected {self.expected}", path)


class ReportError(InputError):
    """A radiology report is empty, undecodable or unparseable."""


class ConfigError(CXRGroundError):
    """A configuration value or a command-line option is invalid."""


class BatchStopped(ConfigError):
    """A problem every remaining input of a batch shares (an LLM server that cannot be reached, or that refuses every
    request): batch runners stop on it instead of recording one failure per input alike."""


class MissingExtraError(BatchStopped):
    """A library that an optional extra of the package provides is not installed, or does not import: the message
    names the extra and the line that installs it (:mod:`cxrground.extras`). Every input of a batch would fail
    alike, so batch runners stop on it. ``modules``: the libraries; ``extras``: the extras that provide them."""

    def __init__(self, message: str, modules: Sequence[str] = (), extras: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.modules = tuple(modules)
        self.extras = tuple(extras)


class BackendError(CXRGroundError):
    """A backend (a registered segmenter, synthesizer, detector, structurer, deformer, model or client) raised an
    error of its own or returned something the toolkit cannot use; the message names the backend."""


class OptionError(ConfigError):
    """Options that do not go together, or one given without its companion (a usage error on the command line)."""


class OptionValueError(OptionError):
    """One option's value is malformed (an invalid-value usage error on the command line)."""


def failure_path(path: str | Path) -> str:
    """How a failure record names a file: a local path made absolute (``tab.jsonl:3``, a row of a table, too), a URL
    as given."""
    return str(path) if "://" in str(path) else str(Path(path).absolute())


#: The optional fields of a :class:`Failure`, written only when set.
FAILURE_DETAILS: tuple[str, ...] = ("report", "step", "http_status", "attempts")


@dataclass(frozen=True)
class Failure:
    """One input a batch job could not process, with the stage and the reason.

    Report structuring sets the optional details: ``report`` (the report id, e.g. a table row's or an Open-i
    report's), ``step`` (the LLM step that failed: ``structure`` or ``location``), ``http_status`` (the HTTP status of
    an error answer that failed it) and ``attempts`` (the requests sent for the failing step, retries included).
    """

    path: str
    stage: str
    reason: str
    error: str
    report: str | None = None
    step: str | None = None
    http_status: int | None = None
    attempts: int | None = None

    @classmethod
    def from_exception(cls, path: str | Path, stage: str, exc: BaseException, **details: Any) -> Failure:
        """Build a record from an exception raised while processing ``path`` (a local path is made absolute);
        ``details`` are the optional fields."""
        reason = exc.reason if isinstance(exc, InputError) else str(exc) or type(exc).__name__
        return cls(path=failure_path(path), stage=stage, reason=reason, error=type(exc).__name__, **details)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the line format of ``failures.jsonl``): the optional details only when set."""
        return {k: v for k, v in asdict(self).items() if v is not None or k not in FAILURE_DETAILS}


def first_failure(failures: Sequence[Failure]) -> str:
    """``; first: PATH: REASON``: the first of a batch's ``failures``, as its console summary ends ("" when none)."""
    return f"; first: {failures[0].path}: {failures[0].reason}" if failures else ""
