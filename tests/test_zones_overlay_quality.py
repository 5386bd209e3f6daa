"""``anatomy zones`` outputs a reader can check: the overlay shows the six zones with a legend in the anatomy palette
shared with ``segment lungs``, sized to the film; the CSV carries each film's quality signals; a film whose lungs are
rejected gets a picture of them; a blank film says so; ``--save-masks`` writes the masks."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from cxrground.anatomy.ils_locations import ils_location_masks
from cxrground.anatomy.segment.base import LungHeartMasks
from cxrground.errors import ConfigError
from cxrground.io.cxr_image import CXRImage
from cxrground.io.overlay import ANATOMY_COLOURS, label_panel, mask_edges
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS, NormativeModel
from cxrground.lesions.zones import (
    CSV_COLUMNS,
    PROGRESS_FILE,
    QUALITY_COLUMNS,
    RUN_FILE,
    ZoneReading,
    failed_overlay_names,
    mask_names,
    overlay_names,
    read_zones,
    write_zones,
    zones_overlay,
)

H, W = 240, 300
ZONES = tuple(BRIXIA_ZONE_LABELS)


def _lungs(h: int = H, w: int = W) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two lung-like ellipses (right lung on the image left) and a heart between their lower halves."""
    yy, xx = np.mgrid[:h, :w]
    right = ((yy - 0.475 * h) / (0.35 * h)) ** 2 + ((xx - 0.3 * w) / (0.16 * w)) ** 2 <= 1
    left = ((yy - 0.5 * h) / (0.36 * h)) ** 2 + ((xx - 0.7 * w) / (0.15 * w)) ** 2 <= 1
    heart = (((yy - 0.7 * h) / (0.12 * h)) ** 2 + ((xx - 0.5 * w) / (0.14 * w)) ** 2 <= 1) & ~right & ~left
    return right, left, heart


class FakeSegmenter:
    """Lung-like masks on every film; by file name: ``swap*`` gets its lungs swapped (implausible), ``narrow*`` a
    heart the segmenter judges implausible; a film darker than mid-grey (``dark.png``, and the negatives of the others)
    gets no lungs, so ``dark.png`` is read as its negative."""

    name = "fake"

    def segment(self, image: CXRImage) -> LungHeartMasks:
        right, left, heart = _lungs(*image.shape)
        stem = Path(image.path or "x").stem
        if stem.startswith("swap"):
            right, left = left, right
        if image.pixels.mean() <= 128:
            right, left = np.zeros_like(right), np.zeros_like(left)
        extra = {"heart_estimate": {"ctr_plausible": not stem.startswith("narrow")}}
        return LungHeartMasks(right, left, heart, "estimate", "fake", extra)


