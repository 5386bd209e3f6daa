"""Bad input to the ``ils`` commands: a clear error naming the file or option and the reason, no traceback, no
work silently dropped (undecodable images and masks in the hf export, backends that cannot run, counts below one,
malformed dataset JSON, options for another backend, an empty --reports folder or one without some studies'
reports, unused predictions)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cxrground.cli import main
from cxrground.ils.layout import DATASET_FILE, MASK_DIR

N_STUDIES = 4


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(ILS folder, image root) of a small synthetic cohort."""
    root = tmp_path_factory.mktemp("badinput")
    runner = CliRunner()
    r = runner.invoke(main, ["synth", "--out", str(root / "cohort"), "--studies", str(N_STUDIES), "--seed", "2",
                             "--quiet"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["ils", "build", "--images", str(root / "cohort" / "files"), "--out", str(root / "ils"),
                             "--seed", "0", "--quiet"])
    assert r.exit_code == 0, r.output
    return root / "ils", root / "cohort" / "files"


def _run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _refused(result: Result, *words: str, code: int | None = None) -> None:
    """The command failed cleanly (no traceback) and its message holds ``words``."""
    assert result.exit_code != 0, result.output
    if code is not None:
        assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output, result.output


def _data(ils: Path) -> dict:
    return json.loads((ils / DATASET_FILE).read_text())


def _copy(ils: Path, dest: Path, data: object | None = None, text: str | None = None) -> Path:
    """A copy of the dataset folder, its JSON replaced by ``data`` (or raw ``text``) when given."""
    shutil.copytree(ils, dest)
    if data is not None:
        text = json.dumps(data)
    if text is not None:
        (dest / DATASET_FILE).write_text(text)
    return dest


def _first_positive(data: dict) -> tuple[str, str, dict]:
    for split, studies in data.items():
        for key, study in studies.items():
            if study["instruction_answer_pairs"]["positive_pairs"]:
                return split, key, study["instruction_answer_pairs"]["positive_pairs"][0]
    raise AssertionError("no positive pair in the test dataset")


# --- 1. hf export decodes every image and mask ---------------------------------------------------------------


def test_hf_export_refuses_undecodable_mask(built, tmp_path):
    ils, images = built
    bad = _copy(ils, tmp_path / "ds")
    _, _, pair = _first_positive(_data(bad))
    mask = bad / MASK_DIR / pair["seg_mask_path"]
    mask.write_text("not a png")
    r = _run("ils", "export", "--format", "hf", "--dataset", bad, "--images", images, "--out", tmp_path / "hf")
    _refused(r, mask.name)


def test_hf_export_refuses_a_pair_without_seg(built, tmp_path):
    ils, images = built
    data = _data(ils)
    _, _, pair = _first_positive(data)
    del pair["seg"]
    bad = _copy(ils, tmp_path / "ds", data)
    r = _run("ils", "export", "--format", "hf", "--dataset", bad, "--images", images, "--out", tmp_path / "hf")
    _refused(r, "pairs without the fields the hf format needs", pair["pair_id"], "no seg")


@pytest.mark.parametrize("damage", ["truncated", "text"])
def test_hf_export_refuses_undecodable_image(built, tmp_path, damage):
    ils, images = built
    files = tmp_path / "files"
    shutil.copytree(images, files)
    _, key, _ = _first_positive(_data(ils))
    study = next(s for split in _data(ils).values() for k, s in split.items() if k == key)
    image = files / study["image_path"]
    raw = image.read_bytes()
    image.write_bytes(raw[: len(raw) // 2] if damage == "truncated" else b"hello, not an image\n")
    r = _run("ils", "export", "--format", "hf", "--dataset", ils, "--images", files, "--out", tmp_path / "hf")
    _refused(r, image.name)


# --- 2. a backend that cannot run stops the build before any study -------------------------------------------


def test_build_stops_when_a_backend_cannot_run(built, tmp_path):
    _, images = built
    weights = tmp_path / "junk.pt"
    weights.write_bytes(b"not a checkpoint")
    out = tmp_path / "out"
    r = _run("ils", "build", "--images", images, "--out", out, "--detector", "yolo", "--detector-opt",
             f"weights_path={weights}", "--quiet")
    _refused(r, "YOLO")
    assert not list(out.rglob("*.json")), "studies were processed"


# --- 3. counts below one are refused -------------------------------------------------------------------------


@pytest.mark.parametrize("option", [("--limit", "-1"), ("--limit", "0"), ("--workers", "0"), ("--workers", "-2"),
                                    ("--threshold-scale", "-1"), ("--threshold-scale", "0")])
def test_build_refuses_counts_below_one(built, tmp_path, option):
    _, images = built
    _refused(_run("ils", "build", "--images", images, "--out", tmp_path / "out", *option, "--quiet"), option[0],
             code=2)


@pytest.mark.parametrize("option", [("--limit", "-1"), ("--limit", "0"), ("--batch-size", "0"),
                                    ("--batch-size", "-3")])
def test_predict_refuses_counts_below_one(built, tmp_path, option):
    ils, images = built
    _refused(_run("ils", "predict", "--checkpoint", ils, "--dataset", ils, "--images", images, "--out",
                  tmp_path / "p.jsonl", *option, "--quiet"), option[0], code=2)


def test_evaluate_and_gallery_refuse_limits_below_one(built, tmp_path):
    ils, images = built
    preds = tmp_path / "p.jsonl"
    preds.write_text('{"pair_id": "x", "answer": "[SEG]"}\n')
    _refused(_run("ils", "evaluate", "--dataset", ils, "--predictions", preds, "--limit", "0"), "--limit", code=2)
    _refused(_run("ils", "gallery", ils, "--images", images, "--limit", "-1"), "--limit", code=2)


# --- 4. malformed options and datasets: no traceback ---------------------------------------------------------


def test_build_refuses_malformed_split_ratios(built, tmp_path):
    _, images = built
    _refused(_run("ils", "build", "--images", images, "--out", tmp_path / "out", "--split-ratios", "a,b,c",
                  "--quiet"), "--split-ratios", code=2)


def _broken(kind: str, data: dict) -> dict | list | str | None:
    """The JSON (or raw text) of a broken dataset; None: no JSON at all."""
    if kind == "truncated":
        return json.dumps(data)[:200]
    if kind == "missing":
        return None
    if kind == "list":
        return [1, 2, 3]
    split, key, pair = _first_positive(data)
    if kind == "image_path":
        data[split][key]["image_path"] = 123
    else:
        del pair["instruction"]
    return data


def _broken_dataset(ils: Path, dest: Path, kind: str) -> Path:
    broken = _broken(kind, _data(ils))
    folder = _copy(ils, dest, text=broken if isinstance(broken, str) else None,
                   data=broken if not isinstance(broken, str) else None)
    if broken is None:
        (folder / DATASET_FILE).unlink()
    return folder


_COMMANDS = {
    "gallery": lambda ds, images, tmp: ["ils", "gallery", ds, "--images", images, "--html", tmp / "g.html"],
    "evaluate": lambda ds, images, tmp: ["ils", "evaluate", "--dataset", ds, "--predictions", tmp / "p.jsonl",
                                         "--split", "all", "--bootstrap", "0"],
    "coco": lambda ds, images, tmp: ["ils", "export", "--format", "coco", "--dataset", ds, "--images", images,
                                     "--out", tmp / "x"],
    "mimic-ils": lambda ds, images, tmp: ["ils", "export", "--format", "mimic-ils", "--dataset", ds, "--images",
                                          images, "--out", tmp / "x"],
    "hf": lambda ds, images, tmp: ["ils", "export", "--format", "hf", "--dataset", ds, "--images", images,
                                   "--out", tmp / "x"],
    "stats": lambda ds, images, tmp: ["ils", "stats", ds, "--json"],
    "stats-card": lambda ds, images, tmp: ["ils", "stats", ds],
}


#: (command, broken dataset) cases; a truncated or missing JSON was already reported by all but the gallery.
_CASES = [(command, kind) for command in _COMMANDS for kind in ("truncated", "missing", "list", "image_path",
                                                                 "no_instruction")
          if command == "gallery" or kind not in ("truncated", "missing")]


@pytest.mark.parametrize(("command", "kind"), _CASES)
def test_malformed_dataset_is_reported_with_its_file(built, tmp_path, command, kind):
    ils, images = built
    ds = _broken_dataset(ils, tmp_path / "ds", kind)
    (tmp_path / "p.jsonl").write_text('{"pair_id": "x", "answer": "[SEG]"}\n')
    _refused(_run(*_COMMANDS[command](ds, images, tmp_path)), DATASET_FILE)


def _fake_checkpoint(folder: Path, model: str = "baseline") -> Path:
    folder.mkdir()
    (folder / "checkpoint.json").write_text(json.dumps({"model": model}))
    return folder


@pytest.mark.parametrize("option", [("--device", "bogus"), ("--quantize", "8bit"), ("--device-map", "auto")])
def test_predict_refuses_options_the_checkpoint_cannot_use(built, tmp_path, option):
    pytest.importorskip("torch")
    ils, images = built
    ckpt = _fake_checkpoint(tmp_path / "ckpt")
    r = _run("ils", "predict", "--checkpoint", ckpt, "--dataset", ils, "--images", images, "--out",
             tmp_path / "p.jsonl", *option, "--quiet")
    _refused(r, option[0], *(("LISA",) if option[0] != "--device" else ()))


# --- 5. an empty --reports folder ----------------------------------------------------------------------------


def test_build_refuses_a_reports_folder_without_reports(built, tmp_path):
    _, images = built
    empty = tmp_path / "reports"
    empty.mkdir()
    _refused(_run("ils", "build", "--images", images, "--reports", empty, "--out", tmp_path / "out", "--quiet"),
             str(empty), "no report")


def test_build_records_studies_whose_report_is_not_in_the_reports_folder(built, tmp_path):
    """--reports names where the reports are: a study whose report is not there is a failure naming the study and
    the folder (its report beside the image is not used), the other studies build, and a rerun with the report
    added builds that study too."""
    _, images = built
    reports_beside = sorted(images.rglob("s*.txt"))
    assert len(reports_beside) == N_STUDIES  # every study has its report beside its images
    reports = tmp_path / "reports"
    for report in reports_beside[1:]:
        dest = reports / report.relative_to(images)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(report, dest)
    missing = reports_beside[0]
    out = tmp_path / "out"
    r = _run("ils", "build", "--images", images, "--reports", reports, "--out", out, "--seed", "0", "--quiet")
    assert r.exit_code == 0, r.output
    assert f"({N_STUDIES - 1} processed, 0 already done, 1 failures" in r.output, r.output
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert len(failures) == 1, failures
    assert failures[0]["stage"] == "scan" and f"/{missing.stem}/" in failures[0]["path"]
    assert missing.stem in failures[0]["reason"] and str(reports) in failures[0]["reason"], failures[0]
    assert "| input: no report in the --reports folder | 1 |" in (out / "card.md").read_text()
    studies = {key for split in _data(out).values() for key in split}
    assert missing.stem not in studies

    dest = reports / missing.relative_to(images)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(missing, dest)
    r = _run("ils", "build", "--images", images, "--reports", reports, "--out", out, "--seed", "0", "--quiet")
    assert r.exit_code == 0, r.output
    assert f"(1 processed, {N_STUDIES - 1} already done, 0 failures" in r.output, r.output
    assert (out / "failures.jsonl").read_text() == ""


def test_scan_names_studies_whose_report_is_not_in_the_reports_folder(built, tmp_path):
    """`scan --reports` reports the same failure; without --reports the reports beside the images are found."""
    _, images = built
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "unrelated.txt").write_text("FINDINGS: none.")
    r = _run("scan", "--images", images, "--reports", reports, "--json")
    assert r.exit_code == 1 and "no usable study under" in r.output, r.output  # every study failed
    assert r.output.count("no report in the --reports folder") == N_STUDIES, r.output
    r = _run("scan", "--images", images, "--json")
    assert r.exit_code == 0 and "no report" not in r.output, r.output


def test_build_with_no_study_names_the_index_and_the_first_failure(built, tmp_path):
    _, images = built
    index = tmp_path / "index.csv"
    index.write_text("image,study_id,report\nmissing.png,1,FINDINGS: x.\n")
    _refused(_run("ils", "build", "--images", images, "--index", index, "--out", tmp_path / "out", "--quiet"),
             f"no studies found in the index {index}", f"{N_STUDIES + 1} inputs failed; first:", code=1)
    index.write_text("a,b\n1,2\n")  # no image and study_id columns: one error naming the header
    _refused(_run("ils", "build", "--images", images, "--index", index, "--out", tmp_path / "out", "--quiet"),
             f"{index}: index needs the columns image and study_id; its header has ['a', 'b']", code=1)


@pytest.mark.parametrize(("text", "suffix", "reason"), [
    ("", ".csv", "index is empty: it has no header and no rows"),
    ("image,study_id,report\n", ".csv", "index has a header (image,study_id,report) but no rows"),
    ("\n\n", ".jsonl", "index is empty: it has no rows"),
])
def test_build_from_an_empty_index_says_the_index_is_empty(built, tmp_path, text, suffix, reason):
    _, images = built
    index = tmp_path / f"index{suffix}"
    index.write_text(text)
    _refused(_run("ils", "build", "--images", images, "--index", index, "--out", tmp_path / "out", "--quiet"),
             f"{index}: {reason}", code=1)


# --- 6. unused predictions are told on stderr ----------------------------------------------------------------


def test_evaluate_tells_how_many_predictions_went_unused(built, tmp_path):
    ils, _ = built
    data = _data(ils)
    split = next(s for s, studies in data.items() if sum(
        len(st["instruction_answer_pairs"]["positive_pairs"]) + len(st["instruction_answer_pairs"]["negative_pairs"])
        for st in studies.values()) >= 2)
    ids = [p["pair_id"] for st in data[split].values() for kind in ("positive_pairs", "negative_pairs")
           for p in st["instruction_answer_pairs"][kind]]
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps({"pair_id": pid, "answer": "[SEG]", "mask": None}) + "\n"
                             for pid in (ids[0], ids[1], "s1_positive_9")))
    r = _run("ils", "evaluate", "--dataset", ils, "--predictions", preds, "--split", split, "--limit", "1",
             "--bootstrap", "0")
    assert r.exit_code == 0, r.output
    assert "2 predictions" in r.stderr and "not used" in r.stderr, r.stderr
    assert "1 past --limit" in r.stderr and "1 pair ids not in the dataset" in r.stderr, r.stderr


