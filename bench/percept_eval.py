"""Bench: the CheXpercept harness at concurrency 1 vs 32 against the mock OpenAI server.

Builds a tiny benchmark in a temporary folder (default 300 cases: per lesion (edema, cardiomegaly)
75 LF + 60 RF + 15 RR; images 8x8 PNGs), starts :class:`MockServer` with ``--latency`` seconds per request
(default 0.2) and a deterministic answer policy (a hash of the messages), then runs the harness twice with
fresh caches: concurrency 1 and ``--concurrency`` (default 32). Prints wall times, requests, the speed-up
(target >= 15x) and whether the two runs' scores are identical. The mix keeps the concurrency-1 run under
~6 minutes: (150 LF x 1 + 120 RF x (6 or 2 turns) + 30 RR x (9 or 5 turns)) requests at 0.2 s each.

Usage: ``.venv/bin/python bench/percept_eval.py [--lf 75 --rf 60 --rr 15] [--latency 0.2] [--concurrency 32]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from cxrground.evaluation.percept.runner import EvalSettings, run_eval
from cxrground.evaluation.percept.scoring import score_run
from cxrground.testing.mock_bench import make_benchmark
from cxrground.testing.mock_server import MockServer, hash_policy


def _timed(bench: Path, out: Path, server: MockServer, concurrency: int) -> tuple[float, dict]:
    start = time.perf_counter()
    summary = run_eval(EvalSettings(bench, "openai:bench-vlm", oracle="implicit"), out, concurrency=concurrency,
                       cache=out.parent / f"cache-{concurrency}.sqlite", base_url=server.base_url, progress=True)
    return time.perf_counter() - start, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lf", type=int, default=75, help="LF cases per lesion")
    ap.add_argument("--rf", type=int, default=60, help="RF cases per lesion")
    ap.add_argument("--rr", type=int, default=15, help="RR cases per lesion")
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bench = make_benchmark(root / "bench", {"LF": args.lf, "RF": args.rf, "RR": args.rr})
        n_cases = 2 * (args.lf + args.rf + args.rr)
        with MockServer(hash_policy(0), latency=args.latency) as server:
            t_hi, s_hi = _timed(bench, root / f"c{args.concurrency}", server, args.concurrency)
            req_hi = server.requests
            t_lo, s_lo = _timed(bench, root / "c1", server, 1)
            req_lo = server.requests - req_hi
        a, b = score_run(root / "c1", n_boot=200), score_run(root / f"c{args.concurrency}", n_boot=200)
        same = all(json.dumps(a[k], sort_keys=True) == json.dumps(b[k], sort_keys=True)
                   for k in ("paths", "subtasks", "per_lesion", "parse", "chance"))
        print(f"cases: {n_cases} ({args.lf}/{args.rf}/{args.rr} LF/RF/RR per lesion, edema + cardiomegaly), "
              f"latency {args.latency * 1000:.0f} ms/request")
        print(f"concurrency 1:  {t_lo:7.1f} s  {req_lo} requests  ({req_lo / t_lo:.1f} req/s)")
        print(f"concurrency {args.concurrency}: {t_hi:7.1f} s  {req_hi} requests  ({req_hi / t_hi:.1f} req/s)")
        print(f"speed-up: {t_lo / t_hi:.1f}x (target >= 15x)")
        print(f"identical scores: {same}; failed cases: {s_lo['failed_this_run']} / {s_hi['failed_this_run']}")
        if not same or t_lo / t_hi < 15:
            sys.exit(1)


if __name__ == "__main__":
    main()
