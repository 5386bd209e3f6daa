"""``segment lungs --images DIR``: a folder per film (two films of one name in two subfolders do not clash), the
summary table and the failures (a corrupt and a blank film recorded, the rest finished), the single-film files, a
killed run resumed, another run's folder refused, the exit status when no film could be segmented."""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cxrground.anatomy.segment import batch as batch_mod
from cxrground.anatomy.segment.batch import CSV_COLUMNS, PROGRESS_FILE
from cxrground.anatomy.segment.request import SegmentRequest, segment_folder_request
from cxrground.cli.segment_cmds import segment
from cxrground.datasets.synthetic import SynthConfig, generate_study
from cxrground.errors import ConfigError
from cxrground.io.image import write_image

pytest.importorskip("torch")

FILMS = ["a/film.png", "b/film.png", "blank.png", "corrupt.png", "top.jpg"]


def _age(root: Path) -> None:
    old = time.time() - 60  # written a while ago: no film is "racy" (just written) whenever a run reads it
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (old, old))


@pytest.fixture(scope="module")
def films(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three small films (two named film.png in two subfolders), a blank one and a corrupt one."""
    root = tmp_path_factory.mktemp("segbatch") / "films"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    write_image(root / "a" / "film.png", generate_study(0, 2, SynthConfig(width=128)).image)
    write_image(root / "b" / "film.png", generate_study(1, 2, SynthConfig(width=128)).image)
    write_image(root / "top.jpg", generate_study(2, 2, SynthConfig(width=128)).image)
    write_image(root / "blank.png", np.full((128, 128), 90, np.uint8))
    whole = (root / "a" / "film.png").read_bytes()
    (root / "corrupt.png").write_bytes(whole[: len(whole) // 2])  # a PNG cut off halfway
    _age(root)
    return root


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(segment, ["lungs", "--quiet", *args])
    return res.exit_code, res.output


def _table(out: Path) -> list[dict[str, str]]:
    with (out / "segment.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_folder_per_film_the_table_and_the_failures(films: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = _run("--images", str(films), "--out-dir", str(out))
    assert code == 0, output
    assert "3 films segmented" in output and "2 failures" in output
    code, strict = _run("--images", str(films), "--out-dir", str(out), "--strict")  # resumed: nothing read again
    assert code == 3 and "2 of 5 films failed" in strict and "--strict: exit status 3" in strict, strict
    header = (out / "segment.csv").read_text().splitlines()[0]
    assert header.split(",") == list(CSV_COLUMNS) == ["image", "status", "folder", "ctr", "heart_source",
                                                      "ctr_plausible", "lungs_plausible", "lung_problems", "read_as",
                                                      "orientation", "error"]
    rows = {r["image"]: r for r in _table(out)}
    assert list(rows) == FILMS  # film order, failed films included
    for name in ("a/film.png", "b/film.png", "top.jpg"):
        row = rows[name]
        assert row["status"] in ("ok", "check") and row["folder"] == name and row["error"] == ""
        assert row["heart_source"] == "estimate" and row["read_as"] == "stored"
        assert row["lungs_plausible"] in ("0", "1") and row["ctr_plausible"] in ("0", "1")
        assert (row["status"] == "check") == (row["lungs_plausible"] == "0" or row["ctr_plausible"] == "0")
        record = json.loads((out / name / "masks.json").read_text())
        assert record["image"] == str(films / name) and f"{record['ctr']:.4f}" == row["ctr"]
        assert {p.name for p in (out / name).iterdir()} == {"right_lung.png", "left_lung.png", "heart.png",
                                                            "overlay.png", "masks.json"}
    # the two film.png: two folders, each film's own masks
    assert (out / "a/film.png/right_lung.png").read_bytes() != (out / "b/film.png/right_lung.png").read_bytes()
    assert rows["blank.png"]["status"] == "failed" and "blank" in rows["blank.png"]["error"]
    assert rows["corrupt.png"]["status"] == "failed" and "corrupt" in rows["corrupt.png"]["error"]
    assert rows["blank.png"]["folder"] == "" and not (out / "blank.png").exists()
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [Path(f["path"]).name for f in failures] == ["blank.png", "corrupt.png"]
    assert all(f["stage"] == "segment" and f["reason"] for f in failures)
    summary = json.loads((out / "segment.json").read_text())
    assert summary["backend"] == "unet" and summary["failures"] == 2 and summary["ok"] + summary["check"] == 3

    # the single-film command writes the same files for the same film
    one = tmp_path / "one"
    code, output = _run("--image", str(films / "a/film.png"), "--out-dir", str(one))
    assert code == 2 and "--quiet: only with --images" in output
    res = CliRunner().invoke(segment, ["lungs", "--image", str(films / "a/film.png"), "--out-dir", str(one)])
    assert res.exit_code == 0, res.output
    for name in ("right_lung.png", "left_lung.png", "heart.png", "overlay.png"):
        assert (one / name).read_bytes() == (out / "a/film.png" / name).read_bytes()


def test_a_killed_run_resumes_and_other_runs_are_refused(films: Path, tmp_path: Path, monkeypatch) -> None:
    fresh = tmp_path / "fresh"
    segment_folder_request(SegmentRequest(images=films, out_dir=fresh, quiet=True))

    real, calls = batch_mod.segment_film, []

    def killed_after_two(path, *args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the run is killed while it segments its third film
        calls.append(Path(path).relative_to(films).as_posix())
        return real(path, *args, **kwargs)

    out = tmp_path / "out"
    request = SegmentRequest(images=films, out_dir=out, quiet=True)
    monkeypatch.setattr(batch_mod, "segment_film", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        segment_folder_request(request)
    assert calls == ["a/film.png", "b/film.png"] and not (out / "segment.csv").exists()
    assert len((out / PROGRESS_FILE).read_text().splitlines()) == 2

    calls.clear()

    def counted(path, *args, **kwargs):
        calls.append(path.name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(batch_mod, "segment_film", counted)
    result = segment_folder_request(request)
    assert calls == ["blank.png", "corrupt.png", "top.jpg"]  # the films done are skipped
    assert (out / "segment.csv").read_text() == (fresh / "segment.csv").read_text()
    assert (out / "failures.jsonl").read_text() == (fresh / "failures.jsonl").read_text()
    assert result.segmented == 3 and len(result.failures) == 2

    calls.clear()
    (out / "top.jpg" / "masks.json").unlink()  # a film's files deleted since: segmented again
    segment_folder_request(request)
    assert calls == ["top.jpg"]  # failures kept
    calls.clear()
    segment_folder_request(SegmentRequest(images=films, out_dir=out, quiet=True, retry_failed=True))
    assert calls == ["blank.png", "corrupt.png"]

    # another run's settings: refused, naming what changed; --overwrite starts afresh and keeps other files
    code, output = _run("--images", str(films), "--out-dir", str(out), "--backend-opt", "deskew=true")
    assert code == 1 and "another segment lungs run" in output and "options" in output
    (out / "notes.txt").write_text("mine")
    calls.clear()
    code, output = _run("--images", str(films), "--out-dir", str(out), "--backend-opt", "deskew=true", "--overwrite")
    assert code == 0, output
    assert len(calls) == 5 and (out / "notes.txt").read_text() == "mine"


def test_a_fixed_film_is_segmented_again_and_a_changed_one_refused(films: Path, tmp_path: Path) -> None:
    root = tmp_path / "films"
    root.mkdir()
    good = write_image(root / "x.png", generate_study(0, 2, SynthConfig(width=128)).image)
    write_image(root / "y.png", np.full((128, 128), 0, np.uint8))
    _age(root)
    out = tmp_path / "out"
    assert segment_folder_request(SegmentRequest(images=root, out_dir=out, quiet=True)).segmented == 1
    write_image(root / "y.png", generate_study(3, 2, SynthConfig(width=128)).image)  # the blank film replaced
    result = segment_folder_request(SegmentRequest(images=root, out_dir=out, quiet=True))
    assert result.segmented == 2 and not result.failures and (out / "y.png" / "masks.json").is_file()
    write_image(good, generate_study(4, 2, SynthConfig(width=128)).image)  # a film segmented before, changed
    with pytest.raises(ConfigError, match=r"x\.png changed"):
        segment_folder_request(SegmentRequest(images=root, out_dir=out, quiet=True))


def test_exit_status_and_options_that_do_not_go_together(films: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "only.png").write_bytes(films.joinpath("corrupt.png").read_bytes())
    code, output = _run("--images", str(bad), "--out-dir", str(tmp_path / "o"))
    assert code == 1 and "no film could be read: all 1 failed" in output and "failures.jsonl" in output
    for args, says in ((["--image", str(films / "top.jpg"), "--images", str(films)], "--image FILE"),
                       ([], "--image FILE"),
                       (["--images", str(films), "--backend", "given"], "not with --images"),
                       (["--images", str(films), "--right", str(films / "top.jpg")], "--right")):
        code, output = _run(*args, "--out-dir", str(tmp_path / "x"))
        assert code == 2 and says in output, output
    code, output = _run("--images", str(films), "--out-dir", str(films / "out"))
    assert code == 1 and "inside the image folder" in output


def test_another_commands_folder_is_refused_both_ways(films: Path, tmp_path: Path) -> None:
    from cxrground.lesions import zones as zones_mod

    zones_out = tmp_path / "zones"
    zones_out.mkdir()
    (zones_out / "zones.csv").write_text("image\n")
    code, output = _run("--images", str(films), "--out-dir", str(zones_out))
    assert code == 1 and "another command's results (zones.csv)" in output
    seg_out = tmp_path / "seg"
    seg_out.mkdir()
    (seg_out / "segment.csv").write_text("image\n")
    with pytest.raises(ConfigError, match="another command's results"):
        zones_mod._check_run(seg_out, {}, overwrite=True)
