"""Reading an ILS dataset JSON of MIMIC-ILS size: the whole file as dicts against the stream of one split.

Run: ``.venv/bin/python bench/dataset_read.py [--studies 183000] [--export-studies 20000] [--dataset DIR]``. The
file is made by repeating the studies of a built dataset (``--dataset``; default: a 16-study synthetic build made
here) under new keys until ``--studies`` studies (1 in 50 in test, 1 in 100 in val, the rest in train), written as
``ils build`` writes it, beside the build's masks and mask frame record. Each reading runs in its own process;
printed: seconds and the process's peak RSS (Linux) for ``read_dataset`` of the whole file,
``read_dataset(splits=("test",))``, a full pass of ``iter_dataset`` over every split, ``ils stats``
(:func:`~cxrground.ils.card.stats_text`) and the pair records ``ils train`` reads (``load_pairs`` of the train
split); then, on a file of ``--export-studies`` studies (every export reads each mask of each study), ``ils export``
to COCO and to the native mask frame (0: not run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Each reading: the import it needs (only that is imported in its process) and the expression timed.
READS = {
    "whole file (read_dataset)": ("from cxrground.ils.schema import read_dataset", "read_dataset(path)"),
    "test split (read_dataset splits=test)":
        ("from cxrground.ils.schema import read_dataset", "read_dataset(path, splits=('test',))"),
    "every study streamed (iter_dataset)":
        ("from cxrground.ils.schema import iter_dataset", "sum(1 for _ in iter_dataset(path))"),
    "ils stats (stats_text: streamed, top level checked)":
        ("from cxrground.ils.card import stats_text", "stats_text(Path(path).parent)"),
    "ils train's pair records (load_pairs, train split)":
        ("from cxrground.models.baseline.data import load_pairs", "len(load_pairs(path, 'train'))"),
}
EXPORTS = {
    "ils export --format coco":
        ("from cxrground.ils.export_coco import export_coco",
         "export_coco(Path(path).parent, Path(path).parent.parent / 'coco')"),
    "ils export --format mimic-ils --frame native":
        ("from cxrground.ils.frames import export_dataset",
         "export_dataset(Path(path).parent, Path(path).parent.parent / 'native', frame='native')"),
}


def _source(dataset: Path | None, tmp: Path) -> Path:
    """The dataset folder whose studies are repeated: ``dataset``, or a 16-study synthetic build made in ``tmp``,
    exported to the native frame in ``tmp`` (its record gives each film's size)."""

    if dataset is None:
        from cxrground.datasets.synthetic import write_cohort
        from cxrground.ils.build import BackendSpec, build_dataset
        from cxrground.ils.config import IlsConfig
        from cxrground.ils.tasks import build_tasks

        write_cohort(tmp / "cohort", 16, seed=0, progress=False)
        tasks, failures = build_tasks(tmp / "cohort" / "files")
        build_dataset(tasks, tmp / "ils", IlsConfig(seed=0), BackendSpec(), scan_failures=failures, progress=False)
        dataset = tmp / "ils"
    from cxrground.ils.frames import export_dataset

    export_dataset(dataset, tmp / "source", frame="native")  # records each film's size (mask_frame.json)
    return tmp / "source"


def _write(source: Path, n: int, folder: Path) -> tuple[Path, int]:
    """A dataset folder of ``n`` studies repeating those of the dataset folder ``source`` (its masks and mask frame
    record linked beside it); returns its JSON and pair count."""
    from cxrground.ils.frames import FRAME_FILE
    from cxrground.ils.layout import DATASET_FILE, MASK_DIR
    from cxrground.ils.schema import load_dataset

    studies = [study for split in load_dataset(source).values() for study in split.values()]
    folder.mkdir(parents=True)
    (folder / MASK_DIR).symlink_to((source / MASK_DIR).resolve())
    if (source / FRAME_FILE).is_file():
        (folder / FRAME_FILE).write_bytes((source / FRAME_FILE).read_bytes())
    path = folder / DATASET_FILE
    data: dict[str, dict] = {"train": {}, "val": {}, "test": {}}
    pairs = 0
    for i in range(n):
        study = studies[i % len(studies)]
        split = "test" if i % 50 == 0 else "val" if i % 100 == 1 else "train"
        data[split][f"s{50_000_000 + i}"] = study
        pairs += sum(len(v) for v in study["instruction_answer_pairs"].values())
    with path.open("w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)  # as ils build writes it: compact, UTF-8
    return path, pairs


def _measure(path: Path, reading: tuple[str, str]) -> tuple[float, float]:
    """Seconds and peak RSS (MB, the process's own high-water mark: Linux ``VmHWM``) of ``reading`` (its import,
    its expression) in a fresh process."""
    code = (f"import re, time\nfrom pathlib import Path\n{reading[0]}\n"
            f"path = {str(path)!r}\nt = time.perf_counter()\nresult = {reading[1]}\nt = time.perf_counter() - t\n"
            "hwm = re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1)\n"
            "print(t, int(hwm) / 1024)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=183_000)
    parser.add_argument("--export-studies", type=int, default=20_000)
    parser.add_argument("--dataset", type=Path, default=None, help="a built ILS dataset whose studies are repeated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = _source(args.dataset, Path(tmp))
        for n, reads in ((args.studies, READS), (args.export_studies, EXPORTS)):
            if n <= 0:
                continue
            t = time.perf_counter()
            path, pairs = _write(source, n, Path(tmp) / f"big{n}" / "ils")
            print(f"\n{n:,} studies, {pairs:,} pairs, {path.stat().st_size / 1e6:.0f} MB of JSON "
                  f"(written in {time.perf_counter() - t:.0f} s)")
            print("| reading | seconds | peak RSS MB | of which imports |\n|---|---|---|---|")
            for name, reading in reads.items():
                seconds, rss = _measure(path, reading)
                imports = _measure(path, (reading[0], "None"))[1]
                print(f"| {name} | {seconds:.1f} | {rss:.0f} | {imports:.0f} |")


if __name__ == "__main__":
    main()
