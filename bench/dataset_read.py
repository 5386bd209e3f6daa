"""Reading an ILS dataset JSON of MIMIC-ILS size: the whole file as dicts against the stream of one split.

Run: ``.venv/bin/python bench/dataset_read.py [--studies 183000] [--dataset DIR]``. The file is made by repeating
the studies of a built dataset (``--dataset``; default: a 16-study synthetic build made here) under new keys until
``--studies`` studies (1 in 50 in test, 1 in 100 in val, the rest in train), written as ``ils build`` writes it.
Each reading runs in its own process; printed: seconds and the process's peak RSS (Linux) for ``read_dataset`` of the
whole file, ``read_dataset(splits=("test",))``, a full pass of ``iter_dataset`` over every split and ``ils stats``
(:func:`~cxrground.ils.card.stats_text`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READS = {
    "whole file (read_dataset)": "read_dataset(path)",
    "test split (read_dataset splits=test)": "read_dataset(path, splits=('test',))",
    "every study streamed (iter_dataset)": "sum(1 for _ in iter_dataset(path))",
    "ils stats (stats_text: streamed, top level checked)": "stats_text(Path(path).parent)",
}


def _studies(dataset: Path | None, tmp: Path) -> list[dict]:
    """The studies to repeat: those of ``dataset``, or of a 16-study synthetic build made in ``tmp``."""
    from cxrground.ils.schema import load_dataset

    if dataset is None:
        from cxrground.datasets.synthetic import write_cohort
        from cxrground.ils.build import BackendSpec, build_dataset
        from cxrground.ils.config import IlsConfig
        from cxrground.ils.tasks import build_tasks

        write_cohort(tmp / "cohort", 16, seed=0, progress=False)
        tasks, failures = build_tasks(tmp / "cohort" / "files")
        build_dataset(tasks, tmp / "ils", IlsConfig(seed=0), BackendSpec(), scan_failures=failures, progress=False)
        dataset = tmp / "ils"
    return [study for split in load_dataset(dataset).values() for study in split.values()]


def _write(studies: list[dict], n: int, path: Path) -> int:
    """A dataset of ``n`` studies repeating ``studies``; returns its pair count."""
    data: dict[str, dict] = {"train": {}, "val": {}, "test": {}}
    pairs = 0
    for i in range(n):
        study = studies[i % len(studies)]
        split = "test" if i % 50 == 0 else "val" if i % 100 == 1 else "train"
        data[split][f"s{50_000_000 + i}"] = study
        pairs += sum(len(v) for v in study["instruction_answer_pairs"].values())
    with path.open("w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)  # as ils build writes it: compact, UTF-8
    return pairs


def _measure(path: Path, expr: str) -> tuple[float, float]:
    """Seconds and peak RSS (MB, the process's own high-water mark: Linux ``VmHWM``) of ``expr`` in a fresh
    process."""
    code = ("import re, time\nfrom pathlib import Path\nfrom cxrground.ils.card import stats_text\n"
            "from cxrground.ils.schema import iter_dataset, read_dataset\n"
            f"path = {str(path)!r}\nt = time.perf_counter()\nresult = {expr}\nt = time.perf_counter() - t\n"
            "hwm = re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1)\n"
            "print(t, int(hwm) / 1024)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=183_000)
    parser.add_argument("--dataset", type=Path, default=None, help="a built ILS dataset whose studies are repeated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mimic_ils_instruction_answer.json"
        t = time.perf_counter()
        pairs = _write(_studies(args.dataset, Path(tmp)), args.studies, path)
        print(f"{args.studies:,} studies, {pairs:,} pairs, {path.stat().st_size / 1e6:.0f} MB of JSON "
              f"(written in {time.perf_counter() - t:.0f} s)")
        baseline = _measure(path, "None")[1]
        print(f"process with the imports alone: {baseline:.0f} MB peak RSS")
        print("| reading | seconds | peak RSS MB |\n|---|---|---|")
        for name, expr in READS.items():
            seconds, rss = _measure(path, expr)
            print(f"| {name} | {seconds:.1f} | {rss:.0f} |")


if __name__ == "__main__":
    main()
