"""``cxrground detector``: train and evaluate the VinDr-CXR YOLO lesion detector; the synthetic VinDr export."""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.common import DIR, OUT_DIR, echo_lines, group, request_options, threads_option, warn
from cxrground.ils.detector.evaluate import DetectorEvalRequest
from cxrground.ils.detector.train import DetectorTrainRequest


@group("detector")
def detector() -> None:
    """The YOLO lesion detector of ILS §8: train it on VinDr-CXR, evaluate it (weights for --detector yolo)."""


@detector.command("train")
@request_options(DetectorTrainRequest)
def train(request: DetectorTrainRequest) -> None:
    """Train on VinDr-CXR's train.csv and films; write OUT/vindr_yolo.pt and its provenance OUT/vindr_yolo.json."""
    from cxrground.ils.detector.train import train_detector

    echo_lines(train_detector(request, warn=warn).summary_lines())


@detector.command("evaluate")
@request_options(DetectorEvalRequest)
@threads_option
def evaluate(request: DetectorEvalRequest) -> None:
    """mAP@0.5 per class on a held-out split, and the ILS view (hit rate and boxes per reported lesion)."""
    from cxrground.ils.detector.evaluate import evaluate_detector

    echo_lines(evaluate_detector(request).lines())


@detector.command("export-synthetic")
@click.option("--cohort", type=DIR, required=True, help="A synthetic cohort folder (cxrground synth).")
@click.option("--out", type=OUT_DIR, required=True, help="Folder for train.csv (VinDr-CXR format), patients.csv and "
              "failures.jsonl: new, empty or an earlier export (a folder holding other files is refused).")
@click.option("--readers", type=click.IntRange(1), default=3, help="Simulated radiologists per film.")
@click.option("--jitter", type=click.FloatRange(0), default=0.03, help="Reader error of each box edge (share of "
              "the box side, standard deviation).")
@click.option("--miss", type=click.FloatRange(0, 1, max_open=True), default=0.1, help="Chance a reader leaves a "
              "lesion out (never all readers).")
@click.option("--seed", type=click.IntRange(0), default=0, help="Seed of the simulated readers.")
def export_synthetic(cohort: Path, out: Path, readers: int, jitter: float, miss: float, seed: int) -> None:
    """Write the synthetic cohort's drawn lesions as VinDr-CXR box annotations (test data for detector train);
    studies whose film is missing are left out and listed in OUT/failures.jsonl."""
    from cxrground.ils.detector.synthetic import export_synthetic_vindr

    echo_lines(export_synthetic_vindr(cohort, out, readers=readers, jitter=jitter, miss=miss, seed=seed)
               .summary_lines(out))


COMMANDS: list[click.Command] = [detector]
