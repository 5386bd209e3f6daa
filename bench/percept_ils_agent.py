"""The ILS model as a CheXpercept agent (``ils:CHECKPOINT``) beside the ``random`` and ``oracle`` baselines.

Run after ``make demo`` (which evaluates the three on ``demo_out/percept``, oracle setting ``none``):
``.venv/bin/python bench/percept_ils_agent.py [demo_out/runs/oracle demo_out/runs/random demo_out/runs/ils-baseline]``.
Prints, per run, path (RR / RF / LF) and scoring view (``end_to_end``; ``oracle_passed``: the raw correctness of
each stage, whatever the earlier stages answered, CHEXPERCEPT.md §15), the accuracy of each stage and the mean
depth, from :func:`cxrground.evaluation.percept.scoring.score_run` (no bootstrap).
"""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULT_RUNS = ("demo_out/runs/oracle", "demo_out/runs/random", "demo_out/runs/ils-baseline")


def main() -> None:
    from cxrground.evaluation.percept.scoring import score_run

    runs = [Path(a) for a in sys.argv[1:]] or [Path(r) for r in DEFAULT_RUNS]
    print(f"{'run':<14} {'path':<4} {'view':<13} {'stage1':>7} {'stage2':>7} {'stage3':>7} {'stage4':>7} {'depth':>6}")
    for run in runs:
        score = score_run(run, n_boot=0)
        for path, block in score["paths"].items():
            for view in ("end_to_end", "oracle_passed"):
                cells = []
                for s in (1, 2, 3, 4):
                    acc = block[view][f"stage{s}"]["acc"]
                    cells.append("–" if acc is None else f"{100 * acc:.1f}")
                depth = block["depth"]["mean"] if view == "end_to_end" else None
                print(f"{run.name:<14} {path:<4} {view:<13} " + " ".join(f"{c:>7}" for c in cells)
                      + f" {'' if depth is None else f'{depth:.2f}':>6}")


if __name__ == "__main__":
    main()
