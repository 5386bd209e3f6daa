"""Bad input to the CheXpercept commands: a clear error naming the file and the reason (no traceback), batch
readers that name each bad line and go on, exports that refuse what ``percept validate`` rejects."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from PIL import Image

from cxrground.cli import main
from cxrground.errors import ConfigError, OptionValueError
from cxrground.evaluation.percept.request import EvalRequest
from cxrground.evaluation.percept.runner import EvalSettings, load_all_results, run_eval
from cxrground.percept.manifest import manifest_lines
from cxrground.percept.request import BuildRequest
from cxrground.percept.schema import load_benchmark
from cxrground.percept.validate import validate_benchmark
from cxrground.testing.mock_bench import make_benchmark
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.percept_templates import PATH_LESION_FREE, PATH_REVISION_FREE, PATH_REVISION_REQUIRED


def cli(*args: str) -> Result:
    """Run ``cxrground ARGS`` in-process (stdout and stderr kept apart)."""
    return CliRunner().invoke(main, list(args))


def clean(res: Result) -> str:
    """Everything the command printed; fails the test on a traceback."""
    text = res.output + (res.stderr if res.stderr_bytes is not None else "")
    assert "Traceback" not in text and not (res.exception and not isinstance(res.exception, SystemExit)), text
    return text


def valid_bench(root: Path) -> Path:
    """A tiny benchmark that ``percept validate`` accepts: the mock one plus image sizes, card and manifest."""
    bench = make_benchmark(root, {"LF": 1, "RF": 1, "RR": 1}, lesions=("edema",), size=8)
    data = json.loads((bench / "chexpercept.json").read_text())
    counts: dict[tuple[str, str], int] = {}
    for key, case in load_benchmark(bench).cases.items():
        with Image.open(bench / str(case.detection_qa.relative_path)) as im:
            data[key]["image_size"] = [im.height, im.width]
        counts[case.lesion_of(key), case.path(key)] = counts.get((case.lesion_of(key), case.path(key)), 0) + 1
    (bench / "chexpercept.json").write_text(json.dumps(data), encoding="utf-8")
    paths = (PATH_LESION_FREE, PATH_REVISION_FREE, PATH_REVISION_REQUIRED)
    rows = ["| " + " | ".join([lesion, *(v for p in paths for v in ("0", str(counts.get((lesion, p), 0))))]) + " |"
            for lesion in LESIONS]
    (bench / "card.md").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (bench / "MANIFEST.sha256").write_text("".join(line + "\n" for line in manifest_lines(bench)), encoding="utf-8")
    assert validate_benchmark(bench) == []
    return bench


def first_image(bench: Path) -> str:
    case = next(iter(load_benchmark(bench).cases.values()))
    return str(case.detection_qa.relative_path)


# --- percept export ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["reference", "hf"])
def test_export_refuses_a_benchmark_validate_rejects(tmp_path, fmt):
    bench = valid_bench(tmp_path / "bench")
    rel = first_image(bench)
    (bench / rel).write_bytes(b"not a png at all")
    res = cli("percept", "export", str(bench), str(tmp_path / "out"), "--format", fmt)
    text = clean(res)
    assert res.exit_code == 1
    assert str(bench) in text and f"image {rel} cannot be read as PNG" in text
    assert f"manifest hash mismatch for {rel}" in text and "--no-validate" in text
    assert not (tmp_path / "out").exists()


def test_export_without_validation_and_of_a_benchmark_without_manifest(tmp_path):
    bench = valid_bench(tmp_path / "bench")
    rel = first_image(bench)
    (bench / rel).write_bytes(b"not a png at all")
    res = cli("percept", "export", str(bench), str(tmp_path / "out"), "--no-validate")
    assert res.exit_code == 0, clean(res)
    # no MANIFEST.sha256 (not made by percept build): checked without the build records, with a note
    loose = make_benchmark(tmp_path / "loose", {"LF": 1, "RF": 1, "RR": 1}, lesions=("edema",))
    res = cli("percept", "export", str(loose), str(tmp_path / "out2"))
    assert res.exit_code == 0, clean(res)
    assert "no MANIFEST.sha256" in res.stderr
    (loose / first_image(loose)).unlink()
    res = cli("percept", "export", str(loose), str(tmp_path / "out3"))
    assert res.exit_code == 1 and "does not exist" in clean(res)


@pytest.mark.parametrize("fmt", ["reference", "hf"])
def test_export_refuses_an_output_inside_or_around_the_benchmark(tmp_path, fmt):
    bench = valid_bench(tmp_path / "bench")
    before = sorted(p.relative_to(bench).as_posix() for p in bench.rglob("*"))
    res = cli("percept", "export", str(bench), str(bench / "sub"), "--format", fmt)
    text = clean(res)
    assert res.exit_code == 1 and "inside the benchmark folder" in text and str(bench / "sub") in text
    res = cli("percept", "export", str(bench), str(tmp_path), "--format", fmt, "--overwrite")
    assert res.exit_code == 1 and "holds the benchmark folder" in clean(res)
    assert sorted(p.relative_to(bench).as_posix() for p in bench.rglob("*")) == before
    assert validate_benchmark(bench) == []


# --- percept gallery -----------------------------------------------------------------------------------------

def test_gallery_shows_and_names_missing_images(tmp_path):
    bench = valid_bench(tmp_path / "bench")
    rel = first_image(bench)
    (bench / rel).unlink()
    out = tmp_path / "g.html"
    res = cli("percept", "gallery", str(bench), "--out", str(out))
    assert res.exit_code == 0, clean(res)
    assert rel in res.stderr and "missing" in res.stderr
    page = out.read_text()
    assert f"image {rel} is missing" in page
    assert f"src='{Path('bench', rel).as_posix()}'" not in page


# --- percept build -------------------------------------------------------------------------------------------

@pytest.fixture
def tiny_ils(tmp_path) -> tuple[Path, Path]:
    """(dataset JSON, image root): one train study without pairs; val and test empty."""
    folder = tmp_path / "ils"
    (folder / "imgs").mkdir(parents=True)
    study = {"dicom_id": "d1", "image_path": "x.jpg",
             "instruction_answer_pairs": {"positive_pairs": [], "negative_pairs": []}}
    (folder / "ils.json").write_text(json.dumps({"train": {"s1": study}, "val": {}, "test": {}}))
    (folder / "anatomy.jsonl").write_text("")
    return folder / "ils.json", folder / "imgs"


def test_build_names_anatomy_and_a_failed_input_check_leaves_no_settings_to_block_the_corrected_rerun(tiny_ils,
                                                                                                        tmp_path):
    ils, images = tiny_ils
    anatomy = tmp_path / "anatomy.jsonl"
    (ils.parent / "anatomy.jsonl").rename(anatomy)
    out = tmp_path / "bench"
    base = ("percept", "build", "--ils", str(ils), "--images", str(images), "--out", str(out), "--split", "train")
    res = cli(*base)
    text = clean(res)
    assert res.exit_code == 1 and "anatomy.jsonl" in text and "--anatomy" in text, text
    review = tmp_path / "review.jsonl"
    review.write_text("{not json\n")
    res = cli(*base, "--anatomy", str(anatomy), "--review", str(review))
    assert res.exit_code == 1 and str(review) in clean(res), clean(res)
    assert not (out / ".work" / "settings.json").exists()
    res = cli(*base, "--anatomy", str(anatomy))
    assert "unfinished build" not in clean(res), clean(res)


@pytest.mark.parametrize("split", ["bogus", "val", "train,bogus"])
def test_build_refuses_a_split_without_studies(tiny_ils, tmp_path, split):
    ils, images = tiny_ils
    out = tmp_path / "bench"
    res = cli("percept", "build", "--ils", str(ils), "--images", str(images), "--out", str(out), "--split", split)
    text = clean(res)
    assert res.exit_code == 1 and str(ils) in text and "its splits: train (1 study)" in text
    assert not out.exists()


def test_build_without_candidates_warns(tiny_ils, tmp_path):
    ils, images = tiny_ils
    for split in ("train", "all"):
        res = cli("percept", "build", "--ils", str(ils), "--images", str(images), "--out", str(tmp_path / split),
                  "--split", split)
        assert res.exit_code == 0, clean(res)
        assert "warning: no candidate" in res.stderr and "the benchmark is empty" in res.stderr


@pytest.mark.parametrize(("option", "value"), [("--max-candidates", "-1"), ("--max-negatives", "-3"),
                                               ("--workers", "0"), ("--workers", "-2"), ("--rf-ratio", "1.5")])
def test_build_refuses_counts_below_their_minimum(tiny_ils, tmp_path, option, value):
    ils, images = tiny_ils
    res = cli("percept", "build", "--ils", str(ils), "--images", str(images), "--out", str(tmp_path / "b"), option,
              value)
    assert res.exit_code == 2 and option in clean(res) and value in res.output
    assert not (tmp_path / "b").exists()


def test_requests_check_their_ranges(tmp_path):
    with pytest.raises(OptionValueError, match="--max-candidates must be >= 0"):
        BuildRequest(ils_dir=tmp_path, images=tmp_path, out=tmp_path, max_candidates=-1)
    with pytest.raises(OptionValueError, match="--workers must be >= 1"):
        BuildRequest(ils_dir=tmp_path, images=tmp_path, out=tmp_path, workers=0)
    with pytest.raises(OptionValueError, match="--max-tokens must be >= 1"):
        EvalRequest(bench=tmp_path, spec="random", out=tmp_path, max_tokens=-5)
    with pytest.raises(OptionValueError, match="--timeout must be > 0"):
        EvalRequest(bench=tmp_path, spec="random", out=tmp_path, timeout=0)
    bench = make_benchmark(tmp_path / "bench", {"LF": 1}, lesions=("edema",))
    for field, value in (("max_tokens", -5), ("max_images", 0)):
        with pytest.raises(ConfigError, match=f"--{field.replace('_', '-')} must be >= 1"):
            run_eval(EvalSettings(bench=bench, model="random", **{field: value}), tmp_path / "run", progress=False)


# --- percept eval / score / report ---------------------------------------------------------------------------

@pytest.mark.parametrize(("option", "value"), [("--max-images", "0"), ("--max-tokens", "-5"), ("--concurrency", "0"),
                                               ("--max-attempts", "0"), ("--timeout", "0")])
def test_eval_refuses_values_below_their_minimum(tmp_path, option, value):
    bench = make_benchmark(tmp_path / "bench", {"LF": 1}, lesions=("edema",))
    res = cli("percept", "eval", "--bench", str(bench), "--model", "random", "--out", str(tmp_path / "run"),
              "--no-progress", option, value)
    assert res.exit_code == 2 and option in clean(res)
    assert not (tmp_path / "run").exists()


def test_eval_names_a_cache_file_that_is_no_database(tmp_path):
    bench = make_benchmark(tmp_path / "bench", {"LF": 1}, lesions=("edema",))
    cache = tmp_path / "notes.txt"
    cache.write_text("a radiology report, not a database\n" * 200)
    res = cli("percept", "eval", "--bench", str(bench), "--model", "random", "--out", str(tmp_path / "run"),
              "--no-progress", "--cache", str(cache))
    text = clean(res)
    assert res.exit_code == 1 and str(cache) in text and "not a readable SQLite response cache" in text
    assert not (tmp_path / "run").exists()
    assert cache.read_text().startswith("a radiology report")


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A finished oracle run over 4 cases (one result line each)."""
    bench = make_benchmark(tmp_path / "bench", {"LF": 1, "RF": 1}, lesions=("edema", "cardiomegaly"))
    res = cli("percept", "eval", "--bench", str(bench), "--model", "oracle", "--oracle", "none", "--out",
              str(tmp_path / "run"), "--no-progress")
    assert res.exit_code == 0, clean(res)
    assert len((tmp_path / "run" / "results.jsonl").read_text().splitlines()) == 4
    return tmp_path / "run"


