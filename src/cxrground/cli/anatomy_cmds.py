"""``cxrground anatomy``: compute and draw the location geometry of one image from its lung masks."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from cxrground.anatomy import cardiothoracic_ratio, ils_location_masks, percept_geometry
from cxrground.errors import InputError
from cxrground.io.image import read_image, write_image
from cxrground.io.masks import read_mask_png
from cxrground.io.overlay import contact_sheet, label_panel, overlay_masks


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
def show(image: Path, right: Path, left: Path, heart: Path | None, out: Path, width: int) -> None:
    """Draw ILS location labels, CheXpercept zones / rims / angles and the 20 sub-regions on the image."""
    try:
        im = read_image(image)
        r, lft = read_mask_png(right, im.shape), read_mask_png(left, im.shape)
        h = read_mask_png(heart, im.shape) if heart else None
    except InputError as exc:
        raise click.ClickException(str(exc)) from exc
    ils = ils_location_masks(r, lft)
    geo = percept_geometry(r, lft)
    panels = []
    zones = [ils[f"{s} {z}"] for s in ("right", "left") for z in ("upper zone lung", "mid zone lung", "lung base")]
    apical = [ils["right apical zone lung"], ils["left apical zone lung"]]
    panels.append(label_panel(overlay_masks(im.pixels, zones + apical, alpha=0.35), "ILS location labels",
                              ["upper / mid / base per side, apical outlined"], width))
    percept = [*geo.zones.values()]
    panels.append(label_panel(overlay_masks(im.pixels, percept, alpha=0.35), "CheXpercept zones (thirds)",
                              [f"erosion kernel k={geo.kernel}"], width))
    rims = [*geo.halves.values(), *geo.peripheral.values(), *geo.cpa.values()]
    panels.append(label_panel(overlay_masks(im.pixels, rims, alpha=0.3), "medial/lateral, rim, CPA",
                              ["halves, peripheral rim, costophrenic angles"], width))
    lines = []
    if h is not None:
        ctr = cardiothoracic_ratio(h, r, lft)
        lines.append(f"CTR = {ctr:.3f}")
    sub = [m for m in geo.subregions.values() if m.any()]
    panels.append(label_panel(overlay_masks(im.pixels, sub, alpha=0.4), "20 sub-regions",
                              [f"{len(sub)} non-empty", *lines], width))
    if h is not None:
        panels.append(label_panel(overlay_masks(im.pixels, [h], alpha=0.4), "heart", lines, width))
    write_image(out, contact_sheet(panels, columns=len(panels)))
    click.echo(f"wrote {out}")
    for name, mask in geo.subregions.items():
        click.echo(f"  {name}: {int(np.count_nonzero(mask))} px")
    for line in lines:
        click.echo(f"  {line}")


@anatomy.command("zones")
@click.option("--images", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True,
              help="Folder of PNG / JPEG / DICOM films (searched recursively).")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), required=True)
@click.option("--normative", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="Normative model .npz (default: the shipped normative_v1).")
@click.option("--no-overlays", is_flag=True, help="Write zones.csv only.")
def zones(images: Path, out: Path, normative: Path | None, no_overlays: bool) -> None:
    """Lungs, heart, CTR and a score + 0/1 flag for each lung zone A-F of every film: OUT/zones.csv."""
    from cxrground.anatomy.normative import NormativeModel
    from cxrground.anatomy.segment import get_segmenter
    from cxrground.anatomy.zones import find_images, write_zones

    try:
        model = NormativeModel.load(normative)
        readings, failures = write_zones(find_images(images), out, get_segmenter("unet"), model,
                                         overlays=not no_overlays, root=images)
    except InputError as exc:
        raise click.ClickException(str(exc)) from exc
    flagged = sum(sum(r.flags.values()) for r in readings)
    click.echo(f"wrote {out / 'zones.csv'}: {len(readings)} images, {flagged} zones flagged, "
               f"{len(failures)} failures (threshold z {model.zone_threshold:.2f})")


@anatomy.command("fit-normative")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Folder for normative_v1.npz + normative_v1.json.")
@click.option("--pack", "pack_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="cxr-pack-v1 folder (default: $CXRGROUND_PACK or ../shared/data/cxr-pack-v1).")
def fit_normative_cmd(out: Path, pack_dir: Path | None) -> None:
    """Rebuild the shipped normative model from the pack's NIH No Finding films (recipe:
    cxrground.models.normative_fit)."""
    from cxrground.anatomy.segment import get_segmenter
    from cxrground.datasets.pack import Pack
    from cxrground.models.normative_fit import fit_from_pack

    try:
        model = fit_from_pack(Pack(pack_dir), get_segmenter("unet", threads=1))
    except InputError as exc:
        raise click.ClickException(str(exc)) from exc
    path = model.save(out / "normative_v1.npz")
    click.echo(f"wrote {path} ({model.meta.get('summary')}; zone threshold {model.zone_threshold:.3f})")


COMMANDS: list[click.Command] = [anatomy]
