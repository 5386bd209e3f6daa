"""The lungs a bench fit script segments its films with: ``--lungs NAME|FILE``.

A fitted file records the lung U-Net it was fitted through (``meta.lungs`` or ``segmenter`` in its sidecar). The
default of ``--lungs`` in each fit script is that lung U-Net of the file it rebuilds, not the lung U-Net the package
uses by default now, so the script's rebuild command gives back the shipped file; ``--lungs lung_unet_v2`` (or a
``.safetensors`` path with its ``.json`` beside it) fits through other lungs.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def lung_weights(lungs: str) -> Path:
    """``--lungs`` as a weights path: a shipped lung U-Net's name, or a ``.safetensors`` path as given
    (:func:`cxrground.anatomy.segment.builtin.lung_weights`)."""
    from cxrground.anatomy.segment.builtin import lung_weights as weights_of

    return weights_of(lungs)


def add_lungs_option(parser: argparse.ArgumentParser, default: str | None, fitted: str) -> None:
    """Add ``--lungs``; ``default`` is the lung U-Net ``fitted`` (the shipped file) was fitted through (None: the
    default depends on another option, resolved by the script)."""
    tail = f"default {default}, the lungs {fitted} was fitted through" if default else f"default: {fitted}"
    parser.add_argument("--lungs", default=default, metavar="NAME|FILE",
                        help="lung U-Net the films are segmented with: a shipped name (lung_unet_v1, lung_unet_v2) "
                             f"or a .safetensors path ({tail})")


def resolve_lungs(parser: argparse.ArgumentParser, lungs: str) -> Path:
    """The weights of ``--lungs``, or a usage error (exit 2, no traceback) naming the missing file."""
    path = lung_weights(lungs)
    if not path.is_file():
        parser.error(f"--lungs {lungs}: no lung U-Net weights at {path}")
    return path


def lung_segmenter(weights: Path, **kwargs):
    """The built-in segmenter (``unet``) reading with the lung U-Net ``weights``."""
    from cxrground.anatomy.segment import get_segmenter

    return get_segmenter("unet", weights=weights, **kwargs)
