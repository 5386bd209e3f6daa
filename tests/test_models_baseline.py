"""The CPU baseline ILS model: instruction parsing, conditioning, network, training, resume, predict, CLI."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cxrground.datasets.synthetic import write_cohort
from cxrground.datasets.synthetic.config import SynthConfig
from cxrground.errors import ConfigError, InputError
from cxrground.vocab.ils_templates import INSTRUCTION_TYPES, TENTATIVE_WORD, instruction, parse_instruction
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.locations import ILS_LOCATION_LABELS

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from cxrground.cli import main  # noqa: E402
from cxrground.evaluation.ils import evaluate_dataset, parse_answer, question_type  # noqa: E402
from cxrground.ils.predictions import load_predictions  # noqa: E402
from cxrground.io.image import read_image  # noqa: E402
from cxrground.models import baseline  # noqa: E402
from cxrground.models.base import load_model, model_module  # noqa: E402
from cxrground.models.baseline.conditioning import COND_DIM, encode, parse, render_answer  # noqa: E402
from cxrground.models.baseline.config import BaselineConfig  # noqa: E402
from cxrground.models.baseline.data import PairTensors, load_pairs  # noqa: E402
from cxrground.models.baseline.net import build_net  # noqa: E402
from cxrground.models.baseline.training import compute_loss  # noqa: E402

TINY = {"size": "32", "channels": "8,16", "cond_hidden": "16", "head_hidden": "16", "batch_size": "8",
        "warmup_steps": "2"}


# --- instruction parsing (vocab) -----------------------------------------------------------------

def _location_lists():
    labels = list(ILS_LOCATION_LABELS)
    yield from ([a] for a in labels)
    yield from ([a, b] for a, b in itertools.permutations(labels, 2))
    yield from ([a, b, c] for a, b, c in itertools.combinations(labels, 3))


def test_parse_instruction_inverts_every_template():
    n = 0
    for target in LESIONS:
        text = instruction("global", target)
        p = parse_instruction(text)
        assert (p.kind, p.target, p.locations) == ("global", target, [])
        assert instruction(p.kind, p.target) == text
        for locs in _location_lists():
            for kind in ("basic", "lesion_inference"):
                text = instruction(kind, target, locs)
                p = parse_instruction(text)
                expected_target = target if kind == "basic" else TENTATIVE_WORD
                assert (p.kind, p.target, p.locations) == (kind, expected_target, locs), text
                assert instruction(p.kind, p.target, p.locations) == text
                n += 1
    assert n == len(LESIONS) * 2 * (10 + 90 + 120)


@pytest.mark.parametrize("text", ["", "Segment the lungs", "Describe the opacity.", "segment the opacity.",
                                  "Segment the opacity in the right lung and predict its type"])
def test_parse_instruction_rejects_non_templates(text):
    assert parse_instruction(text) is None


def test_parse_rejects_unknown_lesion_or_label():
    with pytest.raises(InputError, match="unknown lesion"):
        parse("Segment the nodule in the right lung.")
    with pytest.raises(InputError, match="unknown location"):
        parse("Segment the edema in the right lung apex.")
    with pytest.raises(InputError, match="template"):
        parse("What is this?")


# --- conditioning --------------------------------------------------------------------------------

def test_condition_vector_layout():
    vec = encode(parse("Segment the opacity in the right lung base and left lung and predict its type."))
    assert vec.shape == (COND_DIM,) == (20,)
    lesion, loc, kind = vec[:7], vec[7:17], vec[17:]
    assert lesion.tolist() == [1.0 if name == "opacity" else 0.0 for name in LESIONS]
    assert loc.tolist() == [1.0 if name in ("right lung base", "left lung") else 0.0 for name in ILS_LOCATION_LABELS]
    assert kind.tolist() == [0.0, 0.0, 1.0] and INSTRUCTION_TYPES[2] == "lesion_inference"
    glob = encode(parse("Segment the cardiomegaly."))
    assert glob[:7].tolist() == [1.0] + [0.0] * 6 and glob[7:17].sum() == 0 and glob[17:].tolist() == [0, 1, 0]


def test_rendered_answers_parse_like_the_dataset():
    p = parse("Segment the opacity in the left lung base and predict its type.")
    ans = render_answer(p, True, "edema", "tentative")
    assert ans == "[SEG] It possibly reflects edema."
    assert parse_answer(ans, "lesion_inference").presence == "tentative"
    assert render_answer(p, False) == "[SEG] There is no opacity in the left lung base."
    g = parse("Segment the pneumonia.")
    assert render_answer(g, True, locations=["right lung base", "left lung base"]) == \
        "[SEG] It is located in the right lung base and left lung base."
    assert render_answer(parse("Segment the cardiomegaly."), True, locations=["right lung"]) == "[SEG]"
    assert render_answer(g, False) == "[SEG] There is no pneumonia."


def test_config_overrides_parse_and_reject():
    cfg = BaselineConfig().with_overrides({"size": "64", "channels": "8,16,32", "lr": "0.01"})
    assert (cfg.size, cfg.channels, cfg.lr) == (64, (8, 16, 32), 0.01)
    assert BaselineConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown baseline setting"):
        BaselineConfig().with_overrides({"epochz": "3"})
    with pytest.raises(ConfigError, match="divisible"):
        BaselineConfig(size=30, channels=(8, 16, 32))


# --- network -------------------------------------------------------------------------------------

def _fake_batch(n: int = 4, size: int = 32) -> dict:
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(n, size, size)
    mask[: n // 2, 8:20, 6:14] = 1.0
    instr = ["Segment the pneumonia in the right lung.", "Segment the opacity in the left lung and predict its type.",
             "Segment the effusion.", "Segment the edema in the right lung base."]
    return {
        "image": torch.randn(n, 1, size, size, generator=g),
        "anatomy": (torch.rand(n, 12, size, size, generator=g) > 0.5).float(),
        "cond": torch.from_numpy(np.stack([encode(parse(t)) for t in instr[:n]])),
        "mask": mask,
        "presence": (mask.flatten(1).sum(1) > 0).float(),
        "li_lesion": torch.tensor([-1, 2, -1, -1][:n]),
        "certainty": torch.tensor([-1, 0, -1, -1][:n]),
        "location": torch.zeros(n, 10).index_fill_(1, torch.tensor([0]), 1.0),
        "location_valid": mask.flatten(1).sum(1) > 0,
    }


def test_forward_shapes():
    cfg = BaselineConfig().with_overrides(TINY)
    torch.manual_seed(0)
    out = build_net(cfg)(*(_fake_batch()[k] for k in ("image", "anatomy", "cond")))
    assert out["mask"].shape == (4, 32, 32)
    assert out["presence"].shape == (4,)
    assert out["lesion"].shape == (4, 3) and out["certainty"].shape == (4, 2) and out["location"].shape == (4, 10)


def test_loss_decreases_on_a_fixed_batch():
    cfg = BaselineConfig().with_overrides(TINY)
    torch.manual_seed(0)
    net = build_net(cfg)
    batch = _fake_batch()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        loss, parts = compute_loss(net(batch["image"], batch["anatomy"], batch["cond"]), batch, cfg)
        assert set(parts) == {"bce", "dice", "presence", "lesion", "certainty", "location"}
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.8 * losses[0]


# --- training on a tiny synthetic dataset --------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 6-study synthetic cohort (images under cohort/files) and its ILS dataset (ils/)."""
    root = tmp_path_factory.mktemp("baseline")
    write_cohort(root / "cohort", 6, seed=0, config=SynthConfig(width=128), progress=False)
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(root / "cohort" / "files"),
                                       "--out", str(root / "ils"), "--quiet", "--seed", "0"])
    assert result.exit_code == 0, result.output
    return root


