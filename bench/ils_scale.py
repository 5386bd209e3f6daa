"""Growth of the ILS build driver from 1K to 100K studies: peak RSS and time per study of planning, scheduling and
assembly, on cheap fake work units (no images are read; the per-study work is a stand-in that writes a unit file
of realistic size).

Run: ``.venv/bin/python bench/ils_scale.py [--sizes 1000,10000,100000] [--workers 2] [--engine local|ray]
[--task-list]``, and ``.venv/bin/python bench/ils_scale.py --llm 5000 [--latency 0.05]`` for the LLM structurer.

Each size runs in its own process (so each peak RSS is its own) and prints one row:

- **plan**: the resume check over every study (the count pass and the pending stream of ``run_units``);
- **schedule**: ``run_units`` through the engine (a pool of ``--workers`` processes, or Ray actors with
  ``--engine ray``), each study a fake runner writing a ~14 KB unit with a ~6.5 KB anatomy record;
- **assemble**: ``assemble`` reading every unit and writing the dataset JSON, the JSONL files and the card;
- **peak RSS**: the driver process's own (``ru_maxrss``), workers excluded.

``--llm N``: N distinct reports through :meth:`LLMStructurer.warm_cache` against the project's mock
OpenAI-compatible server (``cxrground.testing.mock_server``, each answer after ``--latency`` seconds, 1 % of requests
answered 500 and 1 % 429, retried), at several concurrencies, then again from the response cache (a resumed run):
reports/s and the driver's peak RSS. The mock answers instantly apart from the latency, so this measures the client
side (concurrency, retries, cache), not an LLM.

The tasks come from a lazy source by default (the driver's own memory); ``--task-list`` holds them in one Python
list as ``ils build`` does after scanning a folder, to show what the list itself costs. Targets: peak RSS within
1.5x from 1K to 100K and under 2 GB; time per study constant.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

LOCATIONS = ["right upper lung", "left lower lung", "right lung"]


class FakeTasks:
    """``n`` study tasks in study-key order, made on the fly each time the source is iterated."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        from cxrground.ils.tasks import StudyTask

        for i in range(self.n):
            key = f"s{50_000_000 + i}"
            subject = f"p{10_000_000 + i // 3}"
            yield StudyTask(key, subject, f"{i:08x}-dicom", f"/data/files/p10/{subject}/{key}/{i:08x}.jpg",
                            f"p10/{subject}/{key}/{i:08x}.jpg", ("train", "train", "train", "val", "test")[i % 5],
                            report_text="FINDINGS: fake.")

    def __len__(self) -> int:
        return self.n


def fake_runner(task, out, config, spec, max_pixels):
    """A stand-in for one study's work: writes a unit file of realistic size and content, reads no image."""
    from cxrground.ils.units import write_unit

    i = int(task.study_key[1:]) - 50_000_000
    negatives = [{"pair_id": f"{task.study_key}_negative_{k}", "instruction": "Segment the effusion.",
                  "answer": "[SEG] There is no effusion.", "type": "basic", "target": "effusion",
                  "location": ["right lung"], "seg": False} for k in range(6)]
    rle = "3 " * 1600  # ~3.2 KB per mask as RLE text, about the size of a 512 px lung
    unit = {
        "study_key": task.study_key, "split": task.split, "image_path": task.image_path, "status": "ok",
        "findings": [{"entity": "effusion", "lesion": "effusion", "sent_idx": str(k), "presence": "negative",
                      "certainty": "definitive", "reported_location": LOCATIONS} for k in range(4)],
        "masks": [], "reported": [["edema", bool(i % 2)]],
        "grounding": [{"lesion": "edema", "status": "empty", "reason": "no box"}] if i % 2 else [],
        "anatomy": {"height": 512, "width": 512, "ctr": 0.45, "right_lung": rle, "left_lung": rle},
        "study": {"subject_id": task.subject_id, "dicom_id": task.dicom_id, "image_path": task.relative_image_path,
                  "section_name": "findings", "section_content": "(1) No pleural effusion. " * 8,
                  "instruction_answer_pairs": {"positive_pairs": [], "negative_pairs": negatives}},
    }
    write_unit(Path(out), unit, config, spec)
    return task.study_key, "ok"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_size(n: int, workers: int, engine: str, task_list: bool) -> dict:
    """Plan, schedule and assemble ``n`` fake studies in a temporary folder; the figures as a dict."""
    from cxrground.ils.backend_spec import BackendSpec
    from cxrground.ils.build import _pending, assemble, run_units
    from cxrground.ils.card import DatasetCounts  # noqa: F401  (imported before the baseline)
    from cxrground.ils.config import IlsConfig

    config, spec = IlsConfig(), BackendSpec()
    base = _rss_mb()
    tasks = list(FakeTasks(n)) if task_list else FakeTasks(n)
    with tempfile.TemporaryDirectory(prefix="ils-scale-") as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        pending = sum(1 for _ in _pending(tasks, out))
        plan = time.perf_counter() - t0
        assert pending == n
        t0 = time.perf_counter()
        processed, _ = run_units(tasks, out, config, spec, engine, workers, progress=False, runner=fake_runner)
        schedule = time.perf_counter() - t0
        assert processed == n
        rss_schedule = _rss_mb()
        t0 = time.perf_counter()
        result = assemble(out, tasks, config, spec, (), {})
        asm = time.perf_counter() - t0
        size = (out / "mimic_ils_instruction_answer.json").stat().st_size + sum(
            (out / f).stat().st_size for f in ("findings.jsonl", "anatomy.jsonl"))
    assert result["studies"] == n
    return {"studies": n, "plan_us": 1e6 * plan / n, "schedule_ms": 1e3 * schedule / n, "assemble_ms": 1e3 * asm / n,
            "rss_base_mb": base, "rss_schedule_mb": rss_schedule, "rss_peak_mb": _rss_mb(), "output_mb": size / 2**20}


