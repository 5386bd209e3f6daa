"""`ils gallery --sample SEED`: studies drawn at random from every split, reproducibly, shown in file order."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from cxrground.cli import main
from cxrground.ils.build import DATASET_FILE
from cxrground.ils.gallery import render_gallery
from cxrground.ils.schema import SPLITS


def _shown(page: Path) -> list[str]:
    return re.findall(r"<h2>(\w+) · (\w+)", page.read_text())


def _images(tasks) -> Path:
    task = tasks[0][0]
    return Path(task.image_path[: -len(task.relative_image_path)])


def test_a_sample_is_drawn_from_every_split_reproducibly(build_tiny_ils, tiny_ils_tasks, tmp_path):
    ds = build_tiny_ils(tmp_path / "ils")
    images = _images(tiny_ils_tasks)
    data = json.loads((ds / DATASET_FILE).read_text())
    studies = [(key, study) for split in SPLITS for key, study in data.get(split, {}).items()]
    assert len(studies) == 4
    data.update(train=dict(studies[:2]), val=dict(studies[2:3]), test=dict(studies[3:]))  # every split has some
    (ds / DATASET_FILE).write_text(json.dumps(data))
    order = [(key, split) for split in SPLITS for key in data.get(split, {})]
    assert len({split for _key, split in order}) >= 2 and len(order) >= 3
    draws = {}
    for seed in range(8):
        result = render_gallery(ds, images, tmp_path / f"g{seed}.html", limit=2, sample=seed)
        shown = _shown(tmp_path / f"g{seed}.html")
        assert result.shown == 2 and result.drawn_from == len(order) and result.more == (len(order) > 2)
        assert shown == sorted(shown, key=order.index)  # file order on the page
        assert f"drawn at random (seed {seed}) from {len(order)}" in (tmp_path / f"g{seed}.html").read_text()
        draws[seed] = tuple(shown)
    again = render_gallery(ds, images, tmp_path / "again.html", limit=2, sample=3)
    assert again.shown == 2 and tuple(_shown(tmp_path / "again.html")) == draws[3]
    assert len(set(draws.values())) > 1  # seeds draw different studies
    assert any(shown[0] != order[0] for shown in draws.values())  # not always the first in file order
    one_split = render_gallery(ds, images, tmp_path / "test.html", limit=5, split="test", sample=0)
    assert {split for _key, split in _shown(tmp_path / "test.html")} == {"test"}
    assert one_split.drawn_from == len(data.get("test", {}))


def test_a_drawn_study_that_cannot_be_shown_is_listed_and_another_is_drawn(build_tiny_ils, tiny_ils_tasks, tmp_path):
    ds = build_tiny_ils(tmp_path / "ils")
    images = _images(tiny_ils_tasks)
    data = json.loads((ds / DATASET_FILE).read_text())
    keys = [(split, key) for split in SPLITS for key in data.get(split, {})]
    split, broken = keys[0]
    data[split][broken]["image_path"] = "missing/film.jpg"
    (ds / DATASET_FILE).write_text(json.dumps(data))
    result = render_gallery(ds, images, tmp_path / "g.html", limit=len(keys) - 1, sample=0)
    assert result.shown == len(keys) - 1 and [key for key, _ in result.failed] == [broken]
    assert not result.more


def test_the_command_names_the_sample(build_tiny_ils, tiny_ils_tasks, tmp_path):
    ds = build_tiny_ils(tmp_path / "ils")
    res = CliRunner().invoke(main, ["ils", "gallery", str(ds), "--images", str(_images(tiny_ils_tasks)),
                                    "--limit", "2", "--sample", "1"])
    assert res.exit_code == 0, res.output
    assert "(2 studies; drawn at random from 4)" in res.output
