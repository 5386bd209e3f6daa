"""The CPU baseline ILS model on a synthetic cohort: train, score the test split, time inference.

Run: ``.venv/bin/python bench/ils_baseline.py [--studies 160] [--epochs 18 | --epochs 0 --budget-min 8]``.
Steps:

1. generate a synthetic cohort (:mod:`cxrground.datasets.synthetic`) and build an ILS dataset from it with the
   default backends (rules structurer, lung U-Net, pseudo-normal synthesizer, anomaly boxes); the ILS split
   (train / val / test) is by subject, so no study is in two splits;
2. train the baseline (``--model baseline`` defaults, working size 128) for ``--epochs`` epochs (default 18,
   about 6 minutes on 2 idle cores), or with ``--epochs 0`` for as many epochs as fit in ``--budget-min`` (the
   count is fixed before training from a timed warm-up, so the schedule is complete; it then depends on the
   machine's load);
3. predict the test split (free mode: the masks are what the model outputs, no teacher forcing) and score it
   with :func:`cxrground.evaluation.ils.evaluate_dataset` (native resolution);
4. score three trivial predictors the same way: all-empty masks with negative answers; both lungs (from the
   shipped lung U-Net) with positive answers; the union of the instruction's location-label regions (both
   lungs for global instructions) with positive answers;
5. time CPU inference per image at the working size, batch 1 (one instruction per image, image already
   decoded; includes the lung U-Net), and print the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import tempfile
import time
from pathlib import Path

import numpy as np


def _calibrate(config, n_steps: int = 4) -> float:
    """Seconds per training sample of the network at ``config`` (forward + backward + step), timed."""
    import torch

    from cxrground.models.baseline.net import build_net
    from cxrground.models.baseline.training import compute_loss

    torch.set_num_threads(config.threads)
    torch.manual_seed(0)
    net = build_net(config)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    n, s = config.batch_size, config.size
    batch = {"image": torch.randn(n, 1, s, s), "anatomy": torch.zeros(n, 12, s, s), "cond": torch.zeros(n, 20),
             "mask": torch.zeros(n, s, s), "presence": torch.zeros(n), "li_lesion": -torch.ones(n, dtype=torch.long),
             "certainty": -torch.ones(n, dtype=torch.long), "location": torch.zeros(n, 10),
             "location_valid": torch.zeros(n, dtype=torch.bool)}
    times = []
    for _ in range(n_steps + 1):
        start = time.perf_counter()
        loss, _ = compute_loss(net(batch["image"], batch["anatomy"], batch["cond"]), batch, config)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:])) / n


def _trivial_predictions(dataset: Path, images: Path, out: Path, kind: str) -> None:
    """Predictions of a trivial model (``empty`` / ``lungs`` / ``location``) for the test split."""
    from cxrground.anatomy.ils_locations import ils_location_masks, location_union
    from cxrground.anatomy.segment.builtin import UNetLungSegmenter
    from cxrground.ils.predictions import PredictionWriter
    from cxrground.io.image import read_image
    from cxrground.models.baseline.conditioning import parse, render_answer
    from cxrground.models.baseline.data import load_pairs

    seg = UNetLungSegmenter(estimate_heart=False)
    cache: dict[str, dict[str, np.ndarray]] = {}
    with PredictionWriter(out) as writer:
        for pair in load_pairs(dataset, "test"):
            parsed = parse(pair.instruction)
            if pair.image_path not in cache:
                image = read_image(images / pair.image_path)
                if kind == "empty":
                    cache[pair.image_path] = {"lung": np.zeros(image.shape, bool)}
                else:
                    lungs = seg.segment(image)
                    cache[pair.image_path] = ils_location_masks(lungs.right_lung, lungs.left_lung)
            regions = cache[pair.image_path]
            if kind == "empty":
                writer.write(pair.pair_id, render_answer(parsed, False), regions["lung"])
                continue
            labels = parsed.locations if (kind == "location" and parsed.locations) else ["lung"]
            answer = render_answer(parsed, True, locations=["right lung", "left lung"])
            writer.write(pair.pair_id, answer, location_union(regions, labels))


def _summary_row(name: str, result: dict) -> str:
    seg, txt = result["segmentation"], result["text"]

    def pct(v: float | None) -> str:
        return "–" if v is None else f"{100 * v:.1f}"

    return (f"| {name} | {pct(seg['gIoU'])} | {pct(seg['cIoU'])} | {pct(seg['N-Acc'])} | {pct(seg['Dice'])} | "
            f"{pct(txt['total']['accuracy'])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--studies", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0, help="Cohort, dataset and training seed.")
    parser.add_argument("--epochs", type=int, default=18,
                        help="Training epochs (fixed, so results do not depend on the machine's load); "
                             "0 = as many as fit in --budget-min, calibrated on this machine.")
    parser.add_argument("--budget-min", type=float, default=8.0, help="Wall-clock budget for training (minutes).")
    parser.add_argument("--max-epochs", type=int, default=60)
    parser.add_argument("--latency-n", type=int, default=30, help="Images timed for the latency figures.")
    parser.add_argument("--work", type=Path, default=None, help="Working folder (default: a new temp folder).")
    parser.add_argument("--set", dest="settings", action="append", default=[], help="KEY=VALUE config override.")
    args = parser.parse_args()

    from cxrground.datasets.synthetic import write_cohort
    from cxrground.evaluation.ils import evaluate_dataset, format_report
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.config import IlsConfig
    from cxrground.ils.tasks import build_tasks
    from cxrground.io.image import read_image
    from cxrground.models.baseline import load_model, train
    from cxrground.models.baseline.config import BaselineConfig
    from cxrground.models.baseline.data import load_pairs
    from cxrground.models.predict import predict_split

    t_all = time.perf_counter()
    work = args.work or Path(tempfile.mkdtemp(prefix="cxrground-baseline-bench-"))
    cohort, dataset, images = work / "cohort", work / "ils", work / "cohort" / "files"
    start = time.perf_counter()
    write_cohort(cohort, args.studies, seed=args.seed, progress=False)
    tasks, failures = build_tasks(images)
    summary = build_dataset(tasks, dataset, IlsConfig(seed=args.seed), BackendSpec(), scan_failures=failures,
                            progress=False)
    data = json.loads((dataset / "mimic_ils_instruction_answer.json").read_text())
    split_counts = {s: (len(v), sum(len(st["instruction_answer_pairs"]["positive_pairs"]) for st in v.values()),
                        sum(len(st["instruction_answer_pairs"]["negative_pairs"]) for st in v.values()))
                    for s, v in data.items()}
    print(f"# Baseline ILS model bench\n\nwork folder: {work}\n")
    print(f"cohort + dataset: {args.studies} synthetic studies -> {summary.studies_in_dataset} in the dataset, "
          f"{summary.pairs} pairs ({time.perf_counter() - start:.0f} s); split by subject: "
          + "; ".join(f"{s}: {n} studies, {p} pos / {q} neg" for s, (n, p, q) in split_counts.items()))

    overrides = dict(kv.split("=", 1) for kv in args.settings)
    config = BaselineConfig().with_overrides(overrides)
    n_pos = sum(1 for p in load_pairs(dataset, "train") if p.positive)
    if args.epochs > 0:
        epochs = args.epochs
        print(f"training: {epochs} epochs of {2 * n_pos} samples (fixed by --epochs)")
    else:
        per_sample = _calibrate(config)
        epoch_s = 2 * n_pos * per_sample * 1.15 + 1.0  # + validation and checkpointing
        epochs = max(1, min(args.max_epochs, math.floor(args.budget_min * 60 / epoch_s)))
        print(f"calibration: {1000 * per_sample:.1f} ms per training sample -> {epochs} epochs of {2 * n_pos} "
              f"samples in a {args.budget_min:g} min budget")
    start = time.perf_counter()
    ckpt = train(dataset, work / "ckpt", images=images, seed=args.seed,
                 overrides={**overrides, "epochs": str(epochs)}, progress=False)
    train_s = time.perf_counter() - start
    info = json.loads((ckpt / "checkpoint.json").read_text())
    print(f"training: {train_s / 60:.1f} min wall (incl. image caching); selected epoch {info['best']['epoch']} "
          f"(val gIoU on the working canvas {info['best']['val_gIoU']})")

    model = load_model(ckpt)
    pred = work / "pred_test.jsonl"
    start = time.perf_counter()
    counts = predict_split(model, dataset, images, "test", pred, progress=False)
    print(f"prediction of the test split: {counts} in {time.perf_counter() - start:.1f} s\n")
    result = evaluate_dataset(dataset, pred, split="test", seg_mode="free", n_boot=1000, seed=0)
    print(format_report(result))

    rows = [_summary_row("baseline (this model)", result)]
    head = load_model(ckpt, overrides={"global_location": "head"})  # the alternative rule for global answers
    head_pred = work / "pred_test_head.jsonl"
    predict_split(head, dataset, images, "test", head_pred, progress=False)
    head_result = evaluate_dataset(dataset, head_pred, split="test", n_boot=0)
    rows.append(_summary_row("baseline, global locations from the location head", head_result))
    glob = {name: r["text"]["per_type"]["global"]["positive"] for name, r in (("mask", result), ("head", head_result))}
    print("global-positive text accuracy: "
          + ", ".join(f"{k} rule {100 * v['accuracy']:.1f} % ({v['correct']}/{v['n']})" for k, v in glob.items()))
    for kind, name in (("empty", "all empty, negative answers"), ("lungs", "both lungs, positive answers"),
                       ("location", "instruction's location region, positive answers")):
        path = work / f"pred_{kind}.jsonl"
        _trivial_predictions(dataset, images, path, kind)
        rows.append(_summary_row(name, evaluate_dataset(dataset, path, split="test", n_boot=0)))
    print("\n## Test split, baseline vs trivial predictors (%)\n")
    print("| predictor | gIoU | cIoU | N-Acc | Dice | text acc. |\n|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))

    pairs = load_pairs(dataset, "test")
    firsts = list({p.image_path: p for p in pairs}.values())[: args.latency_n]
    loaded = [(read_image(images / p.image_path), p.instruction) for p in firsts]
    model.predict(*loaded[0])  # warm-up
    total, prep = [], []
    for image, instruction in loaded:
        t0 = time.perf_counter()
        model.prepare(image)
        t1 = time.perf_counter()
        model.predict(image, instruction)
        t2 = time.perf_counter()
        prep.append(t1 - t0)
        total.append(t2 - t1)
    ms = np.array(total) * 1000
    print(f"\n## CPU inference latency (batch 1, working size {config.size}, {config.threads} threads, "
          f"{len(total)} images of ~{loaded[0][0].shape[1]} px width)\n")
    print(f"per image: mean {ms.mean():.1f} ms, p50 {np.percentile(ms, 50):.1f} ms, p95 {np.percentile(ms, 95):.1f} ms"
          f" (of which lung U-Net + letterbox: mean {1000 * np.mean(prep):.1f} ms)")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB; "
          f"whole bench: {(time.perf_counter() - t_all) / 60:.1f} min")


if __name__ == "__main__":
    main()
