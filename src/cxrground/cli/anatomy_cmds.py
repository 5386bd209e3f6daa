"""``cxrground anatomy``: compute and draw the location geometry of one image from its lung masks."""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.anatomy.figure import GeometryRequest, draw_geometry
from cxrground.cli.common import (
    DIR,
    FILE,
    OUT_DIR,
    PACK_OPT,
    echo_lines,
    exit_folder_run,
    group,
    request_options,
    strict_option,
    threads_option,
)
from cxrground.errors import first_failure
from cxrground.io.image import DEFAULT_MAX_PIXELS, MAX_PIXELS_HELP
from cxrground.lesions.zone_fit import ZoneFitRequest


@group("anatomy")
def anatomy() -> None:
    """Anatomy geometry: ILS location labels, CheXpercept zones and sub-regions, CTR."""


@anatomy.command("show")
@request_options(GeometryRequest)
def show(request: GeometryRequest) -> None:
    """Draw ILS location labels, CheXpercept zones / rims / angles and the 20 sub-regions on the image."""
    click.echo("\n".join(draw_geometry(request)))


@anatomy.command("zones")
@threads_option
@click.option("--images", type=DIR, required=True, help="Folder of PNG / JPEG / DICOM films (searched recursively).")
@click.option("--out", type=OUT_DIR, required=True,
              help="Output folder (outside the image folder). A rerun of the same run resumes it (films done are "
                   "skipped); a folder holding another run's results is refused.")
@click.option("--overwrite", is_flag=True,
              help="Delete the results of another run in --out (zones.csv, failures.jsonl, zones.json, the run files "
                   "and the overlays it wrote; other files stay) and start afresh.")
@click.option("--retry-failed", is_flag=True,
              help="On a resumed run, read again the films an earlier session recorded as failures (a rerun keeps "
                   "them by default).")
@click.option("--normative", type=FILE, default=None, help="Normative model .npz (default: the shipped normative_v1).")
@click.option("--no-overlays", is_flag=True, help="Write zones.csv only.")
@click.option("--overlay-width", type=click.IntRange(128, 4096), default=None,
              help="Width in pixels of each of an overlay's two panels (captions scale with it). Default: the film's "
                   "width, at most 768.")
@click.option("--save-masks", is_flag=True,
              help="Also write each film's lungs and heart as 0/255 PNGs at the film's size: "
                   "OUT/masks/<name>_right_lung.png, _left_lung.png, _heart.png (<name> as for the overlays).")
@click.option("--metadata", type=FILE, default=None,
              help="View table (MIMIC-CXR-JPG's mimic-cxr-2.0.0-metadata.csv[.gz], or a CSV with dicom_id = the file "
                   "name's stem and ViewPosition or view): films of another view than PA/AP are recorded as failures, "
                   "not read. Default: that file in the image folder or its parent, when there.")
@click.option("--qc-orientation", is_flag=True,
              help="Record films that look turned or flipped as failures (the built-in U-Net reads their lungs better "
                   "turned 180°, flipped top-bottom or turned 90°; the lung checks pass most of them; mirrored films "
                   "are not detected by it: anatomy pose lists those). Three U-Net passes per film on a small grid.")
@click.option("--no-pose-warning", is_flag=True,
              help="Do not read each film with the pose reader (default: its warning for a film that looks stored "
                   "mirrored, turned or flipped goes to the pose_warning column and the overlay caption; a warning "
                   "to check, not a verdict: it also flags some upright portables).")
@click.option("--zone-model", default="zone_prior_v3", show_default=True,
              help="Who flags the zones: `zone_prior_v3` (a film severity from zone_sim_v1 and the lesion segmenter, "
                   "fitted on readings through the shipped lungs, placed by a position prior from NIH films and both "
                   "image readers' zone evidence; *_score = probability), `zone_prior_v2` (the same severity model "
                   "fitted through lung_unet_v1's lungs), `zone_prior_v1` (the film severity from zone_sim_v1 "
                   "alone), `zone_sim_v1` "
                   "(trained on simulated lesions in NIH normal films; *_score = probability), `lesion-unet` (the "
                   "lesion segmenter; *_score = share of the zone's lung, heart and mediastinum removed, with a "
                   "lesion), `normative` (the normative z score and its threshold), or a zone classifier .npz from "
                   "`anatomy fit-zones`; a classifier (and the zone_prior readers, which read zone_sim_v1) must "
                   "have been fitted with the same --normative.")
