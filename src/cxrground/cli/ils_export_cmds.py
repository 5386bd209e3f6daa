"""``cxrground ils export``: an ILS dataset rewritten in another mask frame (:mod:`cxrground.ils.frames`).

The command is added to the ``ils`` group at import time; ``COMMANDS`` is empty because the group itself is
registered by :mod:`cxrground.cli.ils_cmds`.
"""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.ils_cmds import ils
from cxrground.errors import CXRGroundError


@click.command("export")
@click.option("--frame", type=click.Choice(["released", "native"]), default="released", show_default=True,
              help="released: 512x512 masks, the whole image stretched to the square (MIMIC-ILS as published, "
                   "what the ROSALIA code trains on); native: each image's own size.")
@click.option("--dataset", type=click.Path(path_type=Path, exists=True), required=True,
              help="ILS dataset folder (mimic_ils_instruction_answer.json + lesion_mask/) or the JSON file.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), required=True, help="Folder to write.")
@click.option("--size", type=int, default=512, show_default=True, help="Side of the released-frame masks.")
@click.option("--images", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="Image root, for native sizes the dataset does not record (e.g. a downloaded MIMIC-ILS).")
def export_cmd(frame: str, dataset: Path, out: Path, size: int, images: Path | None) -> None:
    """Write the dataset (same JSON) with its masks in FRAME, the frame recorded in mask_frame.json and card.md."""
    from cxrground.ils.frames import export_dataset

    image_size = None
    if images is not None:
        from cxrground.io.image import read_image

        def image_size(rel: str) -> tuple[int, int]:
            return read_image(images / rel).shape

    try:
        counts = export_dataset(dataset, out, frame=frame, size=size, image_size=image_size)
    except CXRGroundError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{out}: {counts['masks']} masks in the {frame} frame, {counts['studies']} studies "
               f"({counts['native_sizes']} native sizes recorded)")


ils.add_command(export_cmd)

COMMANDS: list[click.Command] = []