# --- 7. an output folder inside the image folder -------------------------------------------------------------


@pytest.mark.parametrize("inside", ["", "ils"])
def test_build_refuses_an_output_folder_inside_the_images(built, tmp_path, inside):
    _, images = built
    files = tmp_path / "files"
    shutil.copytree(images, files)
    out = files / inside if inside else files
    _refused(_run("ils", "build", "--images", files, "--out", out, "--quiet"), "inside the image folder", code=2)


def test_evaluate_writes_its_result_when_another_split_cannot_be_read(built, tmp_path):
    """Only the scored split is read and checked: a broken study of another split leaves the note on unused
    predictions untold, after the result is written; with --split all the note follows the file's split order."""
    import shutil

    ils, _ = built
    copy = tmp_path / "ils"
    shutil.copytree(ils, copy)
    data = _data(copy)
    split = next(s for s, studies in data.items() if any(
        st["instruction_answer_pairs"]["negative_pairs"] for st in studies.values()))
    other = next(s for s in data if s != split and any(
        st["instruction_answer_pairs"]["negative_pairs"] for st in data[s].values()))
    broken = next(st for st in data[other].values() if st["instruction_answer_pairs"]["negative_pairs"])
    del broken["instruction_answer_pairs"]["negative_pairs"][0]["instruction"]
    (copy / "mimic_ils_instruction_answer.json").write_text(json.dumps(data))
    pid = next(p["pair_id"] for st in data[split].values() for p in st["instruction_answer_pairs"]["negative_pairs"])
    preds = tmp_path / "p.jsonl"
    preds.write_text(json.dumps({"pair_id": pid, "answer": "[SEG]", "mask": None}) + "\n"
                     + json.dumps({"pair_id": "s1_positive_9", "answer": "[SEG]", "mask": None}) + "\n")
    out = tmp_path / "eval.json"
    r = _run("ils", "evaluate", "--dataset", copy, "--predictions", preds, "--split", split, "--bootstrap", "0",
             "--out", out)
    assert r.exit_code == 0, r.output
    assert out.is_file() and "why could not be told" in r.stderr and "has no 'instruction'" in r.stderr, r.stderr


