"""The pose reader: poses and their corrections, the model file, the training recipe, and the shipped weights on a
pack film it never saw in training."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cxrground.anatomy.segment.orientation import POSES, pose_pixels  # noqa: E402
from cxrground.anatomy.segment.pose_net import (  # noqa: E402
    POSE_CLASSES,
    PoseNetConfig,
    PoseReader,
    apply_pose,
    build_pose_net,
    correction_name,
    load_pose_net,
    save_pose_net,
    undo_pose,
)
from cxrground.errors import ConfigError  # noqa: E402

TINY = PoseNetConfig(input_size=32, channels=(4, 8), head_channels=4, dropout=0.0)


def _film(seed: int = 0, shape: tuple[int, int] = (40, 52)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def test_the_eight_poses_are_distinct_and_each_correction_puts_the_film_right():
    film = _film()
    stored = {pose: apply_pose(film, pose) for pose in POSE_CLASSES}
    keys = {(a.shape, a.tobytes()) for a in stored.values()}
    assert len(keys) == 8
    for pose, pixels in stored.items():
        assert np.array_equal(undo_pose(pixels, pose), film)
        name = correction_name(pose)
        if name == "none":
            assert np.array_equal(pixels, film)
            continue
        steps = name.split(", then ")
        fixed = pixels
        for step in steps:
            fixed = pose_pixels(fixed, step)
        assert np.array_equal(fixed, film), name


def test_corrections_use_the_orientation_checks_names_where_they_exist():
    named = {correction_name(p) for p in POSE_CLASSES}
    assert set(POSES) <= named


def test_model_file_round_trip_and_checks(tmp_path):
    model = build_pose_net(TINY)
    w, j = save_pose_net(model, TINY, tmp_path / "p", {"data": {"heldout_images": []}})
    loaded, meta = load_pose_net(w)
    assert meta["architecture"] == TINY.to_dict() and len(meta["classes"]) == 8
    x = torch.randn(2, 1, 32, 32)
    with torch.inference_mode():
        assert torch.allclose(model.eval()(x), loaded(x))
    w.write_bytes(w.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ConfigError, match="sha256"):
        load_pose_net(w)
    j.write_text("[]", encoding="utf-8")
    with pytest.raises(ConfigError, match="format"):
        load_pose_net(w)
    with pytest.raises(ConfigError, match="not found"):
        load_pose_net(tmp_path / "missing.safetensors")


def test_reader_gives_eight_probabilities_for_films_of_any_shape(tmp_path):
    w, _ = save_pose_net(build_pose_net(TINY), TINY, tmp_path / "p")
    reader = PoseReader(w)
    readings = reader.read_many([_film(1, (30, 50)), _film(2, (64, 20))])
    for r in readings:
        assert len(r.probabilities) == 8 and abs(sum(r.probabilities) - 1) < 1e-5
        assert r.pose in POSE_CLASSES and r.correction == correction_name(r.pose)
        assert r.upright == (r.pose == (0, False))


def test_training_is_deterministic_and_learns_an_asymmetric_pattern(tmp_path):
    from cxrground.models.pose_net import PoseRecipe, train_pose_net

    # a bright blob off-centre (a "heart" on one side, low down): the pose is readable from the image
    films = []
    for i in range(6):
        f = np.full((48, 48), 60, np.uint8)
        f[26 + i % 3:40, 28:42 - i % 2] = 220
        f[6:12, 6:10] = 140
        films.append((f"{i:08d}_000.png", f))
    recipe = PoseRecipe(epochs=12, batch_size=16, lr=5e-3, threads=1, crop_p=0.0, invert_p=0.0,
                        rotation_deg=0.0, scale=(1.0, 1.0), shift=0.0)
    a = train_pose_net(films, tmp_path / "a", recipe, config=TINY, progress=False)
    b = train_pose_net(films, tmp_path / "b", recipe, config=TINY, progress=False)
    assert a["history"] == b["history"]
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert a["history"][-1]["train_accuracy"] > 0.9
    reader = PoseReader(tmp_path / "a.safetensors")
    film = films[0][1]
    assert [r.pose for r in reader.read_many([apply_pose(film, p) for p in POSE_CLASSES])] == list(POSE_CLASSES)


def test_patient_split_keeps_patients_together_and_is_seeded():
    from cxrground.models.pose_net import nih_patient, split_patients

    names = [f"{p:08d}_{k:03d}.png" for p in range(30) for k in range(1 + p % 3)]
    train, held = split_patients(names, 1 / 3, 0)
    assert sorted(train + held) == sorted(names)
    assert not {nih_patient(n) for n in train} & {nih_patient(n) for n in held}
    assert len({nih_patient(n) for n in held}) == 10
    assert split_patients(names, 1 / 3, 0) == (train, held) != split_patients(names, 1 / 3, 1)


def test_shipped_reader_reads_held_out_pack_films_upright_and_mirrored(pack_dir):
    """Two NIH films of patients the shipped weights never saw in training, as stored and mirrored."""
    from cxrground.anatomy.segment.pose_net import DEFAULT_POSE_WEIGHTS, shipped_pose_reader
    from cxrground.datasets.pack import Pack

    reader = shipped_pose_reader()
    meta = json.loads(reader.path.with_suffix(".json").read_text(encoding="utf-8"))
    assert meta["name"] == DEFAULT_POSE_WEIGHTS
    held = set(meta["data"]["heldout_images"])
    assert not held & set(meta["data"]["train_images"])
    films = [r.read().pixels for r in Pack(pack_dir).nih() if r.image_path.name in held][:2]
    readings = reader.read_many(films + [f[:, ::-1] for f in films])
    assert [r.correction for r in readings] == ["none", "none", "mirrored left-right", "mirrored left-right"]
