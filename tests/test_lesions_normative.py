"""Normative model of the normal chest, the seen heart, working-grid anatomy and the zone reading command."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from click.testing import CliRunner

from cxrground.anatomy.segment.builtin import heart_from_lungs, work_box
from cxrground.anatomy.segment.heart import estimate_heart
from cxrground.anatomy.segment.heart_image import seen_cardiac_borders
from cxrground.errors import ConfigError, InputError
from cxrground.io.image import write_image
from cxrground.lesions.normative import (
    BRIXIA_ZONE_LABELS,
    NormativeModel,
    fit_normative,
    lung_coordinates,
    normalise_intensity,
)
from cxrground.lesions.zones import CSV_COLUMNS, find_images, write_zones

H, W = 220, 260


def _lungs() -> tuple[np.ndarray, np.ndarray]:
    """Two rounded-rectangle lungs with a mediastinum gap between them (right lung = image left)."""
    yy, xx = np.mgrid[:H, :W]
    right = ((xx - 72) / 50.0) ** 2 + ((yy - 115) / 90.0) ** 4 <= 1.0
    left = ((xx - 188) / 50.0) ** 2 + ((yy - 115) / 90.0) ** 4 <= 1.0
    return right, left


def _film(rng: np.random.Generator, blob: tuple[int, int] | None = None, heart_half: float = 45.0) -> np.ndarray:
    """Dark lungs, bright mediastinum and body, a bright heart overlapping the lower medial lungs, noise."""
    right, left = _lungs()
    yy, xx = np.mgrid[:H, :W].astype(float)
    img = np.full((H, W), 200.0)
    img[right | left] = 60.0 + 0.15 * (yy[right | left] - 25)
    heart = (((xx - 133) / heart_half) ** 2 + ((yy - 165) / 40.0) ** 2) <= 1.0
    img[heart] = 170.0
    if blob is not None:
        img[(((xx - blob[1]) / 18.0) ** 2 + ((yy - blob[0]) / 18.0) ** 2) <= 1.0] = 165.0
    img += rng.normal(0, 3.0, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def model() -> NormativeModel:
    rng = np.random.default_rng(0)
    right, left = _lungs()
    return fit_normative([(_film(rng), right, left) for _ in range(8)], grid=(8, 4), zone_threshold=3.0)


def test_lung_coordinates_span_the_unit_square_lateral_to_medial():
    right, left = _lungs()
    _, xs, v, u = lung_coordinates(right, "right")
    assert v.min() == 0 and v.max() == 1 and u.min() == 0 and u.max() == 1
    assert xs[u == 0].mean() < xs[u == 1].mean()  # right lung: lateral = image left
    _, xs_l, _, u_l = lung_coordinates(left, "left")
    assert xs_l[u_l == 0].mean() > xs_l[u_l == 1].mean()
    with pytest.raises(ValueError, match="side"):
        lung_coordinates(right, "middle")


def test_normalisation_puts_lung_near_zero_and_mediastinum_near_one():
    right, left = _lungs()
    n = normalise_intensity(_film(np.random.default_rng(1)), right, left)
    assert -0.2 < np.median(n[right | left]) < 0.3
    assert 0.8 < np.median(n[100, 126:135]) < 1.2
    with pytest.raises(InputError, match="lung mask is empty"):
        normalise_intensity(_film(np.random.default_rng(1)), right, np.zeros_like(left))


def test_a_bright_blob_is_the_only_flagged_zone(model):
    right, left = _lungs()
    film = _film(np.random.default_rng(5), blob=(180, 55))  # right lung base = Brixia C
    z = model.z_map(film, right, left)
    assert z[~(right | left)].max() == 0
    scores = model.zone_scores(z, right, left)
    flags = model.zone_flags(scores)
    assert max(scores, key=scores.get) == "C"
    assert flags == {k: k == "C" for k in BRIXIA_ZONE_LABELS}
    normal = model.zone_flags(model.zone_scores(model.z_map(_film(np.random.default_rng(6)), right, left),
                                                right, left))
    assert not any(normal.values())


def test_save_load_round_trip_and_checksum(model, tmp_path):
    path = model.save(tmp_path / "m.npz")
    back = NormativeModel.load(path)
    assert np.allclose(back.median, model.median, atol=1e-6) and back.zone_threshold == pytest.approx(3.0)
    assert json.loads(path.with_suffix(".json").read_text())["grid"] == [8, 4]
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(InputError, match="sha256"):
        NormativeModel.load(path)
    with pytest.raises(InputError, match="not found"):
        NormativeModel.load(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="at least 3"):
        fit_normative([])


def test_shipped_model_lists_its_training_films():
    m = NormativeModel.load()
    assert m.grid == (16, 8) and np.isfinite(m.zone_threshold)
    assert len(m.meta["films"]) == 100 and "NIH" in m.meta["attribution"]
    assert (m.median[:, -1].mean() > m.median[:, 0].mean())  # bases are denser than apices on normal films


def test_seen_borders_follow_the_silhouette_not_the_lung_masks():
    right, left = _lungs()
    film = _film(np.random.default_rng(2), heart_half=60.0)
    borders, info = seen_cardiac_borders(film, right, left)
    assert borders is not None and info["rows_seen"] >= 5
    assert abs(borders[0] - 73) < 8 and abs(borders[1] - 193) < 8  # the heart ellipse spans x 73..193
    narrow = estimate_heart(right, left)
    seen = estimate_heart(right, left, seen_borders=borders)
    width = lambda m: np.ptp(np.nonzero(m)[1]) + 1  # noqa: E731
    assert width(seen) > width(narrow)
    heart, record = heart_from_lungs(right, left, pixels=film)
    assert heart is not None and "cardiac-silhouette" in record["method"] and record["ctr"] > 0.4


def test_large_images_are_processed_on_the_working_grid_and_mapped_back_exactly():
    assert work_box((512, 512)) is None and work_box((640, 600)) is None
    box = work_box((2800, 2400))
    assert box is not None and max(box.canvas_hw) == 640
    right, left = _lungs()
    film = _film(np.random.default_rng(3), heart_half=60.0)
    small = box.canvas_hw
    r_w = np.zeros(small, bool)
    r_w[: right.shape[0], : right.shape[1]] = right
    native = box.mask_to_native(r_w)
    assert native.shape == (2800, 2400) and np.array_equal(box.mask_to_canvas(native), r_w)
    big_r, big_l = (np.kron(m, np.ones((4, 4), bool)) for m in (right, left))
    heart, info = heart_from_lungs(big_r, big_l, pixels=np.kron(film, np.ones((4, 4), np.uint8)))
    assert heart is not None and heart.shape == big_r.shape and info["ctr"] > 0.4


def test_zones_csv_overlays_and_failures(tmp_path):
    from cxrground.anatomy.segment.builtin import GivenMasksSegmenter

    right, left = _lungs()
    rng = np.random.default_rng(4)
    folder = tmp_path / "films"
    write_image(folder / "a.png", _film(rng, blob=(180, 55)))
    write_image(folder / "sub" / "b.png", _film(rng))
    (folder / "broken.png").write_bytes(b"not a png")
    fit = fit_normative([(_film(rng), right, left) for _ in range(6)], grid=(8, 4), zone_threshold=3.0)
    seg = GivenMasksSegmenter(lambda im: (right, left))
    readings, failures = write_zones(find_images(folder), tmp_path / "out", seg, fit, root=folder)
    assert [r.image for r in readings] == ["a.png", "sub/b.png"] and len(failures) == 1
    rows = list(csv.DictReader((tmp_path / "out" / "zones.csv").open()))
    assert tuple(rows[0]) == CSV_COLUMNS and b"\r" not in (tmp_path / "out" / "zones.csv").read_bytes()
    assert rows[0]["C"] == "1" and sum(int(rows[1][z]) for z in "ABCDEF") == 0
    assert float(rows[0]["ctr"]) > 0.3
    assert (tmp_path / "out" / "overlays" / "a.png").is_file()
    assert (tmp_path / "out" / "overlays" / "sub" / "b.png").is_file()
    assert "broken.png" in (tmp_path / "out" / "failures.jsonl").read_text()
    # a film the view table calls lateral, and a DICOM whose header says so, are failures, not readings
    from cxrground.io.dicom import write_dicom

    write_dicom(folder / "c.dcm", _film(rng).astype(np.uint8), view="LL")
    readings, failures = write_zones(find_images(folder), tmp_path / "views", seg, fit, root=folder,
                                     views={"a": "LATERAL", "b": "AP SUPINE"}, overlays=False)
    assert [r.image for r in readings] == ["sub/b.png"]
    reasons = {f.path.rsplit("/", 1)[-1]: f.reason for f in failures}
    assert "view LATERAL is not frontal" in reasons["a.png"] and "view LL is not frontal" in reasons["c.dcm"]
    with pytest.raises(InputError, match="not found"):
        find_images(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no PNG"):
        find_images(tmp_path / "empty")


@pytest.mark.pack
def test_zones_command_on_real_films(pack_dir, tmp_path):
    from cxrground.cli import main
    from cxrground.datasets.pack import Pack

    folder = tmp_path / "nih"
    folder.mkdir()
    for rec in Pack(pack_dir).nih()[:2]:
        (folder / rec.image_path.name).write_bytes(rec.image_path.read_bytes())
    result = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(folder), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "zone_prior_v3" in result.output
    rows = list(csv.DictReader((tmp_path / "o" / "zones.csv").open()))
    assert len(rows) == 2 and all(0.25 < float(r["ctr"]) < 0.8 for r in rows)
    assert all(r[z] in ("0", "1") and r[f"{z}_score"] for r in rows for z in "ABCDEF")
    # the default reader is the position-prior reader: scores are probabilities, flags p >= threshold
    prov = json.loads((tmp_path / "o" / "zones.json").read_text())
    assert prov["reader"].startswith("zone_prior_v3") and prov["zone_model"]["zone_sim"]["sha256"]
    threshold = float(prov["flag"].split(">=")[1])
    for r in rows:
        for z in "ABCDEF":
            p = float(r[f"{z}_score"])
            assert 0.0 <= p <= 1.0 and r[z] == str(int(p >= threshold))
    # the Python API reads a film as the command does: a path, the segmenter's name and the default reader
    from cxrground.lesions.zones import read_zones

    first = sorted(folder.iterdir())[0]
    reading, _, _ = read_zones(str(first), "unet", NormativeModel.load())
    row = next(r for r in rows if r["image"] == first.name)
    assert reading.reader == prov["reader"] and all(str(int(reading.flags[z])) == row[z] for z in "ABCDEF")
    # `--zone-model normative`: the normative z score and its threshold
    result = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(folder), "--out", str(tmp_path / "n"),
                                       "--zone-model", "normative", "--no-overlays"])
    assert result.exit_code == 0, result.output
    prov = json.loads((tmp_path / "n" / "zones.json").read_text())
    assert prov["reader"] == "normative" and prov["zone_model"] is None
    model = NormativeModel.load()
    for r in csv.DictReader((tmp_path / "n" / "zones.csv").open()):
        assert all(r[z] == str(int(float(r[f"{z}_score"]) > model.zone_threshold)) for z in "ABCDEF")


def test_zone_reader_names(tmp_path) -> None:
    from cxrground.cli.anatomy_cmds import zones
    from cxrground.lesions.zone_classifier import SHIPPED_ZONE_READER
    from cxrground.lesions.zone_features import check_same_normative
    from cxrground.lesions.zones import DEFAULT_ZONE_READER, reader_name, resolve_zone_reader

    assert resolve_zone_reader("normative") is None
    # None is the reader of `anatomy zones`
    assert reader_name(resolve_zone_reader(None)) == reader_name(resolve_zone_reader(DEFAULT_ZONE_READER))
    assert next(p.default for p in zones.params if p.name == "zone_model") == DEFAULT_ZONE_READER
    shipped = resolve_zone_reader(SHIPPED_ZONE_READER)
    assert shipped is not None and shipped.meta["name"] == SHIPPED_ZONE_READER
    check_same_normative(shipped, NormativeModel.load())  # fitted on the shipped normative model's z-map
    with pytest.raises(InputError, match="not found"):
        resolve_zone_reader(tmp_path / "missing.npz")
    with pytest.raises(ConfigError, match=r"unknown zone reader 'bogus'; choose one of zone_prior_v1, .*normative"):
        resolve_zone_reader("bogus")