def _index_of_one_study(images: Path, tmp_path: Path, *extra: str) -> Path:
    """An index CSV of the first study of ``images`` (then the ``extra`` rows)."""
    film = sorted(images.rglob("*.jpg"))[0]
    report = film.parent.with_suffix(".txt")
    index = tmp_path / "index.csv"
    index.write_text("\n".join(["image,study_id,report_path", f"{film},{film.parent.name},{report}", *extra]) + "\n")
    return index


def test_build_names_its_first_failure_on_the_console(built, tmp_path):
    _, images = built
    index = _index_of_one_study(images, tmp_path, f"{tmp_path / 'gone.jpg'},s9,{tmp_path / 'gone.txt'}")
    r = _run("ils", "build", "--images", images, "--index", index, "--out", tmp_path / "out", "--quiet")
    assert r.exit_code == 0, r.output
    assert f"  first failure: {tmp_path / 'gone.jpg'}: " in r.output, r.output


def test_films_the_index_does_not_name_are_failures_of_the_build(built, tmp_path):
    """A film under --images that no index row names is not used: each is a line of failures.jsonl, counted on the
    card and on the console, and --strict exits 3 for them (a build that dropped them only warned)."""
    _, images = built
    index = _index_of_one_study(images, tmp_path)
    out = tmp_path / "out"
    r = _run("ils", "build", "--images", images, "--index", index, "--out", out, "--quiet", "--strict")
    assert r.exit_code == 3, r.output
    unlisted = sorted(images.rglob("*.jpg"))[1:]
    lines = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [(f["path"], f["stage"]) for f in lines] == [(str(p), "scan") for p in unlisted]
    assert all(f["reason"].startswith(f"film not in the index (no row of {index} names it") for f in lines)
    assert f"(1 processed, 0 already done, {N_STUDIES - 1} failures" in r.output, r.output
    assert f"| input: film not in the index | {N_STUDIES - 1} |" in (out / "card.md").read_text()
    assert r.stderr.splitlines()[-1].startswith(f"Error: the build finished, but {N_STUDIES - 1} studies failed")
    # every film named: no failure, exit 0 with --strict
    rows = [f"{p},{p.parent.name},{p.parent.with_suffix('.txt')}" for p in unlisted]
    index = _index_of_one_study(images, tmp_path, *rows)
    r = _run("ils", "build", "--images", images, "--index", index, "--out", out, "--quiet", "--strict")
    assert r.exit_code == 0 and f"({N_STUDIES - 1} processed, 1 already done, 0 failures" in r.output, r.output


