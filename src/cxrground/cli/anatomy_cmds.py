"""``cxrground anatomy``: compute and draw the location geometry of one image from its lung masks."""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.common import clean_errors


@click.group("anatomy")
def anatomy() -> None:
    """Anatomy geometry: ILS location labels, CheXpercept zones and sub-regions, CTR."""


@anatomy.command("show")
@click.option("--image", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True)
@click.option("--right", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True,
              help="Right-lung mask PNG (patient's right = image left).")
@click.option("--left", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True)
@click.option("--heart", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None)
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True, help="PNG to write.")
@click.option("--width", type=int, default=384, show_default=True, help="Panel width in pixels.")
@clean_errors()
def show(image: Path, right: Path, left: Path, heart: Path | None, out: Path, width: int) -> None:
    """Draw ILS location labels, CheXpercept zones / rims / angles and the 20 sub-regions on the image."""
    from cxrground.anatomy.figure import geometry_figure
    from cxrground.io.image import read_image, write_image
    from cxrground.io.masks import read_mask_png

    im = read_image(image)
    fig = geometry_figure(im.pixels, read_mask_png(right, im.shape), read_mask_png(left, im.shape),
                          read_mask_png(heart, im.shape) if heart else None, width)
    write_image(out, fig.sheet)
    click.echo(f"wrote {out}")
    for name, area in fig.subregion_areas.items():
        click.echo(f"  {name}: {area} px")
    if fig.ctr is not None:
        click.echo(f"  CTR = {fig.ctr:.3f}")


COMMANDS: list[click.Command] = [anatomy]
