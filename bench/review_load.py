"""Review app under load: reviewers deciding their queues over keep-alive clients beside idle connections, with
and without a flood of wrong-token requests, against ``cxrground review serve`` in its own process (127.0.0.1).

Run: ``.venv/bin/python bench/review_load.py [--reviewers 8] [--items 400] [--idle 32] [--flood 8]``.
Prints one line per run: decisions acknowledged/refused/lost, latency p50/p95/max, flood requests.
The target is 0 refused, 0 lost and p95 under 300 ms.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from cxrground.testing.review_load import load_db, run_load, served


def main() -> None:
    """Two runs on fresh databases: reviewers + idle connections, then the same with a wrong-token flood."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reviewers", type=int, default=8)
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--idle", type=int, default=32)
    ap.add_argument("--flood", type=int, default=8)
    args = ap.parse_args()
    for flood in (0, args.flood):
        with tempfile.TemporaryDirectory() as tmp:
            db, tokens = load_db(Path(tmp), args.reviewers, args.items)
            with served(db.path) as url:
                result = run_load(db, tokens, url, idle=args.idle, flood=flood)
        print(f"reviewers {args.reviewers}, idle {args.idle}, flood {flood}: {result.summary()}")


if __name__ == "__main__":
    main()
