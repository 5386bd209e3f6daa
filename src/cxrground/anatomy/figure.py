"""A contact sheet of the location geometry of one image (``cxrground anatomy show``).

Panels: ILS location labels (upper / mid / base per side, apical), CheXpercept zones, medial/lateral halves
with the peripheral rim and costophrenic angles, the non-empty sub-regions and, with a heart mask, the heart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from cxrground.anatomy.ctr import cardiothoracic_ratio
from cxrground.anatomy.ils_locations import ils_location_masks
from cxrground.anatomy.percept_regions import percept_geometry
from cxrground.errors import OptionValueError
from cxrground.fields import option
from cxrground.io.image import read_image, write_image
from cxrground.io.masks import read_mask_png
from cxrground.io.overlay import contact_sheet, label_panel, overlay_masks

__all__ = ["MAX_PANEL_WIDTH", "MIN_PANEL_WIDTH", "SHEET_SUFFIXES", "GeometryFigure", "GeometryRequest",
           "draw_geometry", "geometry_figure"]

#: Panel widths a sheet may have, in pixels.
MIN_PANEL_WIDTH: Final[int] = 32
MAX_PANEL_WIDTH: Final[int] = 4096
#: File endings of the sheet (the formats :func:`~cxrground.io.image.write_image` writes).
SHEET_SUFFIXES: Final[tuple[str, ...]] = (".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class GeometryFigure:
    """The sheet (RGB), the pixel count of each of the 20 sub-regions and the CTR (None without a heart)."""

    sheet: np.ndarray
    subregion_areas: dict[str, int]
    ctr: float | None

    def summary_lines(self) -> list[str]:
        """The pixel count of each sub-region and the CTR, one indented line each."""
        lines = [f"  {name}: {area} px" for name, area in self.subregion_areas.items()]
        return lines if self.ctr is None else [*lines, f"  CTR = {self.ctr:.3f}"]


def geometry_figure(pixels: np.ndarray, right: np.ndarray, left: np.ndarray, heart: np.ndarray | None = None,
                    width: int = 384) -> GeometryFigure:
    """Draw the ILS labels, CheXpercept zones / rims / angles, sub-regions (and heart) over ``pixels``."""
    ils = ils_location_masks(right, left)
    geo = percept_geometry(right, left)
    zones = [ils[f"{s} {z}"] for s in ("right", "left") for z in ("upper zone lung", "mid zone lung", "lung base")]
    apical = [ils["right apical zone lung"], ils["left apical zone lung"]]
    panels = [label_panel(overlay_masks(pixels, zones + apical, alpha=0.35), "ILS location labels",
                          ["upper / mid / base per side, apical outlined"], width),
              label_panel(overlay_masks(pixels, [*geo.zones.values()], alpha=0.35), "CheXpercept zones (thirds)",
                          [f"erosion kernel k={geo.kernel}"], width)]
    rims = [*geo.halves.values(), *geo.peripheral.values(), *geo.cpa.values()]
    panels.append(label_panel(overlay_masks(pixels, rims, alpha=0.3), "medial/lateral, rim, CPA",
                              ["halves, peripheral rim, costophrenic angles"], width))
    ctr = cardiothoracic_ratio(heart, right, left) if heart is not None else None
    lines = [f"CTR = {ctr:.3f}"] if ctr is not None else []
    sub = [m for m in geo.subregions.values() if m.any()]
    panels.append(label_panel(overlay_masks(pixels, sub, alpha=0.4), "20 sub-regions",
                              [f"{len(sub)} non-empty", *lines], width))
    if heart is not None:
        panels.append(label_panel(overlay_masks(pixels, [heart], alpha=0.4), "heart", lines, width))
    areas = {name: int(np.count_nonzero(mask)) for name, mask in geo.subregions.items()}
    return GeometryFigure(contact_sheet(panels, columns=len(panels)), areas, ctr)


@dataclass(frozen=True, kw_only=True)
class GeometryRequest:
    """A film, its lung (and heart) mask PNGs, and the sheet to draw (each field documents itself,
    :func:`cxrground.fields.option`; ``cxrground anatomy show`` offers one option per field)."""

    image: Path = option(path="file", help="The film (PNG, JPEG or DICOM).")
    right: Path = option(path="file", help="Right-lung mask PNG (patient's right = image left).")
    left: Path = option(path="file", help="Left-lung mask PNG (patient's left = image right).")
    heart: Path | None = option(None, path="file", help="Heart mask PNG (for the cardiothoracic ratio).")
    out: Path = option(path="out_file", help="PNG (or JPEG) to write.")
    width: int = option(384, low=MIN_PANEL_WIDTH, high=MAX_PANEL_WIDTH, help="Panel width in pixels.")

    def __post_init__(self) -> None:
        if Path(self.out).suffix.lower() not in SHEET_SUFFIXES:
            raise OptionValueError(f"--out {self.out}: the sheet is written as an image; give a file name ending in "
                                   f"{', '.join(SHEET_SUFFIXES)}")
        if not MIN_PANEL_WIDTH <= self.width <= MAX_PANEL_WIDTH:
            raise OptionValueError(f"--width {self.width}: the panel width must be {MIN_PANEL_WIDTH} to "
                                   f"{MAX_PANEL_WIDTH} pixels")


def draw_geometry(request: GeometryRequest) -> list[str]:
    """Write the geometry sheet of the request's film to ``request.out``; returns what was written and the
    :meth:`GeometryFigure.summary_lines`."""
    r = request
    im = read_image(r.image)
    fig = geometry_figure(im.pixels, read_mask_png(r.right, im.shape), read_mask_png(r.left, im.shape),
                          read_mask_png(r.heart, im.shape) if r.heart else None, r.width)
    write_image(r.out, fig.sheet)
    return [f"wrote {r.out}", *fig.summary_lines()]
