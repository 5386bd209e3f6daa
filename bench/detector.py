"""The YOLO lesion detector trained on the synthetic cohort: mAP@0.5, the ILS view, and ILS builds with it.

Run in the environment with ultralytics (``.venv-yolo``)::

    .venv-yolo/bin/python bench/detector.py [--studies 120] [--epochs 30] [--imgsz 128] [--build-studies 24]

1. A training cohort (``--studies``, seed 0) → its lesions as VinDr-CXR boxes (three simulated readers,
   ``cxrground.ils.detector.synthetic``) → ``detector train`` from scratch (yolov8n.yaml, CPU, split by subject,
   20 % val, 20 % test) → prints the training time, val and test mAP@0.5 per class and the ILS view (hit rate and
   boxes per reported lesion at τ_conf 0.2 / τ_signal 0.2).
2. A separate cohort (``--build-studies``, seed 1, never trained on) built twice with the cohort's true lung/heart
   masks and the normative normal image: once with the built-in anomaly detector, once with the trained YOLO;
   prints gIoU / cIoU of the masks, recall of reported findings and correct negatives
   (:func:`cxrground.ils.quality.score_against_truth`) and the build time of each.

Synthetic films, a small model from scratch and a CPU: the numbers say whether the detector path works and how
far a short training gets, not what a VinDr-CXR-trained detector does on real films.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("YOLO_OFFLINE", "1")

from cxrground.datasets.synthetic import SynthConfig, write_cohort
from cxrground.ils.build import BackendSpec, build_dataset
from cxrground.ils.config import IlsConfig
from cxrground.ils.detector.evaluate import DetectorEvalRequest, evaluate_detector
from cxrground.ils.detector.synthetic import export_synthetic_vindr
from cxrground.ils.detector.train import DetectorTrainRequest, train_detector
from cxrground.ils.quality import format_quality, score_against_truth
from cxrground.ils.tasks import build_tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=120)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--width", type=int, default=256, help="synthetic film width")
    parser.add_argument("--build-studies", type=int, default=24)
    parser.add_argument("--set", action="append", default=["warmup_epochs=0", "mosaic=0"],
                        help="ultralytics training argument KEY=VALUE (default: warmup_epochs=0, mosaic=0)")
    parser.add_argument("--work", type=Path, default=None, help="keep the files here (default: a temp folder)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        train_cohort = work / "train_cohort"
        write_cohort(train_cohort, args.studies, seed=0, config=SynthConfig(width=args.width), progress=False)
        counts = export_synthetic_vindr(train_cohort, work / "vindr", seed=0)
        print(f"training cohort: {args.studies} films, {counts['boxes']} reader boxes")
        extra = dict(item.split("=", 1) for item in args.set)
        request = DetectorTrainRequest(annotations=work / "vindr" / "train.csv", images=train_cohort / "files",
                                       patients=work / "vindr" / "patients.csv", out=work / "det", imgsz=args.imgsz,
                                       epochs=args.epochs, batch=args.batch, model="yolov8n.yaml", device="cpu",
                                       workers=0, threads=1, val=0.2, test=0.2, train_set=extra, overwrite=True)
        start = time.perf_counter()
        trained = train_detector(request)
        seconds = time.perf_counter() - start
        prov = trained.provenance
        print(f"trained yolov8n from scratch: {args.epochs} epochs at {args.imgsz} px, {prov['data']['images']} films, "
              f"{seconds:.0f} s on 1 CPU thread ({seconds / args.epochs:.1f} s/epoch), --set {extra}")
        print(f"val mAP@0.5 (ultralytics): {prov['metrics']['val'].get('mAP50', float('nan')):.3f}")
        report = evaluate_detector(DetectorEvalRequest(weights=trained.weights, data=work / "det", split="test",
                                                       device="cpu"))
        print("\n".join(report.lines()))

        build_cohort = work / "build_cohort"
        write_cohort(build_cohort, args.build_studies, seed=1, config=SynthConfig(width=args.width), progress=False)
        tasks, failures = build_tasks(build_cohort / "files")
        masks = {"root": str(build_cohort / "masks")}
        for name, detector, kwargs in (("built-in anomaly", "anomaly", {}),
                                       ("trained YOLO", "yolo", {"weights_path": str(trained.weights),
                                                                 "device": "cpu"})):
            spec = BackendSpec(segmenter="masks", segmenter_kwargs=masks, detector=detector, detector_kwargs=kwargs)
            out = work / f"ils_{detector}"
            start = time.perf_counter()
            build_dataset(tasks, out, IlsConfig(seed=0), spec, scan_failures=failures, progress=False)
            took = time.perf_counter() - start
            print(f"\n## ILS build of {args.build_studies} unseen films with the {name} detector "
                  f"({took / len(tasks):.2f} s/film)\n")
            print(format_quality(score_against_truth(out, build_cohort)))


if __name__ == "__main__":
    main()
