"""The baseline's prepared films (:class:`~cxrground.models.baseline.data.PairTensors`): the same tensors in memory
and from a memory-mapped cache, which a later run over the same pairs and films reads instead of the films."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from ils_helpers import TINY_BASELINE as TINY
from ils_helpers import tiny_ils

torch = pytest.importorskip("torch")

from cxrground.models import baseline  # noqa: E402
from cxrground.models.baseline import data as data_mod  # noqa: E402
from cxrground.models.baseline.config import BaselineConfig  # noqa: E402
from cxrground.models.baseline.data import PairTensors, load_pairs  # noqa: E402
from cxrground.models.baseline.training import CACHE_DIR  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 5-study cohort and its ILS dataset."""
    return tiny_ils(tmp_path_factory.mktemp("baseline-cache"), 5)


def _tensors(tiny: Path, images: Path, cache: Path | None) -> PairTensors:
    config = BaselineConfig().with_overrides(TINY)
    return PairTensors(load_pairs(tiny / "ils", "train"), images, config, None, progress=False, cache=cache,
                       identity={"test": 1})


def _same(a: PairTensors, b: PairTensors) -> None:
    assert [p.pair_id for p in a.pairs] == [p.pair_id for p in b.pairs] and a.study_keys == b.study_keys
    idx = np.arange(len(a))
    for key, value in a.batch(idx).items():
        assert torch.equal(value, b.batch(idx)[key]), key


def test_the_cache_holds_the_tensors_of_memory_and_a_later_run_reads_it(tiny, tmp_path, monkeypatch):
    images = shutil.copytree(tiny / "cohort" / "files", tmp_path / "films")
    bad = sorted({p.image_path for p in load_pairs(tiny / "ils", "train")})[0]
    (images / bad).write_bytes(b"not a film")  # one unreadable film: its pairs are left out, and recorded
    memory = _tensors(tiny, images, None)
    cache = tmp_path / "cache"
    first = _tensors(tiny, images, cache)
    assert not first.from_cache and (cache / "cache.json").is_file() and isinstance(first.images, np.memmap)
    _same(memory, first)
    assert [f.path for f in first.failures] == [str(images / bad)] and len(memory.failures) == 1

    def no_reading(*args, **kwargs):
        raise AssertionError("a film was read")

    monkeypatch.setattr(data_mod, "read_image", no_reading)
    again = _tensors(tiny, images, cache)
    assert again.from_cache and [f.path for f in again.failures] == [str(images / bad)]
    _same(memory, again)
    monkeypatch.undo()
    # a film touched since (another modification time): the cache is made again
    good = sorted({p.image_path for p in load_pairs(tiny / "ils", "train")})[-1]
    os.utime(images / good, ns=(1_700_000_000_000_000_000,) * 2)
    assert not _tensors(tiny, images, cache).from_cache
    assert _tensors(tiny, images, cache).from_cache


def test_training_keeps_the_cache_until_every_epoch_has_run(tiny, tmp_path):
    out = tmp_path / "ck"
    kwargs = {"images": tiny / "cohort" / "files", "overrides": {**TINY, "epochs": "2"}, "progress": False,
              "log": None}
    baseline.train(tiny / "ils", out, stop_after_epoch=1, **kwargs)
    assert (out / CACHE_DIR / "train" / "cache.json").is_file()
    said: list[str] = []
    baseline.train(tiny / "ils", out, **{**kwargs, "log": said.append})
    assert any("films read from the cache" in line for line in said)
    assert not (out / CACHE_DIR).exists()


def test_a_changed_mask_makes_the_cache_again_and_a_full_disk_is_an_error(tiny, tmp_path, monkeypatch):
    import errno

    images = tiny / "cohort" / "files"
    data = shutil.copytree(tiny / "ils", tmp_path / "ils")
    config = BaselineConfig().with_overrides(TINY)
    pairs = load_pairs(data, "train")
    cache = tmp_path / "cache"
    PairTensors(pairs, images, config, None, progress=False, cache=cache)
    mask = next(p.mask_path for p in pairs if p.mask_path is not None)
    os.utime(mask, ns=(1_700_000_000_000_000_000,) * 2)  # a mask rewritten since
    assert not PairTensors(pairs, images, config, None, progress=False, cache=cache).from_cache

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(data_mod.os, "posix_fallocate", full, raising=False)
    with pytest.raises(OSError, match="No space left"):
        PairTensors(pairs, images, config, None, progress=False, cache=tmp_path / "full")


def test_a_split_name_cannot_lead_the_cache_out_of_its_folder(tiny, tmp_path):
    from cxrground.models.baseline.training import _cache_folder

    assert _cache_folder(tmp_path, "train") == tmp_path / CACHE_DIR / "train"
    odd = _cache_folder(tmp_path, "..")
    assert odd.parent == tmp_path / CACHE_DIR and odd.name not in ("..", ".")