def _train(tiny: Path, out: Path, seed: int = 0, epochs: int = 1, **kwargs) -> Path:
    return baseline.train(tiny / "ils", out, images=tiny / "cohort" / "files", seed=seed,
                          overrides={**TINY, "epochs": str(epochs)}, progress=False, log=None, **kwargs)


def _weights(path: Path, name: str = "weights_last.safetensors") -> dict:
    return safetensors_torch.load_file(str(path / name))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory) -> Path:
    return _train(tiny, tmp_path_factory.mktemp("ck") / "ckpt", epochs=2)


def test_dataset_cache_has_working_size_tensors(tiny):
    cfg = BaselineConfig().with_overrides(TINY)
    pairs = load_pairs(tiny / "ils", "train")
    data = PairTensors(pairs, tiny / "cohort" / "files", cfg, None, progress=False)
    assert len(data) == len(pairs) and data.positives and data.negatives
    b = data.batch(data.positives[:2] + data.negatives[:1])
    assert b["image"].shape == (3, 1, 32, 32) and b["anatomy"].shape == (3, 12, 32, 32)
    assert b["mask"][:2].flatten(1).sum(1).min() > 0 and b["mask"][2].sum() == 0
    assert b["presence"].tolist() == [1.0, 1.0, 0.0]