def llm_throughput(n: int, latency: float, concurrencies: list[int]) -> None:
    """Reports/s of the LLM structurer's cache warm-up against the mock server, then from the cache."""
    from cxrground.reports import parse_report_text, select_section
    from cxrground.reports.structure.llm import LLMStructurer
    from cxrground.testing.mock_server import MockServer

    def sections(tag: str):
        for k in range(n):
            text = f"FINDINGS: Study {tag}-{k}. Small left pleural effusion. No pneumothorax.\n"
            yield f"s{k}", select_section(parse_report_text(text, report_id=f"s{k}"), "findings")

    print(f"LLM structurer, {n:,} reports, mock server latency {latency * 1000:.0f} ms, 1 % 500 + 1 % 429 faults")
    print("| concurrency | reports/s | retries | failed | from the cache: reports/s | driver peak RSS MB |")
    print("|---|---|---|---|---|---|")
    answer = json.dumps({"findings": []})
    for concurrency in concurrencies:
        with tempfile.TemporaryDirectory() as tmp, MockServer(lambda body: answer, latency=latency,
                                                              fault_rates={"500": 0.01, "429": 0.01},
                                                              max_requests=10 * n) as server:
            cache = Path(tmp) / "llm.sqlite"
            structurer = LLMStructurer(server.base_url, "mock", cache=cache, concurrency=concurrency,
                                       backoff=0.05)
            t0 = time.perf_counter()
            counts = structurer.warm_cache(sections(str(concurrency)))
            first = n / (time.perf_counter() - t0)
            structurer.cache.close()
            again = LLMStructurer(server.base_url, "mock", cache=cache, concurrency=concurrency)
            t0 = time.perf_counter()
            cached = again.warm_cache(sections(str(concurrency)))
            second = n / (time.perf_counter() - t0)
            again.cache.close()
            assert cached["cache_hits"] >= n - counts["failed"]
        print(f"| {concurrency} | {first:.0f} | {counts['retries']} | {counts['failed']} | {second:.0f} | "
              f"{_rss_mb():.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--engine", default="local", choices=("local", "ray"))
    parser.add_argument("--task-list", action="store_true", help="hold the tasks in one list (as after a scan)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--llm", type=int, help="measure the LLM structurer on this many reports instead")
    parser.add_argument("--latency", type=float, default=0.05, help="mock server seconds per answer (--llm)")
    parser.add_argument("--concurrency", default="1,8,32,64", help="LLM concurrencies to measure (--llm)")
    args = parser.parse_args()
    if args.llm:
        llm_throughput(args.llm, args.latency, [int(c) for c in args.concurrency.split(",")])
        return
    if args.one:
        print(json.dumps(one_size(args.one, args.workers, args.engine, args.task_list)))
        return
    print(f"engine {args.engine}, {args.workers} workers, tasks {'in a list' if args.task_list else 'streamed'}")
    print("| studies | plan µs/study | schedule ms/study | assemble ms/study | driver RSS after imports MB | "
          "after schedule MB | peak MB | output MB |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for n in (int(v) for v in args.sizes.split(",")):
        cmd = [sys.executable, __file__, "--one", str(n), "--workers", str(args.workers), "--engine", args.engine,
               *(["--task-list"] if args.task_list else [])]
        row = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
        rows.append(row)
        print(f"| {n:,} | {row['plan_us']:.1f} | {row['schedule_ms']:.2f} | {row['assemble_ms']:.2f} | "
              f"{row['rss_base_mb']:.0f} | {row['rss_schedule_mb']:.0f} | {row['rss_peak_mb']:.0f} | "
              f"{row['output_mb']:.0f} |", flush=True)
    if len(rows) > 1:
        print(f"peak RSS {rows[-1]['studies']:,} / {rows[0]['studies']:,} studies: "
              f"{rows[-1]['rss_peak_mb'] / rows[0]['rss_peak_mb']:.2f}x")


if __name__ == "__main__":
    main()
