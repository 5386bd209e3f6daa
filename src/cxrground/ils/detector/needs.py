"""What the YOLO detector needs installed, checked before any work starts (``detector train`` and ``evaluate``),
and how ultralytics is run offline (every path that imports it: training, evaluation, ``ils build``)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from cxrground.errors import ConfigError

__all__ = ["NEEDS_ULTRALYTICS", "check_ultralytics", "ultralytics_offline"]

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


def ultralytics_offline(config_dir: Path | None = None) -> None:
    """Run ultralytics without a network; call before importing it (an import looks the network up once).

    ``YOLO_OFFLINE=1`` (no online check, update, telemetry or hub calls) and its ``sync`` setting off for this
    process (the settings file is left as it is). With ``config_dir`` (``detector train``: ``OUT/.ultralytics``,
    unless ``YOLO_CONFIG_DIR`` is set) its settings live there, with matplotlib's DejaVu Sans as the font it would
    otherwise download for plots (``Arial.ttf``). ultralytics reads the folder once, when first imported: later calls
    in the same process keep the first call's folder (``YOLO_CONFIG_DIR`` gives several runs of one process one folder).
    """
    os.environ["YOLO_OFFLINE"] = "1"
    if config_dir is not None and "YOLO_CONFIG_DIR" not in os.environ:
        os.environ["YOLO_CONFIG_DIR"] = str(config_dir)
    from ultralytics.utils import SETTINGS, USER_CONFIG_DIR

    dict.__setitem__(SETTINGS, "sync", False)  # in memory only: its own __setitem__ writes the user's file
    if config_dir is None:
        return
    font = Path(USER_CONFIG_DIR) / "Arial.ttf"
    if not font.is_file():
        import matplotlib

        font.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf", font)