def test_checkpoint_contents(trained, tiny):
    info = json.loads((trained / "checkpoint.json").read_text())
    assert info["model"] == "baseline" and info["epoch"] == 2 and len(info["history"]) == 2
    assert info["config"]["size"] == 32 and info["seed"] == 0
    import hashlib
    sha = hashlib.sha256((tiny / "ils" / "mimic_ils_instruction_answer.json").read_bytes()).hexdigest()
    assert info["dataset"]["sha256"] == sha
    assert info["created_by"].startswith("cxrground ")
    assert all((trained / n).is_file() for n in ("weights.safetensors", "weights_last.safetensors", "train_state.pt"))


def test_predict_gives_native_masks_and_parseable_answers(trained, tiny):
    model = load_model(trained)
    assert model.name == "baseline"
    pairs = load_pairs(tiny / "ils", "train")[:6]
    image = read_image(tiny / "cohort" / "files" / pairs[0].image_path)
    same = [p for p in pairs if p.image_path == pairs[0].image_path]
    outs = model.predict_batch([image] * len(same), [p.instruction for p in same])
    for pair, out in zip(same, outs, strict=True):
        assert out.mask.shape == image.shape and out.mask.dtype == bool
        assert out.answer.startswith("[SEG]")
        qtype = question_type(pair.instruction)
        assert qtype == pair.kind == out.kind
        parsed = parse_answer(out.answer, qtype)
        if not out.present:
            assert not out.mask.any() and parsed.presence == "absent"
        else:
            assert parsed.presence != "absent"
    single = model.predict(image, same[0].instruction)
    assert single.answer == outs[0].answer and np.array_equal(single.mask, outs[0].mask)


def _canvas_labels() -> dict[str, np.ndarray]:
    from cxrground.anatomy.ils_locations import ils_location_masks
    right, left = np.zeros((100, 100), bool), np.zeros((100, 100), bool)
    right[10:91, 10:41] = True  # rows 10..90: upper <= 36.7, mid <= 63.3, base > 63.3, apical <= 27.6
    left[10:91, 60:91] = True
    return ils_location_masks(right, left)


def _blob(*boxes: tuple[int, int, int, int]) -> np.ndarray:
    m = np.zeros((100, 100), bool)
    for y0, y1, x0, x1 in boxes:
        m[y0:y1, x0:x1] = True
    return m


@pytest.mark.parametrize(("boxes", "expected"), [
    ([(70, 88, 15, 35)], ["right lung base"]),
    ([(40, 60, 65, 85), (33, 40, 65, 85)], ["left mid zone lung"]),  # dominant zone; a spill-over is not named
    ([(12, 24, 15, 35)], ["right apical zone lung"]),
    ([(12, 34, 15, 35)], ["right upper zone lung"]),  # upper zone not mostly apical
    ([(65, 90, 62, 90), (75, 90, 20, 40)], ["right lung base", "left lung base"]),  # right before left
    ([(10, 91, 60, 91)], ["left upper zone lung", "left mid zone lung", "left lung base"]),  # whole lung: zones
    ([(45, 60, 12, 40), (70, 72, 80, 84)], ["right mid zone lung"]),  # < 15 % on the left: side not named
    ([(0, 5, 45, 55)], []),  # outside both lungs
    ([], []),
])
def test_mask_locations_rule(boxes, expected):
    from cxrground.models.baseline.model import mask_locations
    assert mask_locations(_blob(*boxes), _canvas_labels()) == expected


def test_global_location_switch(trained, tiny):
    from cxrground.models.baseline.model import load_model as load_baseline
    with pytest.raises(ConfigError, match="global_location"):
        BaselineConfig(global_location="box")
    assert BaselineConfig().global_location == "mask"
    head = load_baseline(trained, overrides={"global_location": "head"})
    mask = load_baseline(trained)
    assert (head.config.global_location, mask.config.global_location) == ("head", "mask")
    pairs = load_pairs(tiny / "ils", "train")[:8]
    images = [read_image(tiny / "cohort" / "files" / p.image_path) for p in pairs]
    for p, a, b in zip(pairs, head.predict_batch(images, [p.instruction for p in pairs]),
                       mask.predict_batch(images, [p.instruction for p in pairs]), strict=True):
        assert np.array_equal(a.mask, b.mask) and a.present == b.present
        if p.kind != "global":
            assert a.answer == b.answer