def _film(seed: int = 0) -> np.ndarray:
    """A textured grey film, mean about 150, never white (255 in an overlay is drawn text)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:H, :W]
    return np.clip(120 + 60 * np.sin(xx / 17.0) * np.cos(yy / 23.0) + rng.normal(0, 8, (H, W)) + 30, 40,
                   220).astype(np.uint8)


@pytest.fixture()
def films(tmp_path: Path) -> Path:
    root = tmp_path / "films"
    root.mkdir()
    for i, name in enumerate(("a.png", "narrow.png", "swap.png")):
        Image.fromarray(_film(i)).save(root / name)
    Image.fromarray(255 - _film(3)).save(root / "dark.png")  # mean under 128: read as its negative
    Image.fromarray(np.full((H, W), 128, np.uint8)).save(root / "grey.png")  # blank
    return root


def _reading(flags: str = "", reader: str = "lesion-unet (zone share >= 0.10)") -> ZoneReading:
    return ZoneReading("film.png", 0.5, dict.fromkeys(ZONES, 0.2), {k: k in flags for k in ZONES}, "estimate", reader,
                       True, "stored")


def _seg() -> LungHeartMasks:
    right, left, heart = _lungs()
    return LungHeartMasks(right, left, heart, "estimate", "fake")


def _colour(name: str) -> np.ndarray:
    return np.rint(np.asarray(ANATOMY_COLOURS[name]) * 255).astype(np.uint8)


def _is(pixels: np.ndarray, name: str) -> np.ndarray:
    """Which pixels are drawn in the anatomy colour ``name`` (to a grey level, as drawing rounds)."""
    return np.abs(pixels.astype(int) - _colour(name).astype(int)).max(axis=-1) <= 1


def test_the_overlay_outlines_and_letters_every_zone_and_has_a_legend() -> None:
    image = CXRImage(pixels=_film(), path="film.png")
    over = zones_overlay(image, _seg(), np.zeros((H, W)), _reading("C"))
    assert over.shape[1] == 4 + W + 4 + W + 4  # two panels of the film's width (under 768 px)
    anat = over[4:4 + H, 4:4 + W]
    right, left, _ = _lungs()
    bands = {k: ils_location_masks(right, left)[BRIXIA_ZONE_LABELS[k]] for k in ZONES}
    for k in ZONES:  # every band outlined in its lung's colour, flagged or not
        edge = mask_edges(bands[k], 1)
        colour = _colour("right_lung" if k in "ABC" else "left_lung")
        assert np.all(anat[edge] == colour, axis=1).mean() > 0.6, k
        ys, xs = np.nonzero(bands[k])
        cy, cx = int(ys.mean()), int(xs.mean())
        near = anat[max(0, cy - 12):cy + 12, max(0, cx - 12):cx + 12]
        assert np.all(near >= 235, axis=2).sum() >= 5, f"no letter {k} in its band"
    red = _colour("flagged")
    inside_c = bands["C"] & ~mask_edges(bands["C"], 3)
    tint = anat[inside_c].astype(int)
    assert (tint[:, 0] - tint[:, 2]).mean() > 20  # the flagged zone C is tinted red; the others are not
    inside_a = anat[bands["A"] & ~mask_edges(bands["A"], 3)].astype(int)
    assert (inside_a[:, 0] - inside_a[:, 2]).mean() < 0
    caption = over[4 + H:, 4:4 + W].reshape(-1, 3).astype(int)
    for name in ("right_lung", "left_lung", "heart", "flagged"):  # the legend: each colour written in it
        assert (np.abs(caption - _colour(name).astype(int)).max(axis=1) < 40).sum() >= 3, name
    assert not np.array_equal(red, _colour("right_lung")) and not np.array_equal(red, _colour("left_lung"))


def test_the_map_panel_outlines_the_lungs_and_dims_the_map_outside_them() -> None:
    image = CXRImage(pixels=np.full((H, W), 150, np.uint8), path="film.png")
    heat = zones_overlay(image, _seg(), np.ones((H, W)), _reading())[4:4 + H, 4 + W + 4:4 + 2 * W + 4].astype(int)
    right, left, _ = _lungs()
    assert np.all(heat[mask_edges(right, 1)] == _colour("right_lung"), axis=1).mean() > 0.9
    assert np.all(heat[mask_edges(left, 1)] == _colour("left_lung"), axis=1).mean() > 0.9
    redness = heat[:, :, 0] - heat[:, :, 1]
    inside = right & ~mask_edges(right, 3)
    outside = ~(right | left)
    outside[:, W // 2 - 5:W // 2 + 5] = False
    assert redness[inside].mean() > 2 * redness[outside].mean() > 0


def test_overlay_width_and_the_caption_scale_with_it() -> None:
    image = CXRImage(pixels=_film(), path="film.png")
    wide = zones_overlay(image, _seg(), np.zeros((H, W)), _reading(), width=640)
    assert wide.shape[1] == 4 + 640 + 4 + 640 + 4
    big = CXRImage(pixels=np.asarray(Image.fromarray(_film()).resize((1200, 960))), path="big.png")
    right, left, heart = _lungs(960, 1200)
    default = zones_overlay(big, LungHeartMasks(right, left, heart, "estimate", "fake"), np.zeros((640, 800)),
                            _reading())
    assert default.shape[1] == 4 + 768 + 4 + 768 + 4  # a wide film: 768 px a panel
    rgb = np.zeros((100, 100, 3), np.uint8)
    small, large = label_panel(rgb, "title", ["a line"], width=384), label_panel(rgb, "title", ["a line"], width=768)
    assert large.shape[0] - 768 / 384 * 100 > 1.5 * (small.shape[0] - 100)  # a taller caption strip


def test_segment_lungs_draws_the_lungs_in_the_anatomy_colours(tmp_path: Path) -> None:
    from cxrground.anatomy.segment.output import write_segmentation

    right, left, heart = _lungs()
    image = CXRImage(pixels=np.full((H, W), 100, np.uint8), path="film.png")
    write_segmentation(tmp_path / "seg", Path("film.png"), image, LungHeartMasks(right, left, heart, "estimate",
                                                                                "fake"), {})
    rgb = np.asarray(Image.open(tmp_path / "seg" / "overlay.png").convert("RGB"))
    for name, mask in (("right_lung", right), ("left_lung", left), ("heart", heart)):
        assert _is(rgb[mask_edges(mask, 1)], name).mean() > 0.5, name
    assert not _is(rgb, "flagged").any()  # red marks no lung


def test_csv_quality_columns_failed_overlays_blank_films_and_masks(films: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_zones(sorted(films.iterdir()), out, FakeSegmenter(), NormativeModel.load(), root=films, save_masks=True)
    rows = {r["image"]: r for r in csv.DictReader((out / "zones.csv").open())}
    header = (out / "zones.csv").read_text().splitlines()[0].split(",")
    assert header == list(CSV_COLUMNS) and header[-len(QUALITY_COLUMNS):] == list(QUALITY_COLUMNS)
    assert header[:15] == ["image", "ctr", *ZONES, *(f"{z}_score" for z in ZONES), "overlay"]
    assert sorted(rows) == ["a.png", "dark.png", "narrow.png"]
    assert {k: (r["heart_source"], r["ctr_plausible"], r["read_as"]) for k, r in rows.items()} == {
        "a.png": ("estimate", "1", "stored"), "narrow.png": ("estimate", "0", "stored"),
        "dark.png": ("estimate", "1", "negative")}
    progress = [json.loads(line) for line in (out / PROGRESS_FILE).read_text().splitlines()]
    assert {p["image"]: p["reading"]["read_as"] for p in progress if "reading" in p}["dark.png"] == "negative"

    lines = {Path(f["path"]).name: f for f in map(json.loads, (out / "failures.jsonl").read_text().splitlines())}
    assert lines["grey.png"]["reason"] == "image is blank (one grey level, 128)" and "overlay" not in lines["grey.png"]
    swap = lines["swap.png"]
    assert swap["reason"].startswith("implausible lungs") and swap["overlay"] == "overlays/_failed/swap.png"
    assert swap["overlay"] == failed_overlay_names(["swap.png"])["swap.png"]
    failed = np.asarray(Image.open(out / swap["overlay"]).convert("RGB"))
    assert failed.shape[1] == W and failed.shape[0] > H  # the film with a caption
    swapped_right = _lungs()[1]  # the rejected right lung (the left one, swapped) drawn in the right lung's colour
    assert np.all(failed[:H, :W][mask_edges(swapped_right, 1)] == _colour("right_lung"), axis=1).mean() > 0.9
    assert not np.any(np.all(failed[:H, :W] == _colour("flagged"), axis=2))  # no zone flags

    masks = mask_names(["a.png"])["a.png"]
    assert masks == {"right_lung": "masks/a_right_lung.png", "left_lung": "masks/a_left_lung.png",
                     "heart": "masks/a_heart.png"}
    right, left, heart = _lungs()
    for part, truth in zip(("right_lung", "left_lung", "heart"), (right, left, heart), strict=True):
        arr = np.asarray(Image.open(out / masks[part]))
        assert arr.shape == (H, W) and set(np.unique(arr)) <= {0, 255} and np.array_equal(arr > 0, truth)
    assert not (out / "masks" / "swap_right_lung.png").exists()

    write_zones(sorted(films.iterdir()), out, FakeSegmenter(), NormativeModel.load(), root=films, overwrite=True,
                overlays=False)
    assert not (out / "overlays").exists() and not (out / "masks").exists()  # the earlier run's files are gone


def test_the_cli_offers_the_overlay_width_and_the_masks() -> None:
    res = CliRunner().invoke(_main(), ["anatomy", "zones", "--help"])
    assert res.exit_code == 0 and "--overlay-width" in res.output and "--save-masks" in res.output
    res = CliRunner().invoke(_main(), ["anatomy", "zones", "--images", ".", "--out", "x", "--overlay-width", "20"])
    assert res.exit_code == 2 and "--overlay-width" in res.output


def test_a_run_recorded_by_an_older_layout_is_refused_with_a_clear_message(films: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    paths = sorted(films.iterdir())[:2]
    write_zones(paths, out, FakeSegmenter(), NormativeModel.load(), root=films, overlays=False)
    record = json.loads((out / RUN_FILE).read_text())
    for key in ("progress_layout", "overlay_width", "save_masks"):
        record.pop(key)
    (out / RUN_FILE).write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"written by another cxrground version.*heart_source, ctr_plausible, "
                                          r"read_as.*--overwrite"):
        write_zones(paths, out, FakeSegmenter(), NormativeModel.load(), root=films, overlays=False)
    write_zones(paths, tmp_path / "o2", FakeSegmenter(), NormativeModel.load(), root=films)
    for option in ({"overlay_width": 400}, {"save_masks": True}):  # other overlays or masks: another run
        with pytest.raises(ConfigError, match=f"changed: {next(iter(option))}"):
            write_zones(paths, tmp_path / "o2", FakeSegmenter(), NormativeModel.load(), root=films, **option)


def test_failed_overlay_names_never_clash_with_a_read_films_overlay() -> None:
    names = ["x.png", "_failed/x.png", "sub/y.jpg"]
    failed, read = failed_overlay_names(names), overlay_names(names)
    assert failed["sub/y.jpg"] == "overlays/_failed/sub/y.png"
    assert failed["x.png"] != read["_failed/x.png"] and failed["x.png"].startswith("overlays/_failed/x.")
    assert len({*failed.values(), *read.values()}) == 2 * len(names)


def test_a_blank_film_is_refused_before_segmenting() -> None:
    from cxrground.anatomy.segment.plausibility import blank_problem, segment_checked
    from cxrground.anatomy.segment.pose_run import film_problem
    from cxrground.errors import InputError

    class Never:
        def segment(self, image):
            raise AssertionError("segmented")

    for level in (0, 77, 255):
        pixels = np.full((200, 200), level, np.uint8)
        assert blank_problem(pixels) == f"image is blank (one grey level, {level})" == film_problem(pixels)
        with pytest.raises(InputError, match="image is blank"):
            segment_checked(Never(), CXRImage(pixels=pixels, path="blank.png"))
    assert blank_problem(_film()) is None


def _main():
    from cxrground.cli import main

    return main


def test_the_pose_reader_warns_of_a_mirrored_real_film_in_the_csv_and_the_caption(pack_dir: Path,
                                                                                   tmp_path: Path) -> None:
    """A pack film and its left-right mirror through the real lung U-Net and pose reader: the mirror's row and
    overlay caption carry the warning, the film's do not; without the check the column is blank, and a run folder
    made with it is another run."""
    from cxrground.anatomy.segment import get_segmenter
    from cxrground.io.image import read_image

    films = tmp_path / "films"
    films.mkdir()
    pixels = read_image(pack_dir / "nih" / "images" / "00000100_000.png").pixels
    Image.fromarray(pixels).save(films / "upright.png")
    Image.fromarray(np.ascontiguousarray(pixels[:, ::-1])).save(films / "mirrored.png")
    segmenter, model = get_segmenter("unet"), NormativeModel.load()
    out = tmp_path / "out"
    readings, failures = write_zones(sorted(films.iterdir()), out, segmenter, model, root=films)
    assert not failures
    rows = {r["image"]: r for r in csv.DictReader((out / "zones.csv").open())}
    assert rows["upright.png"]["pose_warning"] == ""
    assert rows["mirrored.png"]["pose_warning"].startswith("mirrored left-right (p ")
    assert json.loads((out / "zones.json").read_text())["pose_reader"]["name"] == "pose_net_v1"
    mirrored = next(r for r in readings if r.image == "mirrored.png")
    image = read_image(films / "mirrored.png")
    _, seg, z = read_zones(image, segmenter, model, "mirrored.png")
    warned, plain = (zones_overlay(image, seg, z, r) for r in (mirrored, replace(mirrored, pose_warning="")))
    assert warned.shape[0] > plain.shape[0]  # the caption has the warning's line
    with pytest.raises(ConfigError, match="changed: pose_reader"):
        write_zones(sorted(films.iterdir()), out, segmenter, model, root=films, pose_check=False)
    write_zones(sorted(films.iterdir()), tmp_path / "off", segmenter, model, root=films, overlays=False,
                pose_check=False)
    off = {r["image"]: r for r in csv.DictReader((tmp_path / "off" / "zones.csv").open())}
    assert off["mirrored.png"]["pose_warning"] == ""


def test_overlay_says_when_the_heart_floor_is_uncertain():
    image = CXRImage(np.full((H, W), 128, np.uint8))
    right, left, heart = _lungs()
    warned = LungHeartMasks(right, left, heart, "estimate", "fake",
                            {"heart_estimate": {"floor_warning": "heart floor uncertain: ..."}})
    with_line, plain = (zones_overlay(image, seg, np.zeros((H, W)), _reading()) for seg in (warned, _seg()))
    assert with_line.shape[0] > plain.shape[0]  # the caption has the warning's line