def lines_of(run: Path) -> list[str]:
    return (run / "results.jsonl").read_text().splitlines()


def score(run: Path) -> tuple[Result, dict]:
    res = cli("percept", "score", str(run), "--bootstrap", "0")
    clean(res)
    assert res.exit_code == 0, res.output
    return res, json.loads((run / "score.json").read_text())


def test_score_names_a_malformed_line_and_counts_its_case_failed(run_dir):
    lines = lines_of(run_dir)
    lines[1] = '{"case_id": broken'
    (run_dir / "results.jsonl").write_text("\n".join(lines) + "\n")
    res, s = score(run_dir)
    where = f"{run_dir / 'results.jsonl'}:2"
    assert f"warning: {where}: invalid JSON" in res.stderr
    assert s["missing_cases"] == [] and len(s["failed_cases"]) == 1 and s["bad_lines"][0].startswith(where)
    assert "unreadable result lines: 1" in res.stderr


def test_score_names_rows_with_invalid_fields(run_dir):
    recs = [json.loads(x) for x in lines_of(run_dir)]
    del recs[1]["questions"]
    recs[2]["questions"][0]["correct"] = "maybe"
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    res, s = score(run_dir)
    path = run_dir / "results.jsonl"
    assert f"{path}:2: no questions list" in res.stderr
    assert f"{path}:3: question 1 (detection): correct is 'maybe'" in res.stderr
    assert s["failed_cases"] == sorted([recs[1]["case_id"], recs[2]["case_id"]]) and s["missing_cases"] == []