def test_same_seed_same_weights_other_seed_differs(tiny, tmp_path):
    a = _weights(_train(tiny, tmp_path / "a", seed=3))
    b = _weights(_train(tiny, tmp_path / "b", seed=3))
    c = _weights(_train(tiny, tmp_path / "c", seed=4))
    assert _same(a, b)
    assert not _same(a, c)


def test_resume_after_kill_equals_uninterrupted_run(trained, tiny, tmp_path):
    out = tmp_path / "resumed"
    _train(tiny, out, epochs=2, stop_after_epoch=1)
    assert json.loads((out / "checkpoint.json").read_text())["epoch"] == 1
    assert not _same(_weights(out), _weights(trained))
    _train(tiny, out, epochs=2)
    info = json.loads((out / "checkpoint.json").read_text())
    assert info["epoch"] == 2 and len(info["history"]) == 2
    assert _same(_weights(out), _weights(trained))
    assert _same(_weights(out, "weights.safetensors"), _weights(trained, "weights.safetensors"))


class _Kill(Exception):
    """Stands for the process being killed."""


def _optimizer_tensors(path: Path) -> list:
    state = torch.load(path / "train_state.pt", weights_only=True)["optimizer"]["state"]
    return [t for k in sorted(state) for _, t in sorted(state[k].items()) if torch.is_tensor(t)]


@pytest.fixture(scope="module")
def trained_no_val(tiny, tmp_path_factory) -> Path:
    """Two epochs without a validation split: every epoch end writes all four checkpoint files."""
    return _train(tiny, tmp_path_factory.mktemp("ck") / "noval", epochs=2, val_split=None)


@pytest.mark.parametrize("kill_before_write", [5, 6, 7, 8])
def test_resume_is_exact_at_every_kill_point_of_the_epoch_end_save(trained_no_val, tiny, tmp_path, monkeypatch,
                                                                   kill_before_write):
    """A kill between any two files written at the end of epoch 2 (4 writes per epoch) resumes exactly."""
    from cxrground.models.baseline import training

    real, calls = training._atomic, []

    def dying(path, write):
        calls.append(path.name)
        if len(calls) == kill_before_write:
            raise _Kill(path.name)
        real(path, write)

    out = tmp_path / "killed"
    monkeypatch.setattr(training, "_atomic", dying)
    with pytest.raises(_Kill):
        _train(tiny, out, epochs=2, val_split=None)
    assert len(calls) == kill_before_write
    monkeypatch.setattr(training, "_atomic", real)
    _train(tiny, out, epochs=2, val_split=None)
    info = json.loads((out / "checkpoint.json").read_text())
    assert info["epoch"] == 2 and [h["epoch"] for h in info["history"]] == [1, 2]
    for name in ("weights_last.safetensors", "weights.safetensors"):
        assert _same(_weights(out, name), _weights(trained_no_val, name)), name
    mine, ref = _optimizer_tensors(out), _optimizer_tensors(trained_no_val)
    assert len(mine) == len(ref) > 0 and all(torch.equal(a, b) for a, b in zip(mine, ref, strict=True))


def test_resume_from_a_train_state_without_the_record(trained, tiny, tmp_path):
    """A checkpoint written before train_state.pt held the record resumes from checkpoint.json + weights_last."""
    out = tmp_path / "old"
    _train(tiny, out, epochs=2, stop_after_epoch=1)
    state = torch.load(out / "train_state.pt", weights_only=True)
    torch.save({k: state[k] for k in ("optimizer", "torch_rng", "epoch")}, out / "train_state.pt")
    _train(tiny, out, epochs=2)
    assert _same(_weights(out), _weights(trained))
    assert _same(_weights(out, "weights.safetensors"), _weights(trained, "weights.safetensors"))


