"""Train a small CNN that reads how far down each lung reaches on a frontal film, also where the base is white.

The lung U-Net stops where dense basal opacity starts; a shape prior completes a base only if it knows how deep
the patient breathed, which the upper lung does not tell (``bench/lung_shape_prior.py``). This regressor reads
the whole film (chest wall, ribs, diaphragm, gastric bubble, the other lung) and returns the top and the lowest row
of each lung as fractions of the square canvas, ``[top_R, bottom_R, top_L, bottom_L]``
(pre-registration: ``bench/records/lung_depth_preregistration.md``).

Training data (shippable only): the NIH ChestX-ray14 films of the pack with the shipped U-Net's lungs as targets
(films whose lungs fail the plausibility check are left out) and the shippable COVID-19 collection films of the
lung U-Net's training split with their annotated lungs. Every film also appears with simulated dense bases and
effusions inside its lungs (the lung U-Net's ``dense_bases_params``), targets unchanged, so the network must
find the base where the film shows no edge. Held out: one patient fold of the NIH films (10 %), the lung U-Net's
10 shippable validation films, and every CC BY-NC-SA film (never read here).

Run (after ``bench/segment.py --only-real --cache DIR``): ``python bench/lung_depth_fit.py --cache DIR --out FILE``
(about 15 minutes on two threads; an existing FILE is replaced only with ``--overwrite``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from weights_out import add_out_options, refuse_existing

SIZE = 256
COPIES = 2  # dense-base copies per training film


def extents(right: np.ndarray, left: np.ndarray) -> np.ndarray:
    """``[top_R, bottom_R, top_L, bottom_L]`` as fractions of the canvas height."""
    out = []
    for m in (right, left):
        rows = np.flatnonzero(m.any(axis=1))
        out += [rows[0] / m.shape[0], (rows[-1] + 1) / m.shape[0]]
    return np.asarray(out, dtype=np.float32)


def to_square(a: np.ndarray) -> np.ndarray:
    """``a`` centred on a zero square of its longer side."""
    n = max(a.shape)
    out = np.zeros((n, n), dtype=a.dtype)
    y0, x0 = (n - a.shape[0]) // 2, (n - a.shape[1]) // 2
    out[y0 : y0 + a.shape[0], x0 : x0 + a.shape[1]] = a
    return out


def square_resize(a: np.ndarray, size: int = SIZE, order: int = 1) -> np.ndarray:
    """``a`` letterboxed to a square (:func:`to_square`) and resampled to ``size`` x ``size``."""
    from scipy import ndimage

    sq = to_square(a).astype(np.float32)
    return ndimage.zoom(sq, (size / sq.shape[0], size / sq.shape[1]), order=order)


def build_net():
    """About 0.6 M parameters: six stride-2 stages (two 3x3 convs each) to 4 x 4, two dense layers."""
    import torch
    from torch import nn

    def stage(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    widths = (16, 24, 32, 48, 64, 96)
    layers, cin = [], 1
    for w in widths:
        layers.append(stage(cin, w))
        cin = w
    torch.manual_seed(0)
    return nn.Sequential(*layers, nn.Flatten(), nn.Dropout(0.2), nn.Linear(96 * 16, 128), nn.ReLU(), nn.Linear(128, 4))


def load_films(cache: Path):
    """(name, split, image 256, right 256, left 256) for every usable film; split in train / val-nih / val-cohen."""
    from cxrground.anatomy.segment.plausibility import lung_problems
    from cxrground.datasets.pack import Pack
    from cxrground.models.lung_unet.data import split_by_patient

    pack = Pack()
    films = []
    nih = pack.nih()
    patients = sorted({r.image_id.split("_")[0] for r in nih})
    held = set(np.asarray(patients)[np.random.default_rng(0).permutation(len(patients))[: len(patients) // 10]])
    for rec in nih:
        d = np.load(cache / f"nih_{rec.image_id}.npz")
        r, lft = d["R"].astype(bool), d["L"].astype(bool)
        if not r.any() or not lft.any() or lung_problems(r, lft):
            continue
        split = "val-nih" if rec.image_id.split("_")[0] in held else "train"
        films.append((f"nih/{rec.image_id}", split, d["px"], r, lft))
    shippable = [r for r in pack.cohen(shippable_only=True) if r.shippable]
    _, val_idx = split_by_patient(shippable, min(10, len(shippable) // 2), 0)
    for i, rec in enumerate(shippable):
        d = np.load(cache / f"cohen_{rec.image_id}.npz")
        films.append((f"cohen/{rec.image_id}", "val-cohen" if i in val_idx else "train", d["px"], d["GR"], d["GL"]))
    out = []
    for name, split, px, r, lft in films:
        out.append((name, split, square_resize(px) / 255.0, square_resize(r, order=0) > 0.5,
                    square_resize(lft, order=0) > 0.5))
    return out


def dense_copies(films, copies: int, seed: int):
    """``copies`` variants of every training film with simulated dense bases (targets unchanged)."""
    from cxrground.errors import InputError
    from cxrground.lesions.lesion_sim import simulate_lesions
    from cxrground.models.lung_unet.config import dense_bases_params

    params = dense_bases_params()
    out = []
    for k, (name, split, img, r, lft) in enumerate(films):
        if split != "train":
            continue
        px = np.clip(np.rint(img * 255), 0, 255).astype(np.uint8)
        for c in range(copies):
            try:
                film = simulate_lesions(px, r, lft, params, seed=seed * 1_000_003 + k * 101 + c)
            except InputError:
                continue
            out.append((f"{name}#dense{c}", split, film.pixels.astype(np.float32) / 255.0, r, lft))
    return out


def _augment(rng: np.random.Generator, imgs: np.ndarray, targets: np.ndarray):
    """Gamma, contrast, brightness and a random scale/shift (targets moved with the image)."""
    import torch
    import torch.nn.functional as F

    n = imgs.shape[0]
    x = np.clip(imgs, 0, 1) ** rng.uniform(0.7, 1.4, (n, 1, 1))
    x = (x - 0.5) * rng.uniform(0.8, 1.2, (n, 1, 1)) + 0.5 + rng.uniform(-0.08, 0.08, (n, 1, 1))
    s = rng.uniform(0.9, 1.1, n)
    ty, tx = rng.uniform(-0.06, 0.06, n), rng.uniform(-0.06, 0.06, n)
    # output pixel (y) samples input at (y - ty) / s about the centre (normalised coordinates in [-1, 1])
    theta = np.zeros((n, 2, 3), np.float32)
    theta[:, 0, 0], theta[:, 1, 1] = 1 / s, 1 / s
    theta[:, 0, 2], theta[:, 1, 2] = -tx * 2 / s, -ty * 2 / s
    grid = F.affine_grid(torch.from_numpy(theta), (n, 1, SIZE, SIZE), align_corners=False)
    out = F.grid_sample(torch.from_numpy(x[:, None].astype(np.float32)), grid, align_corners=False)
    t = targets.copy()
    t = (t - 0.5) * s[:, None] + 0.5 + ty[:, None]
    return out, torch.from_numpy(t.astype(np.float32))


def evaluate(net, films) -> dict[str, float]:
    """Median and 90th-percentile absolute error of the lowest rows, in % of the lung's height."""
    import torch

    net.eval()
    errs = []
    with torch.no_grad():
        for k in range(0, len(films), 32):
            chunk = films[k : k + 32]
            x = torch.from_numpy(np.stack([f[2] for f in chunk])[:, None].astype(np.float32))
            pred = net(x).numpy()
            for f, p in zip(chunk, pred, strict=True):
                t = extents(f[3], f[4])
                for j in (0, 2):
                    errs.append(abs(p[j + 1] - t[j + 1]) / max(1e-3, t[j + 1] - t[j]))
    net.train()
    e = 100 * np.asarray(errs)
    return {"median_pct": round(float(np.median(e)), 2), "p90_pct": round(float(np.percentile(e, 90)), 2),
            "lungs": len(e)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", required=True, help="bench/segment.py --only-real cache of the shipped U-Net")
    add_out_options(parser, "the weights (.pt)", required=True)
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    refuse_existing(parser, [args.out], args.overwrite)

    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    films = load_films(Path(args.cache))
    train = [f for f in films if f[1] == "train"]
    train += dense_copies(films, COPIES, args.seed)
    vals = {s: [f for f in films if f[1] == s] for s in ("val-nih", "val-cohen")}
    vals["val-cohen-dense"] = [(n, "v", im, r, lft) for n, _, im, r, lft in
                               dense_copies([(n, "train", im, r, lft) for n, _, im, r, lft in vals["val-cohen"]],
                                            1, 99)]
    print(f"{len(train)} training films (with dense-base copies), "
          + ", ".join(f"{k} {len(v)}" for k, v in vals.items()) + f"; {time.perf_counter() - t0:.0f} s", flush=True)
    imgs = np.stack([f[2] for f in train]).astype(np.float32)
    targets = np.stack([extents(f[3], f[4]) for f in train])
    net = build_net()
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    for step in range(1, args.steps + 1):
        idx = rng.integers(0, len(train), args.batch)
        x, t = _augment(rng, imgs[idx], targets[idx])
        loss = torch.nn.functional.smooth_l1_loss(net(x), t, beta=0.02)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 250 == 0 or step == args.steps:
            ev = {k: evaluate(net, v) for k, v in vals.items()}
            print(f"step {step} loss {loss.item():.5f} " + json.dumps(ev) + f" {time.perf_counter() - t0:.0f} s",
                  flush=True)
    torch.save({"state_dict": net.state_dict(), "size": SIZE, "steps": args.steps, "seed": args.seed,
                "recipe": vars(args)}, args.out)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