def test_score_reads_non_utf8_and_array_lines_without_traceback(run_dir):
    lines = lines_of(run_dir)
    data = ("\n".join(lines[:3]) + "\n").encode() + b"\xff\xfe garbage \x00\n" + (lines[3] + "\n").encode()
    (run_dir / "results.jsonl").write_bytes(data + b"[1, 2]\n")
    res, s = score(run_dir)
    assert f"{run_dir / 'results.jsonl'}:4: not UTF-8" in res.stderr
    assert f"{run_dir / 'results.jsonl'}:6: not a result record (a JSON object) but an array" in res.stderr
    assert s["failed_cases"] == [] and s["missing_cases"] == [] and len(s["bad_lines"]) == 2


def test_a_torn_last_line_stays_missing_and_a_complete_one_is_kept(run_dir):
    lines = lines_of(run_dir)
    (run_dir / "results.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])
    res, s = score(run_dir)
    assert len(s["missing_cases"]) == 1 and s["failed_cases"] == [] and "cut short" in res.stderr
    (run_dir / "results.jsonl").write_text("\n".join(lines))  # every line whole, no newline at the end
    bench = Path(json.loads((run_dir / "config.json").read_text())["config"]["bench"])
    summary = run_eval(EvalSettings(bench=bench, model="oracle", oracle="none"), run_dir, progress=False)
    assert summary["n_run"] == 0 and len(load_all_results(run_dir)) == 4


@pytest.mark.parametrize(("name", "content", "reason"), [
    ("config.json", '{"config": 5}', "not a run configuration"),
    ("config.json", b"\xff\xfe\x00", "not UTF-8"),
    ("config.json", '{"config": {"model": "m", "oracle": "none", "repeats": "two"}}', "repeats"),
    ("cases.json", '{"a": 1}', "not a list of case plans"),
    ("cases.json", '[{"case_id": "x", "lesion": "edema", "path": "RR", "questions": [{"qid": 1}]}]', "case plan 1"),
])
def test_score_and_report_name_an_invalid_run_file(run_dir, tmp_path, name, content, reason):
    cli("percept", "score", str(run_dir), "--bootstrap", "0")  # a score.json to reuse
    target = run_dir / name
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    for args in (["score", str(run_dir)], ["report", str(run_dir), "--out", str(tmp_path / "r.html")]):
        res = cli("percept", *args, "--bootstrap", "0")
        text = clean(res)
        assert res.exit_code == 1 and f"{target}:" in text and reason in text
    assert not (tmp_path / "r.html").exists()


def test_report_refuses_a_run_without_config_even_with_a_score(run_dir, tmp_path):
    other = tmp_path / "copy"
    shutil.copytree(run_dir, other)
    cli("percept", "score", str(other), "--bootstrap", "0")
    (other / "config.json").unlink()
    res = cli("percept", "report", str(run_dir), str(other), "--out", str(tmp_path / "r.html"), "--bootstrap", "0")
    text = clean(res)
    assert res.exit_code == 1 and str(other / "config.json") in text
    assert not (tmp_path / "r.html").exists()


def test_report_names_unreadable_lines_and_rescores_a_broken_score_file(run_dir, tmp_path):
    lines = lines_of(run_dir)
    lines.insert(2, "[]")
    (run_dir / "results.jsonl").write_text("\n".join(lines) + "\n")
    cli("percept", "score", str(run_dir), "--bootstrap", "0")
    (run_dir / "score.json").write_text('{"run": 3}')  # newer than the results, but unusable: scored again
    out = tmp_path / "r.html"
    res = cli("percept", "report", str(run_dir), "--out", str(out), "--bootstrap", "0")
    assert res.exit_code == 0, clean(res)
    assert f"{run_dir / 'results.jsonl'}:3" in res.stderr
    assert "unreadable result lines" in out.read_text() and "results.jsonl:3" in out.read_text()


def test_eval_names_an_invalid_config_of_the_run_it_resumes(run_dir):
    bench = json.loads((run_dir / "config.json").read_text())["config"]["bench"]
    for content in ("{not json", "[1]", '{"config": 5}'):
        (run_dir / "config.json").write_text(content)
        res = cli("percept", "eval", "--bench", bench, "--model", "oracle", "--oracle", "none", "--out", str(run_dir),
                  "--no-progress")
        assert res.exit_code == 1 and f"{run_dir / 'config.json'}:" in clean(res)
