"""Real pack: a CheXpercept benchmark built from COVID-19 collection images with their real lung masks
(ILS dataset from the notes, ``--segmenter masks``) passes ``validate``; its gallery renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cxrground.percept.build import BuildOptions, build_benchmark
from cxrground.percept.gallery import render_gallery
from cxrground.percept.schema import load_benchmark
from cxrground.percept.validate import validate_benchmark

STUDIES = 12


@pytest.fixture(scope="module")
def pack_ils(pack_dir: Path, tmp_path_factory) -> tuple[Path, Path]:
    from cxrground.datasets.pack import Pack
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.config import IlsConfig
    from cxrground.ils.tasks import build_tasks

    pack = Pack(pack_dir)
    rows = [r for r in pack.cohen() if r.notes][:STUDIES]
    work = tmp_path_factory.mktemp("percept_pack")
    index = work / "index.jsonl"
    index.write_text("".join(json.dumps({"image": r.image_path.name, "study_id": f"s{900000 + i}",
                                         "subject_id": r.patient_id, "report": r.notes, "view": r.view}) + "\n"
                             for i, r in enumerate(rows)))
    subset = work / "images"
    subset.mkdir()
    for r in rows:
        (subset / r.image_path.name).symlink_to(r.image_path)
    tasks, failures = build_tasks(subset, index=index)
    # pseudo-normal: the normative default fitted on these notes' "normal" studies (mostly COVID-19 lungs) makes no
    # lung-lesion mask on these films (README, "ILS build on real radiographs"), and this test needs lesion cases
    spec = BackendSpec(segmenter="masks", segmenter_kwargs={"root": str(pack.root / "cohen" / "masks"),
                                                            "pattern": "{stem}_{name}.png"},
                       synthesizer="pseudo-normal")
    build_dataset(tasks, work / "ils", IlsConfig(), spec, scan_failures=failures, progress=False, workers=2)
    return work / "ils", subset


def test_pack_benchmark_is_valid(pack_ils, tmp_path) -> None:
    ils, images = pack_ils
    opts = BuildOptions(ils=str(ils), images=str(images), per_lesion=(1, 1, 1), splits=("train", "val", "test"),
                        seed=0, max_candidates=3)
    summary = build_benchmark(opts, tmp_path / "bench", workers=2, progress=False)
    assert validate_benchmark(tmp_path / "bench") == []
    bench = load_benchmark(tmp_path / "bench")
    assert summary.cases == len(bench.cases) > 0
    assert any(c.qa_path != "lesion_free" for c in bench.cases.values())
    for case in bench.cases.values():  # real images keep their native sizes
        assert case.image_size is not None and max(case.image_size) > 256
    assert render_gallery(tmp_path / "bench", tmp_path / "gallery.html") == len(bench.cases)
