"""The pose reader at work on real films: `anatomy pose` lists and draws the films that look wrongly posed, and
`ils build` lists them on the card without rejecting them. The films are NIH films of patients the shipped pose
reader never saw in training (its sidecar's held-out list)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from cxrground.cli import main


def _held_out_films(pack_dir: Path, n: int) -> list[np.ndarray]:
    """``n`` held-out NIH films the shipped reader reads upright (its validation flags a few upright films)."""
    from cxrground.anatomy.segment.pose_net import shipped_pose_reader
    from cxrground.io.image import read_image

    reader = shipped_pose_reader()
    meta = json.loads(reader.path.with_suffix(".json").read_text(encoding="utf-8"))
    films = []
    for name in sorted(meta["data"]["heldout_images"]):
        pixels = read_image(pack_dir / "nih" / "images" / name).pixels
        if reader.read(pixels).upright:
            films.append(pixels)
        if len(films) == n:
            return films
    raise AssertionError("too few held-out films read upright")


def _rows(path: Path) -> dict[str, dict[str, str]]:
    with path.open(encoding="utf-8") as fh:
        return {r["image"]: r for r in csv.DictReader(fh)}


def test_anatomy_pose_lists_wrongly_posed_films_draws_them_and_resumes(pack_dir, tmp_path):
    from cxrground.io.image import write_image

    a, b = _held_out_films(pack_dir, 2)
    films = tmp_path / "films"
    write_image(films / "a.png", a)
    write_image(films / "sub" / "a_mirrored.png", np.ascontiguousarray(a[:, ::-1]))
    write_image(films / "sub" / "b_turned.png", np.ascontiguousarray(b[::-1, ::-1]))
    (films / "broken.png").write_text("not an image")
    out = tmp_path / "out"
    run = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out)])
    assert run.exit_code == 0, run.output
    assert "3 films, 2 look stored in a wrong pose" in run.output and "1 failures" in run.output
    rows = _rows(out / "poses.csv")
    assert (rows["a.png"]["flagged"], rows["a.png"]["correction"]) == ("0", "none")
    assert (rows["sub/a_mirrored.png"]["flagged"], rows["sub/a_mirrored.png"]["correction"]) == \
        ("1", "mirrored left-right")
    assert (rows["sub/b_turned.png"]["flagged"], rows["sub/b_turned.png"]["correction"]) == ("1", "turned 180°")
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [Path(f["path"]).name for f in failures] == ["broken.png"]
    summary = json.loads((out / "poses.json").read_text())
    assert summary["flagged"] == 2 and summary["sheets"] == ["flagged/sheet-001.png"]
    assert (out / "flagged" / "sheet-001.png").stat().st_size > 1000
    before = (out / "poses.csv").read_text()

    # a rerun of the same run reads nothing again (the progress file does not grow) and writes the same list
    progress = (out / ".poses-progress.jsonl").read_text()
    again = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out)])
    assert again.exit_code == 0, again.output
    strict = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out), "--strict"])
    assert strict.exit_code == 3 and "1 of 4 films failed" in strict.output, strict.output
    assert (out / ".poses-progress.jsonl").read_text() == progress and (out / "poses.csv").read_text() == before

    # another set of films in the same folder is refused, and replaced with --overwrite
    write_image(films / "c.png", b)
    other = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out)])
    assert other.exit_code != 0 and "another anatomy pose run" in other.output
    fresh = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out), "--overwrite"])
    assert fresh.exit_code == 0, fresh.output
    assert sorted(_rows(out / "poses.csv")) == ["a.png", "c.png", "sub/a_mirrored.png", "sub/b_turned.png"]

    inside = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(films / "poses")])
    assert inside.exit_code != 0 and "inside the image folder" in inside.output


def test_anatomy_pose_resumes_after_a_kill_with_a_torn_progress_line(pack_dir, tmp_path):
    from cxrground.anatomy.segment.pose_net import shipped_pose_reader
    from cxrground.anatomy.segment.pose_run import PROGRESS_FILE, write_poses
    from cxrground.io.image import write_image

    (a,) = _held_out_films(pack_dir, 1)
    films = tmp_path / "films"
    paths = [write_image(films / "a.png", a), write_image(films / "m.png", np.ascontiguousarray(a[:, ::-1]))]
    out = tmp_path / "out"
    rows, _ = write_poses(paths, out, shipped_pose_reader(), root=films, progress=False)
    lines = (out / PROGRESS_FILE).read_text().splitlines()
    (out / PROGRESS_FILE).write_text(lines[0] + "\n" + lines[1][:20])  # killed while writing the second line
    again, failures = write_poses(paths, out, shipped_pose_reader(), root=films, progress=False)
    assert again == rows and not failures
    assert len((out / PROGRESS_FILE).read_text().splitlines()) == 2


def test_anatomy_pose_reads_a_fixed_film_again_and_retries_failures_on_request(pack_dir, tmp_path):
    from cxrground.io.image import write_image

    (a,) = _held_out_films(pack_dir, 1)
    films = tmp_path / "films"
    write_image(films / "a.png", a)
    (films / "broken.png").write_text("not an image")
    out = tmp_path / "out"
    limit = str(a.size - 1)  # a.png is over the pixel limit: a failure, read by --retry-failed with a higher one

    def pose(*extra: str) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
        run = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out), *extra])
        failed = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
        rows = _rows(out / "poses.csv")
        assert run.exit_code == (1 if failed and not rows else 0), run.output  # 1: no film could be read
        return rows, {Path(f["path"]).name: f["reason"] for f in failed}

    rows, failed = pose("--max-pixels", limit)
    assert rows == {} and sorted(failed) == ["a.png", "broken.png"] and "pixel" not in failed["broken.png"]
    # a rerun keeps the failures; a failed film whose file was fixed since is read again
    write_image(films / "broken.png", a)
    rows, failed = pose("--max-pixels", limit)
    assert rows == {} and sorted(failed) == ["a.png", "broken.png"]
    assert "pixel" in failed["broken.png"]  # read again: now over the limit like a.png
    rows, again = pose()
    assert rows == {} and again == failed  # kept: neither changed since, though the limit is higher now
    rows, failed = pose("--retry-failed")
    assert failed == {} and sorted(rows) == ["a.png", "broken.png"]
    assert rows["a.png"]["flagged"] == rows["broken.png"]["flagged"] == "0"
    # a film read before whose file changed is refused, as before
    write_image(films / "a.png", np.ascontiguousarray(a[:, ::-1]))
    run = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out)])
    assert run.exit_code != 0 and "changed since" in run.output


def _study(files: Path, n: int, pixels: np.ndarray) -> None:
    from cxrground.io.image import write_image

    write_image(files / f"p10/p1000000{n}/s5000000{n}/img{n}.png", pixels)
    (files / f"p10/p1000000{n}/s5000000{n}.txt").write_text("FINDINGS: Small left pleural effusion.")


def test_ils_build_lists_a_mirrored_film_on_the_card_and_rejects_nothing(pack_dir, tmp_path):
    (film,) = _held_out_films(pack_dir, 1)
    files = tmp_path / "files"
    _study(files, 1, film)
    _study(files, 2, np.ascontiguousarray(film[:, ::-1]))

    def build(out: Path, *extra: str) -> tuple[dict, str, str]:
        result = CliRunner().invoke(main, ["ils", "build", "--images", str(files), "--out", str(out),
                                           "--synthesizer", "pseudo-normal", *extra])
        assert result.exit_code == 0, result.output
        units = {u["study_key"]: u for u in (json.loads(p.read_text()) for p in (out / "units").glob("*.json"))}
        return units, (out / "card.md").read_text(), result.output

    units, card, output = build(tmp_path / "default")
    assert [units[k]["status"] for k in ("s50000001", "s50000002")] == ["ok", "ok"]
    assert "pose_warning" not in units["s50000001"]
    assert units["s50000002"]["pose_warning"]["correction"] == "mirrored left-right"
    section = card.split("## Films that may be stored in a wrong pose")[1].split("\n## ")[0]
    assert "| `s50000002` | mirrored left-right |" in section and "s50000001" not in section
    assert "1 film looks stored mirrored, turned or flipped" in output
    provenance = json.loads((tmp_path / "default" / "provenance.json").read_text())
    assert provenance["pose_reader"]["name"] == "pose_net_v1"
    lines = (tmp_path / "default" / "anatomy.jsonl").read_text().splitlines()
    anatomy = {r["study"]: r for r in map(json.loads, lines)}
    assert anatomy["s50000002"]["pose_warning"]["correction"] == "mirrored left-right"
    assert "pose_warning" not in anatomy["s50000001"]

    units, card, output = build(tmp_path / "off", "--no-pose-warning")
    assert not any("pose_warning" in u for u in units.values())
    assert "Not read (`--no-pose-warning`)" in card and "look stored" not in output


def test_ils_build_without_torch_asks_for_it_or_no_pose_warning(monkeypatch, tmp_path):
    import importlib.util

    from cxrground.errors import ConfigError
    from cxrground.ils import build as build_module
    from cxrground.ils.config import IlsConfig, QCConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(ConfigError, match=r"the pose warning .* needs torch.*--no-pose-warning"):
        build_module.build_dataset([], tmp_path / "out", IlsConfig())
    masks = build_module.BackendSpec(segmenter="masks", segmenter_kwargs={"root": str(tmp_path)},
                                     synthesizer="pseudo-normal")
    summary = build_module.build_dataset([], tmp_path / "out", IlsConfig(zone_guide="none",
                                                                         qc=QCConfig(pose_warning=False)),
                                         masks, progress=False)  # without the parts that read torch it goes on
    assert summary.studies_in_dataset == 0 and summary.pose_warnings == 0


def test_anatomy_pose_reads_frontal_films_only_by_the_view_table(pack_dir, tmp_path):
    from cxrground.io.image import write_image

    (a,) = _held_out_films(pack_dir, 1)
    films = tmp_path / "films"
    write_image(films / "front.png", a)
    write_image(films / "side.png", np.ascontiguousarray(a[:, ::-1]))
    table = tmp_path / "views.csv"
    table.write_text("dicom_id,ViewPosition\nfront,PA\nside,LATERAL\n")
    run = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(tmp_path / "out"),
                                    "--metadata", str(table)])
    assert run.exit_code == 0, run.output
    assert list(_rows(tmp_path / "out" / "poses.csv")) == ["front.png"]
    (failure,) = [json.loads(line) for line in (tmp_path / "out" / "failures.jsonl").read_text().splitlines()]
    assert Path(failure["path"]).name == "side.png" and "LATERAL is not frontal" in failure["reason"]


def test_anatomy_pose_bad_weights_stop_the_run_before_any_film_is_recorded(pack_dir, tmp_path):
    from cxrground.anatomy.segment.pose_net import shipped_pose_reader
    from cxrground.io.image import write_image

    (a,) = _held_out_films(pack_dir, 1)
    films = tmp_path / "films"
    write_image(films / "a.png", a)
    shipped = shipped_pose_reader().path
    nosidecar = tmp_path / "w" / "nosc.safetensors"
    nosidecar.parent.mkdir()
    nosidecar.write_bytes(shipped.read_bytes())
    garbage = tmp_path / "w" / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 64)
    meta = json.loads(shipped.with_suffix(".json").read_text())
    from cxrground.io.files import sha256_file

    garbage.with_suffix(".json").write_text(json.dumps({**meta, "sha256": sha256_file(garbage)}))
    for weights, reason in ((nosidecar, "sidecar"), (garbage, "not a readable safetensors file")):
        out = tmp_path / f"out_{weights.stem}"
        run = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out),
                                        "--weights", str(weights)])
        assert run.exit_code == 1 and reason in run.output and str(weights.stem) in run.output
        assert "Traceback" not in run.output and not (out / ".poses-progress.jsonl").exists()
    # the sidecar path names the same weights as the weights file
    by_json = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(tmp_path / "j"),
                                        "--weights", str(shipped.with_suffix(".json"))])
    assert by_json.exit_code == 0, by_json.output
    assert json.loads((tmp_path / "j" / "poses.json").read_text())["weights_sha256"] == meta["sha256"]


def test_anatomy_pose_records_what_is_no_chest_film_and_overwrite_reads_afresh(pack_dir, tmp_path):
    from cxrground.io.image import write_image

    (a,) = _held_out_films(pack_dir, 1)
    films = tmp_path / "films"
    write_image(films / "a.png", a)
    write_image(films / "tiny.png", np.random.default_rng(0).integers(0, 255, (8, 8), dtype=np.uint8))
    write_image(films / "strip.png", np.random.default_rng(1).integers(0, 255, (100, 400), dtype=np.uint8))
    write_image(films / "blank.png", np.full((128, 128), 7, np.uint8))
    (films / "gone.png").symlink_to(tmp_path / "nowhere.png")
    out = tmp_path / "out"
    run = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out)])
    assert run.exit_code == 0, run.output
    assert list(_rows(out / "poses.csv")) == ["a.png"]
    reasons = {Path(f["path"]).name: f["reason"]
               for f in map(json.loads, (out / "failures.jsonl").read_text().splitlines())}
    assert set(reasons) == {"tiny.png", "strip.png", "blank.png", "gone.png"}
    assert "too small" in reasons["tiny.png"] and "too elongated" in reasons["strip.png"]
    assert "blank" in reasons["blank.png"]

    write_image(films / "a.png", np.ascontiguousarray(a[:, ::-1]))  # the film changed: refused, --overwrite reads it
    changed = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out)])
    assert changed.exit_code == 1 and "a.png changed since an earlier run" in changed.output
    fresh = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out), "--overwrite"])
    assert fresh.exit_code == 0, fresh.output
    assert _rows(out / "poses.csv")["a.png"]["correction"] == "mirrored left-right"
    (films / "a.png").unlink()  # every film left fails: exit 1, the reasons recorded
    none = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(tmp_path / "none")])
    assert none.exit_code == 1 and "no film could be read: all 4 failed" in none.output
    assert len((tmp_path / "none" / "failures.jsonl").read_text().splitlines()) == 4
    (out / "zones.csv").write_text("image\n")  # another command's results: refused, --overwrite or not
    mixed = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(out), "--overwrite"])
    assert mixed.exit_code != 0 and "holds another command's results (zones.csv)" in mixed.output


def test_card_pose_section_lists_twenty_films_and_counts_the_rest():
    from cxrground.ils.card import POSE_LISTED, pose_lines

    assert "flagged no film" in "\n".join(pose_lines([], True))
    assert "Not read (`--no-pose-warning`)" in "\n".join(pose_lines([], False))
    posed = [(f"s{i}", {"correction": "mirrored left-right", "p": 0.9, "p_upright": 0.1}, i % 2 == 0)
             for i in range(POSE_LISTED + 5)]
    text = "\n".join(pose_lines(posed, True))
    assert f"flagged: {POSE_LISTED + 5} ({(POSE_LISTED + 6) // 2} of their studies in the dataset)" in text
    assert text.count("| mirrored left-right |") == POSE_LISTED and "5 more: `pose_warning`" in text


def test_contact_sheets_read_films_per_sheet_and_leave_out_what_cannot_be_read(tmp_path):
    from PIL import Image

    from cxrground.anatomy.segment.pose_run import SHEET_SIZE, PoseRow, contact_sheets
    from cxrground.io.image import write_image

    film = np.random.default_rng(0).integers(0, 255, (96, 80), dtype=np.uint8)
    row = PoseRow("x", (1, True), 0.01, 0.97)
    assert row.flagged and row.correction == "turned 90° clockwise, then mirrored left-right"
    paths = [write_image(tmp_path / f"f{i}.png", film) for i in range(SHEET_SIZE + 1)]
    (tmp_path / "f3.png").write_text("gone bad since it was read")
    sheets = contact_sheets([(p.name, p, row) for p in paths] + [("array", film, row)], tmp_path / "sheets")
    assert [p.name for p in sheets] == ["sheet-001.png", "sheet-002.png"]
    assert Image.open(sheets[1]).size[1] == 224 + 44  # one row: the last path and the array


def test_ils_build_reads_poses_with_weights_of_your_own(pack_dir, tmp_path):
    """``--pose-weights``: the films are read with the given weights (their sha256 in the settings and the
    provenance, not their path: the same weights moved elsewhere resume the build); the option needs the pose
    warning on; weights that do not match their sidecar stop the build with an error naming them."""
    import shutil

    from cxrground.anatomy.segment.pose_net import shipped_pose_reader

    (film,) = _held_out_films(pack_dir, 1)
    files = tmp_path / "files"
    _study(files, 1, film)
    _study(files, 2, np.ascontiguousarray(film[:, ::-1]))
    shipped = shipped_pose_reader().path
    mine = tmp_path / "mine" / "pose.safetensors"
    mine.parent.mkdir()
    shutil.copy(shipped, mine)
    shutil.copy(shipped.with_suffix(".json"), mine.with_suffix(".json"))
    out = tmp_path / "out"

    def build(*extra: str) -> object:
        return CliRunner().invoke(main, ["ils", "build", "--images", str(files), "--out", str(out),
                                         "--synthesizer", "pseudo-normal", *extra])

    result = build("--pose-weights", str(mine))
    assert result.exit_code == 0, result.output
    unit = json.loads((out / "units" / "s50000002.json").read_text())
    assert unit["pose_warning"]["correction"] == "mirrored left-right"
    card = (out / "card.md").read_text()
    assert "other pose weights than the shipped ones" in card and "98-100 %" not in card
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["pose_reader"]["sha256"] == json.loads(shipped.with_suffix(".json").read_text())["sha256"]

    moved = tmp_path / "moved" / "pose.safetensors"
    shutil.copytree(mine.parent, moved.parent)
    again = build("--pose-weights", str(moved))
    assert again.exit_code == 0 and "other settings" not in again.output, again.output

    other = tmp_path / "other" / "pose.safetensors"
    shutil.copytree(mine.parent, other.parent)
    sidecar = json.loads(other.with_suffix(".json").read_text())
    sidecar["sha256"] = "0" * 64
    other.with_suffix(".json").write_text(json.dumps(sidecar))
    refused = build("--pose-weights", str(other))
    assert refused.exit_code != 0 and str(other) in refused.output and "sha256" in refused.output

    off = build("--pose-weights", str(mine), "--no-pose-warning")
    assert off.exit_code == 2 and "--no-pose-warning" in off.output


def test_ils_build_reads_with_the_given_pose_weights_not_the_shipped_ones(pack_dir, tmp_path):
    """Weights that read every film as upright (the shipped ones with the upright logit raised) flag no film, where the
    shipped weights flag the mirrored one: the build reads with the weights it is given."""
    import hashlib

    from safetensors.numpy import load_file, save_file

    from cxrground.anatomy.segment.pose_net import shipped_pose_reader

    (film,) = _held_out_films(pack_dir, 1)
    files = tmp_path / "files"
    _study(files, 1, film)
    _study(files, 2, np.ascontiguousarray(film[:, ::-1]))
    shipped = shipped_pose_reader().path
    weights = load_file(str(shipped))
    weights["24.bias"] = weights["24.bias"].copy()
    weights["24.bias"][0] += 100.0  # class 0 = upright
    upright = tmp_path / "upright" / "pose.safetensors"
    upright.parent.mkdir()
    save_file(weights, str(upright))
    sidecar = json.loads(shipped.with_suffix(".json").read_text())
    sidecar["sha256"] = hashlib.sha256(upright.read_bytes()).hexdigest()
    upright.with_suffix(".json").write_text(json.dumps(sidecar))
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(files), "--out", str(tmp_path / "out"),
                                       "--synthesizer", "pseudo-normal", "--pose-weights", str(upright)])
    assert result.exit_code == 0, result.output
    units = [json.loads(p.read_text()) for p in (tmp_path / "out" / "units").glob("*.json")]
    assert len(units) == 2 and not any("pose_warning" in u for u in units)
    assert json.loads((tmp_path / "out" / "provenance.json").read_text())["pose_reader"]["sha256"] == sidecar["sha256"]