def test_resume_refuses_other_dataset_or_config(trained, tiny, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(trained, ck)
    ds = tmp_path / "ds"
    shutil.copytree(tiny / "ils", ds)
    json_path = ds / "mimic_ils_instruction_answer.json"
    json_path.write_text(json_path.read_text() + "\n")
    with pytest.raises(ConfigError, match="dataset file"):
        baseline.train(ds, ck, images=tiny / "cohort" / "files", overrides={**TINY, "epochs": "3"},
                       progress=False, log=None)
    with pytest.raises(ConfigError, match="configuration"):
        baseline.train(tiny / "ils", ck, images=tiny / "cohort" / "files",
                       overrides={**TINY, "epochs": "3", "lr": "0.1"}, progress=False, log=None)
    with pytest.raises(ConfigError, match="seed"):
        _train(tiny, ck, seed=9, epochs=2)
    # a checkpoint written before ``global_location`` existed, or resumed with another (inference-only) value
    info = json.loads((ck / "checkpoint.json").read_text())
    del info["config"]["global_location"]
    (ck / "checkpoint.json").write_text(json.dumps(info))
    assert _train(tiny, ck, epochs=2) == ck
    baseline.train(tiny / "ils", ck, images=tiny / "cohort" / "files",
                   overrides={**TINY, "epochs": "2", "global_location": "head"}, progress=False, log=None)


def test_checkpoints_keep_the_lungs_they_were_trained_with(trained, tiny, tmp_path):
    from cxrground.anatomy.segment.builtin import default_weights_path

    info = json.loads((trained / "checkpoint.json").read_text())
    shipped = json.loads(default_weights_path().with_suffix(".json").read_text())
    assert info["lungs"] == {"name": shipped["name"], "sha256": shipped["sha256"]}
    ck = tmp_path / "ck"
    shutil.copytree(trained, ck)
    info["lungs"] = {"name": "lung_unet_v0", "sha256": "0" * 64}
    (ck / "checkpoint.json").write_text(json.dumps(info))
    with pytest.raises(ConfigError, match="trained with the lung U-Net lung_unet_v0"):
        baseline.load_model(ck)
    state = torch.load(ck / "train_state.pt", weights_only=True)  # the record a resume reads
    state["meta"]["lungs"] = info["lungs"]
    torch.save(state, ck / "train_state.pt")
    with pytest.raises(ConfigError, match="lung_unet_v0"):
        _train(tiny, ck, epochs=2)
    # the weights it was trained with, named explicitly: another lung file is another configuration
    older = default_weights_path().with_name("lung_unet_v1.safetensors")
    with pytest.raises(ConfigError, match="configuration"):
        baseline.train(tiny / "ils", trained, images=tiny / "cohort" / "files",
                       overrides={**TINY, "epochs": "3", "lung_weights": str(older)}, progress=False, log=None)
    del info["lungs"]  # a checkpoint written before the record: loaded with the configured lungs
    (ck / "checkpoint.json").write_text(json.dumps(info))
    assert baseline.load_model(ck).segmenter is not None


def test_model_module_dispatch():
    assert model_module("baseline") is baseline
    with pytest.raises(ConfigError, match="unknown model"):
        model_module("nope")


# --- CLI: train, predict (resumable, failures), evaluate ----------------------------------------

def test_cli_train_predict_evaluate(tiny, tmp_path):
    runner = CliRunner()
    ck, pred = tmp_path / "ck", tmp_path / "pred.jsonl"
    images = str(tiny / "cohort" / "files")
    sets = [a for k, v in {**TINY, "epochs": "1"}.items() for a in ("--set", f"{k}={v}")]
    r = runner.invoke(main, ["ils", "train", "--model", "baseline", "--dataset", str(tiny / "ils"), "--images", images,
                             "--out", str(ck), "--quiet", *sets])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["ils", "predict", "--checkpoint", str(ck), "--dataset", str(tiny / "ils"),
                             "--images", images, "--split", "train", "--out", str(pred), "--quiet"])
    assert r.exit_code == 0, r.output
    n_pairs = len(load_pairs(tiny / "ils", "train"))
    assert len(load_predictions(pred)) == n_pairs
    before = pred.read_bytes()
    r = runner.invoke(main, ["ils", "predict", "--checkpoint", str(ck), "--dataset", str(tiny / "ils"),
                             "--images", images, "--split", "train", "--out", str(pred), "--quiet"])
    assert r.exit_code == 0 and f"0 written, {n_pairs} already there" in r.output
    assert pred.read_bytes() == before
    # another checkpoint (here: the same one retrained, its record rewritten) never adds to these predictions; files
    # written beside the weights do not count
    (ck / "pred_copy.jsonl").write_bytes(before)
    r = runner.invoke(main, ["ils", "predict", "--checkpoint", str(ck), "--dataset", str(tiny / "ils"),
                             "--images", images, "--split", "train", "--out", str(pred), "--quiet"])
    assert r.exit_code == 0 and f"0 written, {n_pairs} already there" in r.output
    other = tmp_path / "ck2"
    shutil.copytree(ck, other)
    record = json.loads((other / "checkpoint.json").read_text())
    (other / "checkpoint.json").write_text(json.dumps({**record, "history": [*record["history"], {"epoch": 99}]}))
    r = runner.invoke(main, ["ils", "predict", "--checkpoint", str(other), "--dataset", str(tiny / "ils"),
                             "--images", images, "--split", "train", "--out", str(pred), "--quiet"])
    assert r.exit_code != 0 and "holds predictions of another checkpoint" in r.output and "Traceback" not in r.output
    assert pred.read_bytes() == before
    r = runner.invoke(main, ["ils", "evaluate", "--dataset", str(tiny / "ils"), "--predictions", str(pred),
                             "--split", "train", "--bootstrap", "0"])
    assert r.exit_code == 0, r.output
    assert "gIoU" in r.output and "missing predictions (counted wrong): 0" in r.output
    result = evaluate_dataset(tiny / "ils", pred, split="train", n_boot=0)
    assert result["n_pairs"] == n_pairs and not result["missing"]


