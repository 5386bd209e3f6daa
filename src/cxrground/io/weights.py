"""Reading weight files: a safetensors file as tensors, with a clear error naming the file when it cannot be read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cxrground.errors import InputError

__all__ = ["load_safetensors"]


def load_safetensors(path: str | Path) -> dict[str, Any]:
    """The tensors of the safetensors file ``path`` (torch, on the CPU); a missing, truncated or foreign file is an
    :class:`~cxrground.errors.InputError` naming it."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise InputError("weights file does not exist", path)
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error type (SafetensorError) for a file it cannot decode
        raise InputError(f"not a readable safetensors file ({exc}); a truncated copy or another format?",
                         path) from None
