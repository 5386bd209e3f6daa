"""``anatomy zones``: per-film progress (a killed run resumes where it stopped, the result is the same as an
uninterrupted run), a folder holding another run's results is refused (``--overwrite`` starts afresh), and overlay
names are unique."""

from __future__ import annotations

import csv
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.datasets.synthetic import SynthConfig, write_cohort
from cxrground.errors import ConfigError
from cxrground.lesions import zones as zones_mod
from cxrground.lesions.normative import NormativeModel
from cxrground.lesions.zones import PROGRESS_FILE, RUN_FILE, find_images, overlay_names, write_zones


@pytest.fixture(scope="module")
def films(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four films whose old overlay names collided: ``img1.png`` / ``img1.jpg`` and ``sub/x.png`` /
    ``sub__x.png``."""
    cohort = tmp_path_factory.mktemp("zones") / "cohort"
    write_cohort(cohort, 2, seed=4, config=SynthConfig(width=128), progress=False)
    pngs = find_images(cohort)
    root = cohort.parent / "films"
    (root / "sub").mkdir(parents=True)
    from PIL import Image

    shutil.copy(pngs[0], root / "img1.png")
    Image.open(pngs[0]).convert("L").save(root / "img1.jpg", quality=95)
    shutil.copy(pngs[-1], root / "sub" / "x.png")
    shutil.copy(pngs[-1], root / "sub__x.png")
    old = time.time() - 60  # written a while ago: no film is "racy" (just written), whenever a run reads it
    for film in find_images(root):
        os.utime(film, (old, old))
    return root


def _segmenter():
    from cxrground.anatomy.segment import get_segmenter

    return get_segmenter("unet")


def _outputs(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_overlay_names_keep_the_path_and_are_unique() -> None:
    names = overlay_names(["img1.jpg", "img1.png", "sub/x.jpg", "sub__x.jpg", "a.png", "a.png", "d.png/y.png",
                           "d.jpg", "noext"])
    assert names["img1.jpg"] == "overlays/img1.png"
    assert names["img1.png"].startswith("overlays/img1.") and names["img1.png"] != "overlays/img1.png"
    assert names["sub/x.jpg"] == "overlays/sub/x.png" and names["sub__x.jpg"] == "overlays/sub__x.png"
    assert names["a.png"] == "overlays/a.png" and names["noext"] == "overlays/noext.png"
    assert names["d.png/y.png"] == "overlays/d.png/y.png"
    assert names["d.jpg"].startswith("overlays/d.") and names["d.jpg"] != "overlays/d.png"  # "d.png" is a folder
    assert len(set(names.values())) == len(names)


def test_killed_run_resumes_and_other_runs_are_refused(films, tmp_path, monkeypatch) -> None:
    model, seg = NormativeModel.load(None), _segmenter()
    paths = find_images(films)
    fresh = tmp_path / "fresh"
    readings, failures = write_zones(paths, fresh, seg, model, root=films)
    assert len(readings) + len(failures) == 4
    overlays = sorted(p.relative_to(fresh).as_posix() for p in (fresh / "overlays").rglob("*.png")
                      if not p.relative_to(fresh / "overlays").as_posix().startswith("_failed/"))
    assert overlays == sorted(overlay_names([r.image for r in readings]).values()) and len(overlays) == len(readings)
    failed = [json.loads(line) for line in (fresh / "failures.jsonl").read_text().splitlines()]
    assert all((fresh / f["overlay"]).is_file() for f in failed if "overlay" in f)  # rejected lungs drawn

    real, calls = zones_mod.read_zones, []

    def killed_at_third(*args, **kwargs):
        calls.append(args[3])
        if len(calls) == 3:
            raise KeyboardInterrupt  # the kill, while the third film is read
        return real(*args, **kwargs)

    out = tmp_path / "out"
    monkeypatch.setattr(zones_mod, "read_zones", killed_at_third)
    with pytest.raises(KeyboardInterrupt):
        write_zones(paths, out, seg, model, root=films)
    assert len((out / PROGRESS_FILE).read_text().splitlines()) == 2 and not (out / "zones.csv").exists()
    (out / PROGRESS_FILE).open("a").write('{"image": "torn')  # a line cut short by the kill
    calls.clear()
    monkeypatch.setattr(zones_mod, "read_zones", lambda *a, **k: (calls.append(a[3]), real(*a, **k))[1])
    write_zones(paths, out, seg, model, root=films)
    assert len(calls) == 2  # only the films not done
    assert _outputs(out) == _outputs(fresh)

    other = paths[:2]
    with pytest.raises(ConfigError, match=r"holds another anatomy zones run \(changed: films"):
        write_zones(other, out, seg, model, root=films)
    with pytest.raises(ConfigError, match="changed: overlays"):
        write_zones(paths, out, seg, model, root=films, overlays=False)
    from cxrground.anatomy.segment import get_segmenter

    for options in ({"content_box": True}, {"deskew": True}, {"ctr_calibration": True}):  # other lungs or hearts
        with pytest.raises(ConfigError, match="changed: segmenter"):
            write_zones(paths, out, get_segmenter("unet", **options), model, root=films)
    assert _outputs(out) == _outputs(fresh)
    settings = json.loads((out / "zones.json").read_text())["segmenter"]
    assert settings["deskew"] == "off" and settings["content_box"] == "whole film" and settings["weights_sha256"]
    rows = list(csv.DictReader((out / "zones.csv").open()))
    assert {r["image"]: r["overlay"] for r in rows} == overlay_names([r["image"] for r in rows])
    assert all((out / r["overlay"]).is_file() for r in rows)  # which overlay is whose, clashing names too
    mine = out / "overlays" / "my-notes.txt"  # a file of the user's in the overlay folder
    mine.write_text("keep me")
    write_zones(other, out, seg, model, root=films, overwrite=True)
    assert len((out / "zones.csv").read_text().splitlines()) <= 3
    assert sorted(p.relative_to(out).as_posix() for p in (out / "overlays").rglob("*.png")) == sorted(
        overlay_names([p.relative_to(films).as_posix() for p in other]).values())  # the earlier run's are gone
    assert mine.read_text() == "keep me"


def test_a_changed_film_and_an_old_results_folder_are_refused(films, tmp_path) -> None:
    model, seg = NormativeModel.load(None), _segmenter()
    copy = Path(shutil.copytree(films, tmp_path / "films"))
    out = tmp_path / "out"
    paths = find_images(copy)
    write_zones(paths, out, seg, model, root=copy, overlays=False)
    (out / "zones.csv").unlink()  # as a kill before the end leaves it: resumes, but the film changed since
    shutil.copy(copy / "sub" / "x.png", copy / "img1.png")
    with pytest.raises(ConfigError, match=r"film img1\.png changed"):
        write_zones(paths, out, seg, model, root=copy, overlays=False)
    res = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(copy), "--out", str(out), "--no-overlays",
                                    "--zone-model", "normative", "--overwrite", "--quiet"])
    assert res.exit_code == 0, res.output  # as the error says: --overwrite starts afresh, every film read again
    assert len((out / PROGRESS_FILE).read_text().splitlines()) == 4
    (out / RUN_FILE).unlink()  # results without a run record (another run)
    (out / PROGRESS_FILE).unlink()
    (out / "zones.csv").write_text("image\n")
    res = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(copy), "--out", str(out), "--no-overlays",
                                    "--zone-model", "normative"])
    assert res.exit_code != 0 and "holds the results of another run" in res.output
    res = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(copy), "--out", str(out), "--no-overlays",
                                    "--zone-model", "normative", "--overwrite"])
    assert res.exit_code == 0, res.output
    assert (out / RUN_FILE).is_file() and len((out / "zones.csv").read_text().splitlines()) >= 2
    (out / "poses.csv").write_text("image\n")  # another command's results: refused, --overwrite or not
    for extra in ([], ["--overwrite"]):
        res = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(copy), "--out", str(out),
                                        "--no-overlays", "--zone-model", "normative", *extra])
        assert res.exit_code != 0 and "holds another command's results (poses.csv)" in res.output
    assert (out / "zones.csv").is_file()


def test_exit_1_when_no_film_can_be_read_and_3_for_a_partial_run_with_strict(films, tmp_path) -> None:
    bad = tmp_path / "films"
    bad.mkdir()
    for name in ("a.png", "b.png"):
        (bad / name).write_bytes(b"not a png")
    res = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(bad), "--out", str(tmp_path / "z"),
                                    "--zone-model", "normative", "--quiet"])
    assert res.exit_code == 1 and "no film could be read: all 2 failed" in res.output
    assert (tmp_path / "z" / "failures.jsonl").read_text().count("\n") == 2
    shutil.copy(films / "img1.png", bad / "c.png")
    for extra, code in (([], 0), (["--strict"], 3)):  # one film read, two failed: a partial run
        res = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(bad), "--out", str(tmp_path / "z2"),
                                        "--zone-model", "normative", "--quiet", "--no-overlays", *extra])
        assert res.exit_code == code, res.output
    assert "2 of 3 films failed" in res.output and "--strict: exit status 3" in res.output


def test_failed_films_are_kept_on_a_rerun_and_read_again_with_retry_failed(films, tmp_path, monkeypatch) -> None:
    from cxrground.errors import InputError

    model, seg = NormativeModel.load(None), _segmenter()
    paths = find_images(films)
    out = tmp_path / "out"
    real, calls, failed = zones_mod.read_zones, [], []

    def first_film_fails(*args, **kwargs):
        calls.append(args[3])
        if args[3] == "img1.png" and not failed:
            failed.append(args[3])
            raise InputError("transient read error", "img1.png")
        return real(*args, **kwargs)

    plain_readings, plain_failures = write_zones(paths, tmp_path / "plain", seg, model, root=films, overlays=False)
    monkeypatch.setattr(zones_mod, "read_zones", first_film_fails)
    _, failures = write_zones(paths, out, seg, model, root=films, overlays=False)
    assert [f.reason for f in failures].count("transient read error") == 1
    assert len(failures) == len(plain_failures) + ("img1.png" in {r.image for r in plain_readings})
    calls.clear()
    _, again = write_zones(paths, out, seg, model, root=films, overlays=False)
    assert calls == [] and again == failures  # a plain rerun keeps the recorded failures
    _, failures = write_zones(paths, out, seg, model, root=films, overlays=False, retry_failed=True)
    assert "img1.png" in calls and "transient read error" not in [f.reason for f in failures]  # every failed film
    assert (out / "zones.csv").read_text() == (tmp_path / "plain" / "zones.csv").read_text()


def test_a_failed_film_fixed_since_is_read_again(films, tmp_path) -> None:
    model, seg = NormativeModel.load(None), _segmenter()
    copy = Path(shutil.copytree(films, tmp_path / "films"))
    (copy / "broken.png").write_bytes(b"")
    out = tmp_path / "out"
    readings, failures = write_zones(find_images(copy), out, seg, model, root=copy, overlays=False)
    assert [f.reason for f in failures if f.path.endswith("broken.png")] == ["file is empty (0 bytes)"]
    shutil.copy(copy / "img1.png", copy / "broken.png")  # the film is fixed; the run is simply run again
    again, failures_again = write_zones(find_images(copy), out, seg, model, root=copy, overlays=False)
    assert not any(f.path.endswith("broken.png") for f in failures_again)
    assert {r.image for r in again} == {r.image for r in readings} | {"broken.png"}
    fixed = next(r for r in again if r.image == "broken.png")
    assert fixed.ctr == next(r for r in again if r.image == "img1.png").ctr


def test_max_pixels_refuses_large_films_and_a_retry_with_a_higher_limit_reads_them(films, tmp_path) -> None:
    model, seg = NormativeModel.load(None), _segmenter()
    out = tmp_path / "out"
    paths = find_images(films)
    readings, failures = write_zones(paths, out, seg, model, root=films, overlays=False, max_pixels=100)
    assert not readings and failures and all("over the limit of 100 pixels" in f.reason for f in failures)
    again, _ = write_zones(paths, out, seg, model, root=films, overlays=False, retry_failed=True)
    fresh, _ = write_zones(paths, tmp_path / "fresh", seg, model, root=films, overlays=False)
    assert again and [r.image for r in again] == [r.image for r in fresh]


def test_a_resume_reads_a_film_again_only_when_its_size_or_time_changed(films, tmp_path, monkeypatch) -> None:
    import os

    from cxrground.io import film_ledger

    model, seg = NormativeModel.load(None), _segmenter()
    copy = shutil.copytree(films, tmp_path / "films")
    paths = find_images(copy)
    out = tmp_path / "out"
    write_zones(paths, out, seg, model, root=copy, overlays=False)
    hashed: list[str] = []
    real = film_ledger.sha256_file
    monkeypatch.setattr(film_ledger, "sha256_file", lambda p: (hashed.append(Path(p).name), real(p))[1])
    before = (out / "zones.csv").read_bytes()
    write_zones(paths, out, seg, model, root=copy, overlays=False)
    assert hashed == []  # every film done and untouched: a stat each
    touched = paths[0]
    os.utime(touched, ns=(1_700_000_000_000_000_000,) * 2)  # the same film, another time (a copy without -p)
    write_zones(paths, out, seg, model, root=copy, overlays=False)
    assert hashed == [touched.name] and (out / "zones.csv").read_bytes() == before
    hashed.clear()
    write_zones(paths, out, seg, model, root=copy, overlays=False)
    assert hashed == []  # its new time was recorded
    shutil.copyfile(paths[1], touched)  # another film in its place: refused as before
    with pytest.raises(ConfigError, match="changed since an earlier run"):
        write_zones(paths, out, seg, model, root=copy, overlays=False)
