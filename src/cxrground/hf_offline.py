"""Keep Hugging Face libraries offline: ``from_pretrained`` keywords and the hub's offline switch.

Every model with weights from a local folder (RadEdit's text encoder, SAM, the ``hf:`` VLM clients) is loaded
with :func:`model_kwargs`: local files only, and no optimised kernels from the Hugging Face Hub. transformers 4.54
and later fetch such kernels by default when the ``kernels`` package is installed (a download at run time), and
refuse to load the model on a GPU when it is not ("Kernels are not available").

The command line also calls :func:`keep_hub_offline` before any command runs: with the ``kernels`` package
installed, importing bitsandbytes (which transformers and peft do) otherwise asks the Hub for a kernel.
"""

from __future__ import annotations

import os
from typing import Any, Final

__all__ = ["KERNELS_SINCE", "keep_hub_offline", "model_kwargs"]

#: First transformers release whose ``from_pretrained`` takes ``use_kernels``.
KERNELS_SINCE: Final = "4.54.0"


def model_kwargs() -> dict[str, Any]:
    """``from_pretrained`` keywords for a transformers model read from a local folder."""
    import transformers
    from packaging.version import Version

    kw: dict[str, Any] = {"local_files_only": True}
    if Version(transformers.__version__) >= Version(KERNELS_SINCE):
        kw["use_kernels"] = False
    return kw


def keep_hub_offline() -> None:
    """Set ``HF_HUB_OFFLINE=1`` unless the environment already sets it (a user may still choose 0)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
