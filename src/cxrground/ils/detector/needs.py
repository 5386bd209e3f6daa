"""What the YOLO detector needs installed, checked before any work starts (``detector train`` and ``evaluate``)."""

from __future__ import annotations

import importlib.util

from cxrground.errors import ConfigError

__all__ = ["NEEDS_ULTRALYTICS", "check_ultralytics"]

#: Why the YOLO detector cannot run without ultralytics (training and evaluation say the same).
NEEDS_ULTRALYTICS = ("the YOLO detector needs the 'ultralytics' package: pip install ultralytics (or "
                     "'cxrground[yolo]'; it needs torchvision; in an environment of its own: see "
                     "docs/guides/detector.md)")


def check_ultralytics() -> None:
    """A :class:`~cxrground.errors.ConfigError` when ultralytics or torchvision is not installed (checked before
    any data is prepared)."""
    missing = [name for name in ("ultralytics", "torchvision") if not _installed(name)]
    if missing:
        raise ConfigError(f"{NEEDS_ULTRALYTICS}; missing here: {', '.join(missing)}")


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a module blocked in sys.modules (None) has no spec
        return False