def test_predict_records_unreadable_image_and_goes_on(trained, tiny, tmp_path):
    images = tmp_path / "files"
    shutil.copytree(tiny / "cohort" / "files", images)
    pairs = load_pairs(tiny / "ils", "train")
    bad = pairs[0].image_path
    (images / bad).write_bytes(b"not an image")
    pred = tmp_path / "pred.jsonl"
    r = CliRunner().invoke(main, ["ils", "predict", "--checkpoint", str(trained), "--dataset", str(tiny / "ils"),
                                  "--images", str(images), "--split", "train", "--out", str(pred), "--quiet"])
    assert r.exit_code == 0, r.output
    bad_ids = {p.pair_id for p in pairs if p.image_path == bad}
    written = set(load_predictions(pred))
    assert written == {p.pair_id for p in pairs} - bad_ids and written
    failures = [json.loads(line) for line in (tmp_path / "pred.jsonl.failures.jsonl").read_text().splitlines()]
    assert len(failures) == 1 and failures[0]["path"].endswith(bad) and set(failures[0]["pair_ids"]) == bad_ids
    result = evaluate_dataset(tiny / "ils", pred, split="train", n_boot=0)
    assert set(result["missing"]) == bad_ids


def _png_of_zeros(path: Path, width: int, height: int) -> None:
    """A valid, well-compressed all-black 8-bit PNG of ``width`` x ``height`` (a big one stays small on disk)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    comp = zlib.compressobj(9)
    row = b"\0" * (width + 1)
    body = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b""))


def test_predict_records_every_per_image_failure_and_reruns_cleanly(trained, tiny, tmp_path):
    """A huge PNG and an image over --max-pixels are recorded; the rest (a 1-pixel image too) is predicted; a rerun
    adds no duplicate failure lines."""
    images = tmp_path / "files"
    shutil.copytree(tiny / "cohort" / "files", images)
    pairs = load_pairs(tiny / "ils", "train")
    rels = sorted({p.image_path for p in pairs})
    assert len(rels) >= 4
    _png_of_zeros(images / rels[0], 20_000, 20_000)
    _png_of_zeros(images / rels[1], 3_000, 2_000)  # 6 MP: over the --max-pixels given below
    _png_of_zeros(images / rels[2], 1, 1)  # tiny but valid: predicted
    pred = tmp_path / "pred.jsonl"
    args = ["ils", "predict", "--checkpoint", str(trained), "--dataset", str(tiny / "ils"), "--images", str(images),
            "--split", "train", "--out", str(pred), "--quiet", "--max-pixels", "5000000"]
    for _ in range(2):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        assert r.exception is None or isinstance(r.exception, SystemExit)
    bad_ids = {p.pair_id for p in pairs if p.image_path in rels[:2]}
    assert set(load_predictions(pred)) == {p.pair_id for p in pairs} - bad_ids
    failures = [json.loads(line) for line in (tmp_path / "pred.jsonl.failures.jsonl").read_text().splitlines()]
    assert sorted(f["path"] for f in failures) == sorted(str(images / r) for r in rels[:2])
    reasons = {f["path"]: f["reason"] for f in failures}
    assert "20000x20000" in reasons[str(images / rels[0])] and "5000000" in reasons[str(images / rels[1])]


def test_training_reads_released_frame_masks_as_native(tiny, tmp_path):
    """A released-frame export (MIMIC-ILS as published: 512² masks, the whole image stretched) trains on the same
    native masks as the native dataset; without its ``mask_frame.json`` (a MIMIC-ILS download) the 512² masks are
    read as released too."""
    from cxrground.ils.frames import FRAME_FILE, export_dataset

    export_dataset(tiny / "ils", tmp_path / "released")
    cfg = BaselineConfig().with_overrides(TINY)
    native = PairTensors(load_pairs(tiny / "ils", "train"), tiny / "cohort" / "files", cfg, None, progress=False)
    released = PairTensors(load_pairs(tmp_path / "released", "train"), tiny / "cohort" / "files", cfg, None,
                           progress=False)
    assert native.masks.shape == released.masks.shape
    overlap = [(a & b).sum() / max(1, (a | b).sum()) for a, b in zip(native.masks[1:], released.masks[1:], strict=True)]
    assert min(overlap) > 0.8  # nearest-neighbour there and back
    (tmp_path / "released" / FRAME_FILE).unlink()
    download = PairTensors(load_pairs(tmp_path / "released", "train"), tiny / "cohort" / "files", cfg, None,
                           progress=False)
    assert np.array_equal(download.masks, released.masks)


# --- refusals of the ILS-model commands (outside audit) ------------------------------------------------------------

def test_a_checkpoint_folder_of_another_model_is_refused_not_overwritten(trained, tiny, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(trained, copy)
    before = sorted(p.name for p in copy.iterdir())
    run = CliRunner().invoke(main, ["ils", "train", "--model", "lisa", "--dataset", str(tiny / "ils"), "--images",
                                    str(tiny / "cohort" / "files"), "--out", str(copy), "--set", "tiny=true",
                                    "--no-resume"])
    assert run.exit_code != 0 and "holds a 'baseline' checkpoint" in run.output, run.output
    source = tmp_path / "release"
    source.mkdir()
    run = CliRunner().invoke(main, ["ils", "convert-lisa", "--source", str(source), "--out", str(copy)])
    assert run.exit_code != 0 and "holds a 'baseline' checkpoint" in run.output, run.output
    assert sorted(p.name for p in copy.iterdir()) == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "checkpoint.json").write_text(json.dumps({"model": "lisa"}))
    with pytest.raises(ConfigError, match="holds a 'lisa' checkpoint"):
        from cxrground.models.base import train_model

        train_model("baseline", tiny / "ils", tmp_path / "other", images=tiny / "cohort" / "files")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("size", "0", "size must be >= 1"), ("lr", "-1", "lr must be a finite number >= 0"),
    ("lr", "nan", "lr must be a finite number"), ("weight_decay", "-1", "weight_decay must be a finite number >= 0"),
])
def test_baseline_settings_out_of_range_are_refused_by_name(key, value, message):
    with pytest.raises(ConfigError, match=message):
        BaselineConfig().with_overrides({key: value})


def test_lisa_settings_out_of_range_or_misspelt_are_refused_by_name():
    from cxrground.models.lisa.config import LisaConfig

    for overrides, message in (({"tiny": "maybe"}, "bad value 'maybe' for tiny"),
                               ({"tiny": "true", "gradient_checkpointing": "ture"}, "for gradient_checkpointing"),
                               ({"tiny": "true", "betas": "0.9"}, "betas must be two numbers"),
                               ({"tiny": "true", "lr": "-1"}, "lr must be a finite number >= 0")):
        with pytest.raises(ConfigError, match=message):
            LisaConfig.from_overrides(overrides)
    assert LisaConfig.from_overrides({"tiny": "yes", "gradient_checkpointing": "off"}).gradient_checkpointing is False


def test_a_truncated_weights_file_is_named_not_a_traceback(trained, tiny, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(trained, copy)
    weights = copy / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(InputError, match="not a readable safetensors file") as raised:
        load_model(copy)
    assert "weights.safetensors" in str(raised.value)
    run = CliRunner().invoke(main, ["ils", "predict", "--checkpoint", str(copy), "--dataset", str(tiny / "ils"),
                                    "--images", str(tiny / "cohort" / "files"), "--out", str(tmp_path / "p.jsonl")])
    assert run.exit_code == 1 and "not a readable safetensors file" in run.output and "Traceback" not in run.output
    assert not (tmp_path / "p.jsonl.checkpoint.json").exists()  # nothing predicted: no record of a source


def test_predict_under_a_wrong_image_root_fails_and_names_it(trained, tiny, tmp_path):
    out = tmp_path / "pred.jsonl"
    wrong = tmp_path / "elsewhere"
    wrong.mkdir()
    run = CliRunner().invoke(main, ["ils", "predict", "--checkpoint", str(trained), "--dataset", str(tiny / "ils"),
                                    "--images", str(wrong), "--out", str(out), "--quiet"])
    assert run.exit_code == 1 and "no image of split 'test' could be read" in run.output and str(wrong) in run.output
    failures = [json.loads(line) for line in out.with_name(out.name + ".failures.jsonl").read_text().splitlines()]
    assert failures and all(Path(f["path"]).is_absolute() for f in failures)
    assert not out.with_name(out.name + ".checkpoint.json").exists()


def test_an_unknown_validation_split_is_refused(tiny, tmp_path):
    run = CliRunner().invoke(main, ["ils", "train", "--dataset", str(tiny / "ils"), "--images",
                                    str(tiny / "cohort" / "files"), "--out", str(tmp_path / "c"), "--val-split",
                                    "validation", *itertools.chain.from_iterable(("--set", f"{k}={v}")
                                                                                 for k, v in TINY.items())])
    assert run.exit_code != 0 and "--val-split 'validation' is not a split" in run.output, run.output


def test_evaluate_refuses_an_unknown_seg_mode_and_negative_bootstrap(tiny, tmp_path):
    preds = tmp_path / "p.jsonl"
    preds.write_text("")
    for extra, flag in ((["--seg-mode", "bogus"], "--seg-mode"), (["--bootstrap", "-5"], "--bootstrap")):
        run = CliRunner().invoke(main, ["ils", "evaluate", "--dataset", str(tiny / "ils"), "--predictions",
                                        str(preds), *extra])
        assert run.exit_code == 2 and flag in run.output, run.output


def test_weights_are_written_with_the_usual_file_permissions(trained):
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    for name in ("weights.safetensors", "weights_last.safetensors", "checkpoint.json"):
        assert (trained / name).stat().st_mode & 0o777 == 0o666 & ~mask, name


def test_train_takes_threads_as_an_option(tiny, tmp_path):
    settings = list(itertools.chain.from_iterable(("--set", f"{k}={v}") for k, v in {**TINY, "epochs": 1}.items()))
    base = ["ils", "train", "--dataset", str(tiny / "ils"), "--images", str(tiny / "cohort" / "files"), "--quiet",
            *settings]
    run = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "c"), "--threads", "1"])
    assert run.exit_code == 0, run.output
    assert json.loads((tmp_path / "c" / "checkpoint.json").read_text())["config"]["threads"] == 1
    clash = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "d"), "--threads", "1", "--set", "threads=2"])
    assert clash.exit_code != 0 and "disagree" in clash.output


def test_a_split_the_dataset_lacks_is_refused_before_any_film_is_read(tiny, tmp_path, monkeypatch):
    from cxrground.models.base import train_model
    from cxrground.models.baseline import training

    def no_films(*_a, **_k):
        raise AssertionError("films were prepared")

    monkeypatch.setattr(training, "PairTensors", no_films)
    for kwargs, flag in (({"split": "trian"}, "--split 'trian'"), ({"val_split": "vla"}, "--val-split 'vla'")):
        with pytest.raises(ConfigError, match=f"{flag} is not a split of .*its splits: train"):
            train_model("baseline", tiny / "ils", tmp_path / "ck", images=tiny / "cohort" / "files",
                        overrides={**TINY, "epochs": "1"}, progress=False, **kwargs)
        assert not (tmp_path / "ck").exists()


def test_an_unreadable_train_state_names_the_file_and_no_resume(trained, tiny, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(trained, ck)
    state = ck / "train_state.pt"
    state.write_bytes(state.read_bytes()[:200])
    with pytest.raises(InputError, match=r"training state cannot be read.*--no-resume") as err:
        _train(tiny, ck, epochs=2)
    assert str(state) in str(err.value)