def test_build_with_an_llm_server_that_cannot_be_reached_stops_and_resumes(built, tmp_path):
    from test_structure_llm import FakeLLM

    _, images = built
    index = _index_of_one_study(images, tmp_path)
    out = tmp_path / "out"
    with FakeLLM() as stopped:
        dead = stopped.base_url
    llm = ["--structurer", "llm", "--structurer-opt", "model=m", "--structurer-opt", "max_retries=1"]
    _refused(_run("ils", "build", "--images", images, "--index", index, "--out", out, "--quiet", *llm,
                  "--structurer-opt", f"base_url={dead}"),
             f"the LLM structurer stops: cannot reach {dead}/chat/completions", code=1)
    assert not list((out / "units").glob("*.json")) and not list((out / "units").glob("*.running"))
    # the same build once the server runs (on that port): the study is processed, not a failure kept from the stop
    with FakeLLM(port=int(dead.rsplit(":", 1)[1].split("/")[0])) as server:
        assert server.base_url == dead
        r = _run("ils", "build", "--images", images, "--index", index, "--out", out, "--quiet", *llm,
                 "--structurer-opt", f"base_url={dead}")
    assert r.exit_code == 0 and f"(1 processed, 0 already done, {N_STUDIES - 1} failures" in r.output, r.output
