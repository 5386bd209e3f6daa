"""Bench: the CheXpercept harness against a rate-limited API (the mock OpenAI server's token bucket).

Builds a small benchmark in a temporary folder (``--cases`` per path, LF, RF and RR, and per lesion, edema and
cardiomegaly), starts :class:`MockServer` with ``--latency`` seconds per answer and a token bucket of ``--burst``
requests refilled at ``--rate`` per second (HTTP 429 without ``Retry-After`` when empty, as a rate-limited API
answers), and runs ``percept eval`` at ``--concurrency`` (default 32) with the default retry policy. Prints the
requests, the 429s, the failed cases, the most requests the server saw at once, the wall time and the least wall
time the rate allows (answers / rate).

Usage: ``.venv/bin/python bench/percept_rate_limit.py [--rate 10 --burst 10] [--latency 0.2] [--concurrency 32]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from cxrground.evaluation.percept.runner import EvalSettings, RetryPolicy, run_eval
from cxrground.percept.schema import load_benchmark
from cxrground.testing.mock_bench import make_benchmark
from cxrground.testing.mock_server import MockServer, OraclePolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=15, help="cases per path (LF, RF, RR) and lesion (2)")
    ap.add_argument("--rate", type=float, default=10.0, help="requests per second the API allows")
    ap.add_argument("--burst", type=float, default=10.0, help="requests the API allows at once after a pause")
    ap.add_argument("--latency", type=float, default=0.2, help="seconds per answer")
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench = make_benchmark(Path(tmp) / "bench", {"LF": args.cases, "RF": args.cases, "RR": args.cases}, seed=1)
        oracle = OraclePolicy(load_benchmark(bench))
        with MockServer(oracle, latency=args.latency, rate_limit=(args.rate, args.burst)) as server:
            start = time.perf_counter()
            summary = run_eval(EvalSettings(bench, "openai:bench-vlm"), Path(tmp) / "run", base_url=server.base_url,
                               concurrency=args.concurrency, progress=False, retry=RetryPolicy(timeout=60.0))
            wall = time.perf_counter() - start
    answered = server.statuses[200]
    print(f"rate {args.rate:g}/s (burst {args.burst:g}), latency {args.latency:g} s, concurrency {args.concurrency}: "
          f"{server.requests} requests, {server.statuses[429]} answered 429, {answered} answered; "
          f"{summary['failed_this_run']} failed cases of {summary['n_run']}; at most {server.max_inflight} in flight; "
          f"wall {wall:.1f} s (the rate allows {max(0.0, (answered - args.burst) / args.rate):.1f} s)")


if __name__ == "__main__":
    main()
