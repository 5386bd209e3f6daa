"""``cxrground segment``: lung/heart masks of one image with a chosen backend; training of the lung U-Net."""

from __future__ import annotations

import click

from cxrground.anatomy.segment.request import SegmentRequest, segment_request
from cxrground.cli.common import group, request_options, threads_option
from cxrground.models.lung_unet.config import LungTrainRequest


@group("segment")
def segment() -> None:
    """Lung/heart segmentation: built-in lung U-Net (heart estimated), given masks, mask folders, CXAS, HybridGNet."""


@segment.command("lungs")
@threads_option
@request_options(SegmentRequest)
def lungs(request: SegmentRequest) -> None:
    """Write right_lung.png, left_lung.png, heart.png, overlay.png and masks.json; print the CTR."""
    click.echo("\n".join(segment_request(request)))


@segment.command("train-lungs")
@request_options(LungTrainRequest)
def train_lungs(request: LungTrainRequest) -> None:
    """Train the lung U-Net on the pack's shippable rows (plus optional phantoms); evaluate on the NC rows.

    The shipped lung_unet_v1 was fine-tuned with --init (the previous v1) --lr 1e-3 --synthetic 200
    --epochs 16 (see its sidecar's training.recipe).
    """
    from cxrground.models.lung_unet.train import train_request

    click.echo("\n".join(train_request(request).summary_lines()))


COMMANDS: list[click.Command] = [segment]
