"""``ils predict --mode teacher-forced|free`` (issue 12 item 4): the mode is recorded, ``ils evaluate`` reports it."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from cxrground.errors import ConfigError, InputError  # noqa: E402
from cxrground.evaluation.ils import evaluate_dataset, format_report  # noqa: E402
from cxrground.ils.predictions import load_predictions  # noqa: E402
from cxrground.io.image import read_image  # noqa: E402
from cxrground.models.lisa.config import LisaConfig  # noqa: E402
from cxrground.models.lisa.model import LisaForSegmentation, tiny_arch  # noqa: E402
from cxrground.models.lisa.text import seg_token_id, tiny_tokenizer  # noqa: E402

LIMIT = 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny synthetic ILS dataset and a tiny random LISA checkpoint folder."""
    from click.testing import CliRunner

    from cxrground.cli import main
    from cxrground.models.lisa.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("modes")
    runner = CliRunner()
    r = runner.invoke(main, ["synth", "--out", str(root / "cohort"), "--studies", "4", "--seed", "1"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["ils", "build", "--images", str(root / "cohort" / "files"), "--out", str(root / "ils"),
                             "--seed", "0"])
    assert r.exit_code == 0, r.output
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = LisaForSegmentation(tiny_arch(len(tok), 64), seg_token_id(tok))
    config = LisaConfig.tiny_defaults(max_new_tokens=6)
    save_checkpoint(root / "ckpt", model, tok, {"arch": model.arch, "config": config.to_dict(), "select_layer": -2})
    data = json.loads((root / "ils" / "mimic_ils_instruction_answer.json").read_text())
    split = next(s for s in ("test", "val", "train") if data.get(s))
    return root, split, data


def _pairs(data, split):
    out = []
    for study in data[split].values():
        pairs = study["instruction_answer_pairs"]
        out += [(study, p) for p in pairs["positive_pairs"] + pairs["negative_pairs"]]
    return out[:LIMIT]


def test_teacher_forced_predictions_record_their_mode_and_evaluate_reports_it(setup, tmp_path):
    from cxrground.models.base import load_model
    from cxrground.models.lisa.infer import teacher_forced_masks
    from cxrground.models.predict import predict_split

    root, split, data = setup
    images = root / "cohort" / "files"
    model = load_model(root / "ckpt")
    out = tmp_path / "tf.jsonl"
    counts = predict_split(model, root / "ils", images, split, out, limit=LIMIT, progress=False, batch_size=1,
                           mode="teacher-forced")  # batch 1: the same float path as the one-pair calls below
    assert counts["written"] == LIMIT
    preds = load_predictions(out)
    assert {p.seg_mode for p in preds.values()} == {"teacher-forced"}
    for study, pair in _pairs(data, split):
        image = read_image(images / study["image_path"])
        want = teacher_forced_masks(model.model, model.tokenizer, model.config,
                                    [(image.pixels, pair["instruction"], pair["answer"])])[0]
        got = preds[pair["pair_id"]].mask_array(image.shape)
        assert np.array_equal(got, want)
        assert preds[pair["pair_id"]].answer == model.predict(image, pair["instruction"]).answer
    result = evaluate_dataset(root / "ils", out, split=split, limit=LIMIT, n_boot=0)
    assert result["seg_mode"] == "teacher-forced"
    assert "segmentation mode: teacher-forced" in format_report(result)
    with pytest.raises(InputError, match="teacher-forced"):
        evaluate_dataset(root / "ils", out, split=split, limit=LIMIT, n_boot=0, seg_mode="free")
    # one file, one mode: appending free predictions to it is refused
    with pytest.raises(InputError, match="segmentation mode"):
        predict_split(model, root / "ils", images, split, out, limit=LIMIT + 2, progress=False, mode="free")


def test_free_mode_cli_and_a_backend_without_teacher_forcing(setup, tmp_path):
    from click.testing import CliRunner

    import cxrground.cli.ils_model_cmds  # noqa: F401
    from cxrground.cli import main
    from cxrground.models.predict import predict_split

    root, split, _ = setup
    images = root / "cohort" / "files"
    out = tmp_path / "free.jsonl"
    res = CliRunner().invoke(main, ["ils", "predict", "--checkpoint", str(root / "ckpt"), "--dataset",
                                    str(root / "ils"), "--images", str(images), "--split", split, "--out", str(out),
                                    "--limit", "3", "--mode", "free", "--quiet"])
    assert res.exit_code == 0, res.output
    assert "mode free" in res.output
    assert {p.seg_mode for p in load_predictions(out).values()} == {"free"}
    assert evaluate_dataset(root / "ils", out, split=split, limit=3, n_boot=0)["seg_mode"] == "free"

    class NoTeacher:
        name = "baseline"

        def predict_batch(self, images, instructions):
            raise AssertionError("not reached")

    with pytest.raises(ConfigError, match="teacher-forced"):
        predict_split(NoTeacher(), root / "ils", images, split, tmp_path / "x.jsonl", mode="teacher-forced",
                      progress=False)
