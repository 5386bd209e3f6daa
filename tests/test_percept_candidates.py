"""`percept candidates`: candidate masks predicted for the CheXpercept candidate instruction (CHEXPERCEPT.md §2),
the instruction recorded per prediction line, and `percept build`'s check of it."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cxrground.errors import OptionError
from cxrground.ils.predictions import load_predictions
from cxrground.ils.schema import load_dataset
from cxrground.models.base import MODELS, IlsOutput
from cxrground.percept.build import BuildOptions, build_benchmark, instruction_warnings
from cxrground.percept.candidate_masks import CandidatesRequest, candidate_jobs, predict_candidates
from cxrground.percept.cases import positive_candidates
from cxrground.vocab.percept_templates import candidate_instruction
from percept_build_helpers import synthetic_ils

ECHO = "echo-instruction-test"


class _EchoModel:
    """Answers with the instruction it was given; the mask is the image's left half."""

    name = ECHO

    def predict_batch(self, images, instructions):
        out = []
        for image, text in zip(images, instructions, strict=True):
            mask = np.zeros(image.pixels.shape[:2], dtype=bool)
            mask[:, : mask.shape[1] // 2] = True
            out.append(IlsOutput(answer=text, mask=mask, presence=1.0, present=True))
        return out


def _echo_module() -> types.SimpleNamespace:
    return types.SimpleNamespace(load_model=lambda folder, device="cpu", **_: _EchoModel())


@pytest.fixture(scope="module")
def echo_checkpoint(tmp_path_factory) -> Iterator[Path]:
    """A checkpoint of the test model, registered for this module only (the registry is the CLI's choices)."""
    MODELS.register(ECHO, _echo_module, help="test model answering with its instruction", replace=True)
    folder = tmp_path_factory.mktemp("echo") / "ckpt"
    folder.mkdir()
    (folder / "checkpoint.json").write_text(json.dumps({"model": ECHO}), encoding="utf-8")
    yield folder
    del MODELS._backends[ECHO]


@pytest.fixture(scope="module")
def ils(tmp_path_factory) -> tuple[Path, Path]:
    return synthetic_ils(tmp_path_factory)


def test_candidate_jobs_ask_the_section_2_instruction_once_per_pair(ils) -> None:
    data = load_dataset(ils[0])
    cands = positive_candidates(data, ("train", "val", "test"))
    jobs = candidate_jobs(cands)
    items = [item for _image, items in jobs for item in items]
    assert len({i["pair_id"] for i in items}) == len(items) == len({c.pair_id for cs in cands.values() for c in cs})
    by_pair = {c.pair_id: c for cs in cands.values() for c in cs}
    for item in items:
        c = by_pair[item["pair_id"]]
        pair = next(p for s in data.values() for st in s.values()
                    for p in st["instruction_answer_pairs"]["positive_pairs"] if p["pair_id"] == c.pair_id)
        assert item["instruction"] == candidate_instruction(c.lesion, pair.get("reported_location") or [])
    # the point of the command: global pairs with a reported location are asked where the report puts it
    differs = [i for i in items if i["instruction"] != next(
        p["instruction"] for s in data.values() for st in s.values()
        for p in st["instruction_answer_pairs"]["positive_pairs"] if p["pair_id"] == i["pair_id"])]
    assert differs, "the synthetic cohort should have candidates whose pair instruction is not §2's"


def test_percept_candidates_writes_the_instruction_and_resumes(ils, echo_checkpoint, tmp_path) -> None:
    ils_dir, images = ils
    out = tmp_path / "cand.jsonl"
    req = CandidatesRequest(checkpoint=echo_checkpoint, ils_dir=ils_dir, images=images, out=out, splits="all",
                            max_candidates=2)
    line = predict_candidates(req, progress=False)
    preds = load_predictions(out)
    cands = positive_candidates(load_dataset(ils_dir), ("train", "val", "test"), 2)
    wanted = {c.pair_id: c.instruction for cs in cands.values() for c in cs}
    assert set(preds) == set(wanted) and f"{len(wanted)} written" in line and "candidates" in line
    for pid, pred in preds.items():
        assert pred.instruction == wanted[pid] == pred.answer  # the model was asked exactly §2's text
    again = predict_candidates(req, progress=False)
    assert f"0 written, {len(wanted)} already there" in again
    side = json.loads(out.with_name(out.name + ".checkpoint.json").read_text(encoding="utf-8"))
    assert side["prompts"] == "chexpercept-candidates" and side["split"] == "train,val,test"
    # another split is another source: refused rather than mixed in
    with pytest.raises(OptionError, match="another split"):
        predict_candidates(CandidatesRequest(checkpoint=echo_checkpoint, ils_dir=ils_dir, images=images, out=out,
                                             splits="train", max_candidates=2), progress=False)


def test_build_warns_when_candidates_were_asked_another_instruction(ils, echo_checkpoint, tmp_path) -> None:
    ils_dir, images = ils
    cands = positive_candidates(load_dataset(ils_dir), ("train", "val", "test"), 2)
    positives = [c for cs in cands.values() for c in cs]
    right = tmp_path / "right.jsonl"
    predict_candidates(CandidatesRequest(checkpoint=echo_checkpoint, ils_dir=ils_dir, images=images, out=right,
                                         splits="all", max_candidates=2), progress=False)
    assert instruction_warnings(right, load_predictions(right), positives) == []
    # the same masks asked the pairs' own instructions (what `ils predict` does) and lines without any
    wrong = tmp_path / "wrong.jsonl"
    data = load_dataset(ils_dir)
    own = {p["pair_id"]: p["instruction"] for s in data.values() for st in s.values()
           for p in st["instruction_answer_pairs"]["positive_pairs"]}
    lines, n_other, n_unknown = [], 0, 0
    wanted = {c.pair_id: c.instruction for c in positives}
    for i, (pid, pred) in enumerate(load_predictions(right).items()):
        obj = {"pair_id": pid, "answer": "x", "mask": dict(pred.rle)}
        if i % 2 == 0:
            obj["instruction"] = own[pid]
            n_other += own[pid] != wanted[pid]
        else:
            n_unknown += 1
        lines.append(json.dumps(obj))
    wrong.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert n_other > 0
    (warning,) = instruction_warnings(wrong, load_predictions(wrong), positives)
    assert f"{n_other} of {len(positives)} candidate masks were predicted for another instruction" in warning
    assert f"and {n_unknown} do not record theirs" in warning and "percept candidates" in warning
    out = tmp_path / "bench"
    summary = build_benchmark(BuildOptions(ils=str(ils_dir), images=str(images), candidates=str(right),
                                           per_lesion=(0, 1, 1), seed=1, max_candidates=2,
                                           splits=("train", "val", "test")), out, progress=False)
    assert not any("§2" in w for w in summary.warnings)
    card = (out / "card.md").read_text(encoding="utf-8")
    assert f"{len(positives)} of {len(positives)} predicted for the §2 candidate instruction" in card


def test_cli_percept_candidates(ils, echo_checkpoint, tmp_path) -> None:
    """The command runs in a fresh process, so the test backend is registered by a plugin-free path: the echo
    checkpoint is refused there (unknown model), naming the registered ones."""
    ils_dir, images = ils
    proc = subprocess.run([sys.executable, "-m", "cxrground", "percept", "candidates", "--checkpoint",
                           str(echo_checkpoint), "--ils", str(ils_dir), "--images", str(images), "--out",
                           str(tmp_path / "c.jsonl"), "--quiet"], capture_output=True, text=True)
    assert proc.returncode != 0 and "unknown model" in proc.stderr and "baseline" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "c.jsonl.checkpoint.json").exists()  # a run that wrote nothing leaves no record
