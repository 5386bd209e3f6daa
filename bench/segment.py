"""Segmentation benchmark: the shipped lung U-Net on the pack's evaluation rows, its CPU speed, and the
heart estimate against the synthetic phantoms' exact hearts.

Also the U-Net's lung Dice on synthetic phantoms (exact masks; seed 1000, never trained on).

Run: ``.venv/bin/python bench/segment.py [--phantoms 50] [--nc 0] [--synthetic 40] [--threads 2]``
(``--nc 0`` = all CC BY-NC-SA rows; ``--synthetic 0`` skips the phantom Dice). Rows that need the pack
(``CXRGROUND_PACK`` or ``../shared/data/cxr-pack-v1``) are skipped with a note when it is missing.
Prints one line per measurement.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from foundation import timed  # the bench scripts share one timing helper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--phantoms", type=int, default=50, help="synthetic phantoms for the heart estimate")
    parser.add_argument("--nc", type=int, default=0, help="NC evaluation rows to use (0 = all)")
    parser.add_argument("--synthetic", type=int, default=40, help="phantoms (seed 1000) for the U-Net lung Dice")
    parser.add_argument("--synthetic-seed", type=int, default=1000, help="seed of those phantoms")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the U-Net")
    args = parser.parse_args()

    import torch

    from cxrground.anatomy import cardiothoracic_ratio
    from cxrground.anatomy.segment import UNetLungSegmenter, score_heart_estimates
    from cxrground.anatomy.segment.builtin import heart_from_lungs
    from cxrground.anatomy.segment.unet import predict_logits
    from cxrground.datasets.pack import Pack, PackMissingError
    from cxrground.datasets.synthetic import SynthConfig, generate_study
    from cxrground.models.lung_unet import evaluate_records, evaluate_synthetic

    torch.set_num_threads(args.threads)
    seg = UNetLungSegmenter(threads=args.threads)
    model, meta = seg._ensure()
    print(f"model {meta['name']}  sha256 {meta['sha256'][:16]}...  params {meta['parameters']:,}  "
          f"torch threads {torch.get_num_threads()}")

    # --- speed ------------------------------------------------------------------------------------
    size = int(meta["input"]["size"])
    canvas = np.random.default_rng(0).normal(size=(1, size, size)).astype(np.float32)
    for threads in sorted({1, args.threads}):
        t = timed(lambda threads=threads: predict_logits(model, canvas, threads=threads), 20)
        print(f"{f'U-Net forward, 1 image at {size}x{size}, {threads} thread(s)':<58} {t * 1000:9.1f} ms/image")
    print(f"  (load average now {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs: other processes inflate these)")

    # --- real lungs -------------------------------------------------------------------------------
    try:
        pack = Pack()
    except PackMissingError as exc:
        pack = None
        print(f"pack rows skipped: {exc}")
    if pack is not None:
        nc = [r for r in pack.cohen() if not r.shippable]
        if args.nc:
            nc = nc[: args.nc]
        im = nc[0].read()
        t = timed(lambda: seg.segment(im), 5)
        print(f"{f'segment() incl. mapping + heart, {im.shape[1]}x{im.shape[0]} image':<58} {t * 1000:9.1f} ms/image")
        start = time.perf_counter()
        res = evaluate_records(seg, nc)
        dt = time.perf_counter() - start
        print(f"NC evaluation rows (CC BY-NC-SA, never trained on): n={res['n']}  ({dt:.0f} s)")
        print(f"  Dice mean {res['dice_mean']:.4f}   right {res['dice_right_mean']:.4f}   "
              f"left {res['dice_left_mean']:.4f}")
        print(f"  Dice median {res['dice_median']:.4f}   right {res['dice_right_median']:.4f}   "
              f"left {res['dice_left_median']:.4f}   min {res['dice_min']:.4f}   images < 0.8: {res['below_0_8']}")

        # heart estimate on real lungs: no truth exists; report the CTR it implies
        ctr_truth, ctr_unet = [], []
        for rec in pack.cohen()[:: max(1, len(pack.cohen()) // 60)]:
            image = rec.read()
            r, lft = rec.lungs(image.shape)
            heart, info = heart_from_lungs(r, lft)
            ctr_truth.append(info.get("ctr", 0.0) if heart is not None else 0.0)
            m = seg.segment(image)
            ctr_unet.append(cardiothoracic_ratio(m.heart, m.right_lung, m.left_lung) if m.heart is not None else 0.0)
        for label, vals in (("pack lung masks", ctr_truth), ("U-Net lungs", ctr_unet)):
            a = np.asarray(vals)
            print(f"heart estimate on real {label} (n={a.size}, no heart truth): CTR median {np.median(a):.3f} "
                  f"IQR {np.percentile(a, 25):.3f}-{np.percentile(a, 75):.3f}, below 0.30: {(a < 0.3).mean():.0%}")

    # --- lungs on synthetic phantoms -----------------------------------------------------------------
    if args.synthetic:
        start = time.perf_counter()
        res = evaluate_synthetic(seg, args.synthetic, args.synthetic_seed)
        dt = time.perf_counter() - start
        trained = (meta.get("data", {}).get("synthetic_train") or {}).get("seed")
        note = f"training phantoms: seed {trained}" if trained is not None else "no phantoms in training"
        print(f"synthetic phantoms (seed {args.synthetic_seed}, {note}): n={res['n']}  ({dt:.0f} s)")
        print(f"  Dice mean {res['dice_mean']:.4f}   right {res['dice_right_mean']:.4f}   "
              f"left {res['dice_left_mean']:.4f}   min {res['dice_min']:.4f}   images < 0.8: {res['below_0_8']}")

    # --- heart estimate vs phantom hearts ----------------------------------------------------------
    cfg = SynthConfig(prevalence={"cardiomegaly": 0.5})
    cases, status = [], []
    start = time.perf_counter()
    for i in range(args.phantoms):
        s = generate_study(0, i, cfg)
        m = s.anatomy_masks
        cases.append((m["right_lung"], m["left_lung"], m["heart"]))
        status.append(s.truth.heart_status)
    score = score_heart_estimates(cases)
    per = np.asarray(score.per_case)
    st = np.asarray(status)
    print(f"heart estimate vs phantom hearts (seed 0, n={score.n}, {time.perf_counter() - start:.0f} s): "
          f"Dice mean {score.dice_mean:.4f} median {score.dice_median:.4f}; CTR MAE {score.ctr_mae:.4f} "
          f"bias {score.ctr_bias:+.4f} Pearson r {score.ctr_pearson:.4f}")
    for group in ("normal", "borderline", "enlarged"):
        sel = st == group
        if sel.any():
            err = np.abs(per[sel, 2] - per[sel, 1])
            print(f"  {group:<10} n={int(sel.sum()):3d}  Dice {per[sel, 0].mean():.4f}  CTR MAE {err.mean():.4f}  "
                  f"true CTR {per[sel, 1].mean():.3f}  estimated {per[sel, 2].mean():.3f}")


if __name__ == "__main__":
    main()