@click.option("--segmenter-opt", multiple=True, metavar="KEY=VALUE",
              help="Option of the built-in lung segmenter (repeatable), as `ils build --segmenter-opt`: e.g. "
                   "content_box=true (read the lungs inside the film's uniform borders), deskew=true (read a "
                   "tilted film upright), ctr_calibration=true, weights=FILE.")
@click.option("--max-pixels", type=click.IntRange(1), default=DEFAULT_MAX_PIXELS, show_default=True,
              help=MAX_PIXELS_HELP + " Films refused so are read with a higher limit by a rerun with --retry-failed.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@strict_option("films", "in OUT/failures.jsonl")
def zones(images: Path, out: Path, overwrite: bool, retry_failed: bool, normative: Path | None, no_overlays: bool,
          overlay_width: int | None, save_masks: bool, metadata: Path | None, qc_orientation: bool,
          no_pose_warning: bool, zone_model: str, segmenter_opt: tuple[str, ...], max_pixels: int,
          quiet: bool, strict: bool) -> None:
    """Lungs, heart, CTR and a score + 0/1 flag for each lung zone A-F of every frontal film: OUT/zones.csv. Exits 1
    when no film could be read (the reasons are in OUT/failures.jsonl)."""
    from cxrground.anatomy.segment import SEGMENTERS, get_segmenter
    from cxrground.datasets.views import load_view_table
    from cxrground.extras import check_needs
    from cxrground.fields import key_values
    from cxrground.lesions.normative import NormativeModel
    from cxrground.lesions.zones import find_images, reader_name, resolve_zone_reader, write_zones

    check_needs([SEGMENTERS.need("unet")], "anatomy zones")  # the lungs of every film, before any is read
    _, views = load_view_table(metadata, images)
    model = NormativeModel.load(normative)
    reader = resolve_zone_reader(zone_model)
    segmenter = get_segmenter("unet", **key_values(segmenter_opt))
    readings, failures = write_zones(find_images(images), out, segmenter, model,
                                     overlays=not no_overlays, root=images, zone_model=reader, views=views,
                                     orientation_check=qc_orientation, overwrite=overwrite,
                                     retry_failed=retry_failed, max_pixels=max_pixels, progress=not quiet,
                                     overlay_width=overlay_width, save_masks=save_masks,
                                     pose_check=not no_pose_warning)
    flagged = sum(sum(r.flags.values()) for r in readings)
    how = f"threshold z {model.zone_threshold:.2f}" if reader is None else reader_name(reader)
    click.echo(f"wrote {out / 'zones.csv'}: {len(readings)} images, {flagged} zones flagged, "
               f"{len(failures)} failures ({how})" + first_failure(failures))
    exit_folder_run(len(readings), len(failures), out, strict)


@anatomy.command("fit-zones")
@threads_option
@request_options(ZoneFitRequest)
def fit_zones_cmd(request: ZoneFitRequest) -> None:
    """Train a zone reader on your own labelled films (per-zone 0-3 or 0/1 labels in a CSV): penalty and flag
    threshold by patient-grouped CV, nested CV kappa printed; use it with `anatomy zones --zone-model`."""
    from cxrground.anatomy.segment import SEGMENTERS
    from cxrground.extras import check_needs
    from cxrground.lesions.zone_fit import fit_segmenter, fit_zone_reader

    check_needs([SEGMENTERS.need("unet")], "anatomy fit-zones")  # the lungs of every film, before any is read
    echo_lines(fit_zone_reader(request, fit_segmenter(), progress=True).summary_lines())


@anatomy.command("fit-normative")
@threads_option
@click.option("--out", type=OUT_DIR, required=True, help="Folder for normative_v1.npz + normative_v1.json.")
@click.option("--lungs", default="lung_unet_v1", show_default=True, metavar="NAME|FILE",
              help="Lung U-Net the films are segmented with: a shipped name (lung_unet_v1, lung_unet_v2) or a "
                   ".safetensors file with its .json; the default is the lungs the shipped normative_v1 was fitted "
                   "through.")
@PACK_OPT
def fit_normative_cmd(out: Path, lungs: str, pack_dir: Path | None) -> None:
    """Rebuild the shipped normative model from the pack's NIH No Finding films (recipe:
    cxrground.lesions.normative_fit)."""
    from cxrground.anatomy.segment import get_segmenter
    from cxrground.anatomy.segment.builtin import lung_weights
    from cxrground.datasets.pack import Pack
    from cxrground.lesions.normative_fit import fit_from_pack

    weights = lung_weights(lungs)
    if not weights.is_file():
        raise click.BadParameter(f"no lung U-Net weights at {weights}", param_hint="--lungs")
    model = fit_from_pack(Pack(pack_dir), get_segmenter("unet", weights=weights))
    path = model.save(out / "normative_v1.npz")
    click.echo(f"wrote {path} ({model.meta.get('summary')}; zone threshold {model.zone_threshold:.3f})")


@anatomy.command("pose")
@threads_option
@click.option("--images", type=DIR, required=True, help="Folder of PNG / JPEG / DICOM films (searched recursively).")
@click.option("--out", type=OUT_DIR, required=True,
              help="Output folder (outside the image folder). A rerun of the same run resumes it; a folder holding "
                   "another run's results is refused.")
@click.option("--overwrite", is_flag=True,
              help="Delete the results in --out (of this run or another) and read every film afresh.")
@click.option("--weights", type=FILE, default=None,
              help="Pose reader .safetensors with its .json (default: the shipped pose_net_v1).")
@click.option("--retry-failed", is_flag=True,
              help="On a resumed run, read again the films an earlier session recorded as failures (a rerun keeps "
                   "them by default; a failed film whose file changed is read again anyway).")
@click.option("--no-sheets", is_flag=True, help="Write poses.csv only (no contact sheets of the flagged films).")
@click.option("--metadata", type=FILE, default=None,
              help="View table (as for anatomy zones): films of another view than PA/AP are recorded as failures, "
                   "not read. Default: MIMIC-CXR-JPG's table in the image folder or its parent, when there.")
@click.option("--max-pixels", type=click.IntRange(1), default=DEFAULT_MAX_PIXELS, show_default=True,
              help=MAX_PIXELS_HELP + " Films refused so are read with a higher limit by a rerun with --retry-failed.")
@strict_option("films", "in OUT/failures.jsonl")
def pose(images: Path, out: Path, overwrite: bool, retry_failed: bool, weights: Path | None, no_sheets: bool,
         metadata: Path | None, max_pixels: int, strict: bool) -> None:
    """List the films that look stored mirrored, turned or flipped (OUT/poses.csv, contact sheets in OUT/flagged/):
    a list to look at, nothing is rejected. On held-out films the shipped reader finds 98-100 % of mirrored films
    and lists 3-6 % of upright ones (docs: Real films: anatomy). Exits 1 when no film could be read."""
    from cxrground.anatomy.segment.pose_net import PoseReader, shipped_pose_reader
    from cxrground.anatomy.segment.pose_run import write_poses
    from cxrground.anatomy.segment.registry import TORCH_WEIGHTS
    from cxrground.datasets.views import is_frontal, load_view_table
    from cxrground.extras import Need, check_needs
    from cxrground.io.image import find_images

    check_needs([Need("the pose reader", TORCH_WEIGHTS)], "anatomy pose")
    _, views = load_view_table(metadata, images)
    reader = PoseReader(weights, threads=None) if weights else shipped_pose_reader()
    rows, failures = write_poses(find_images(images), out, reader, root=images, overwrite=overwrite,
                                 sheets=not no_sheets, views=views, frontal=is_frontal, max_pixels=max_pixels,
                                 retry_failed=retry_failed)
    flagged = sum(r.flagged for r in rows)
    click.echo(f"wrote {out / 'poses.csv'}: {len(rows)} films, {flagged} look stored in a wrong pose"
               + (f" (contact sheets in {out / 'flagged'})" if flagged and not no_sheets else "")
               + f", {len(failures)} failures" + first_failure(failures))
    exit_folder_run(len(rows), len(failures), out, strict)


COMMANDS: list[click.Command] = [anatomy]
