"""The ILS model as a CheXpercept agent (``ils:CHECKPOINT``) beside the ``random`` and ``oracle`` baselines.

Run after ``make demo`` (which evaluates the three on ``demo_out/percept``, oracle setting ``none``):
``.venv/bin/python bench/percept_ils_agent.py [demo_out/runs/oracle demo_out/runs/random demo_out/runs/ils-baseline]``.
Prints, per run and path (RR / RF / LF), the end-to-end accuracy of each stage (CHEXPERCEPT.md §15: a stage is
correct when all of its questions are) and the mean depth, from :func:`cxrground.evaluation.percept.scoring.score_run`
(no bootstrap).
"""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULT_RUNS = ("demo_out/runs/oracle", "demo_out/runs/random", "demo_out/runs/ils-baseline")


def main() -> None:
    from cxrground.evaluation.percept.scoring import score_run

    runs = [Path(a) for a in sys.argv[1:]] or [Path(r) for r in DEFAULT_RUNS]
    print(f"{'run':<16} {'path':<4} {'stage1':>7} {'stage2':>7} {'stage3':>7} {'stage4':>7} {'depth':>6}  cases")
    for run in runs:
        score = score_run(run, n_boot=0)
        for path, block in score["paths"].items():
            cells = []
            for s in (1, 2, 3, 4):
                acc = block["end_to_end"][f"stage{s}"]["acc"]
                cells.append("–" if acc is None else f"{100 * acc:.1f}")
            depth = block["depth"]["mean"]
            n = block.get("n_cases", block["end_to_end"]["stage1"].get("n", "?"))
            print(f"{run.name:<16} {path:<4} " + " ".join(f"{c:>7}" for c in cells)
                  + f" {'–' if depth is None else f'{depth:.2f}':>6}  {n}")


if __name__ == "__main__":
    main()
