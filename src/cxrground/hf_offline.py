"""Keyword arguments that keep a Hugging Face ``from_pretrained`` call offline.

Every model with weights from a local folder (RadEdit's text encoder, SAM, the ``hf:`` VLM clients) is loaded
with :func:`model_kwargs`: local files only, and no optimised kernels from the Hugging Face Hub. transformers 4.54
and later fetch such kernels by default when the ``kernels`` package is installed (a download at run time), and
refuse to load the model on a GPU when it is not ("Kernels are not available").
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["KERNELS_SINCE", "model_kwargs"]

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
