"""GPU smoke check: the tiny RadEdit, the SAM deformer, the LISA model and the baseline on one device and dtype.

Each stage builds a random tiny model of the real architecture (nothing is downloaded), runs it once to warm up,
then ``--repeats`` times, and prints the mean wall time per call and the peak device memory of the stage
(``torch.cuda.max_memory_allocated``; on CPU the process's peak resident memory instead)::

    python bench/gpu_smoke.py                          # cuda, bfloat16
    python bench/gpu_smoke.py --device cpu --dtype float32 --size 64 --repeats 1   # CPU smoke check

RadEdit needs diffusers (the ``gen`` extra); a stage whose library is missing prints why and is skipped.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_mib(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _stage(name: str, device: str, repeats: int, setup: Callable[[], Callable[[], Any]]) -> dict[str, Any]:
    """Run ``setup()`` (returns the call to time), warm up once, time ``repeats`` calls; print one line."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        call = setup()
    except ImportError as exc:
        print(f"{name:10s} skipped: {exc}")
        return {"stage": name, "skipped": str(exc)}
    call()
    _sync(device)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(repeats):
        call()
    _sync(device)
    per_call = (time.perf_counter() - t1) / repeats
    peak = _peak_mib(device)
    where = "peak CUDA MiB" if device.startswith("cuda") else "peak RSS MiB"
    print(f"{name:10s} load+first {load_s:7.3f} s   per call {per_call:7.3f} s   {where} {peak:9.1f}")
    return {"stage": name, "load_first_s": load_s, "per_call_s": per_call, "peak_mib": peak}


def _radedit(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    import diffusers  # noqa: F401  (ImportError → stage skipped)

    from cxrground.ils.spatial.radedit import RadEditSynthesizer, save_tiny_radedit

    folder = save_tiny_radedit(work / "radedit")
    synth = RadEditSynthesizer(folder, steps=args.steps, size=args.size, device=args.device, dtype=args.dtype)
    rng = np.random.default_rng(0)
    image = (rng.random((args.size, args.size)) * 255).astype(np.uint8)
    edit = np.zeros(image.shape, bool)
    edit[args.size // 8 : -args.size // 8, args.size // 8 : -args.size // 8] = True
    return lambda: synth.synthesize(image, edit)


def _sam(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    from cxrground.percept.deform.sam import SamDeformer, save_tiny_sam

    deformer = SamDeformer(save_tiny_sam(work / "sam"), device=args.device, dtype=args.dtype)
    side = max(args.size, 64)
    image = (np.random.default_rng(1).random((side, side)) * 255).astype(np.uint8)
    yy, xx = np.mgrid[:side, :side]
    mask = (yy - side / 2) ** 2 + (xx - side / 2) ** 2 <= (side / 4) ** 2
    everywhere = np.ones(mask.shape, bool)
    exp, con = [(int(side * 0.8), side // 2)], [(int(side * 0.35), side // 2)]
    return lambda: deformer.deform(image, mask, everywhere, everywhere, exp, con, np.random.default_rng(0))


def _lisa(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    from cxrground.io.image import CXRImage
    from cxrground.models.lisa.config import LisaConfig
    from cxrground.models.lisa.infer import LisaPredictor
    from cxrground.models.lisa.model import LisaForSegmentation, tiny_arch
    from cxrground.models.lisa.text import seg_token_id, tiny_tokenizer

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = LisaForSegmentation(tiny_arch(len(tok), 64), seg_token_id(tok)).eval()
    model = model.to(args.device, getattr(torch, args.dtype))
    predictor = LisaPredictor(model, tok, LisaConfig.tiny_defaults(max_new_tokens=8), device=args.device)
    image = CXRImage((np.random.default_rng(2).random((args.size, args.size)) * 255).astype(np.uint8))
    return lambda: predictor.predict(image, "Segment the edema in the right lung.")


def _baseline(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    from cxrground.models.baseline.conditioning import encode, parse
    from cxrground.models.baseline.config import BaselineConfig
    from cxrground.models.baseline.net import build_net

    size = max(32, args.size // 32 * 32)
    cfg = BaselineConfig().with_overrides({"size": str(size)})
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    net = build_net(cfg).to(args.device, dtype).eval()
    n = 8
    image = torch.randn(n, 1, size, size, device=args.device, dtype=dtype)
    anatomy = (torch.rand(n, 12, size, size, device=args.device) > 0.5).to(dtype)
    cond = torch.from_numpy(np.stack([encode(parse("Segment the edema in the right lung."))] * n)).to(
        args.device, dtype)

    def call() -> Any:
        with torch.no_grad():
            return net(image, anatomy, cond)

    return call


STAGES = {"radedit": _radedit, "sam": _sam, "lisa": _lisa, "baseline": _baseline}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: bfloat16 on cuda)")
    p.add_argument("--size", type=int, default=512, help="image side (RadEdit canvas, SAM/LISA/baseline inputs)")
    p.add_argument("--steps", type=int, default=20, help="RadEdit DDIM steps")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--stages", default=",".join(STAGES))
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available; run with --device cpu for a CPU smoke check", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    print(f"device {args.device} ({gpu}), dtype {args.dtype}, torch {torch.__version__}, size {args.size}, "
          f"RadEdit steps {args.steps}, repeats {args.repeats}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.stages.split(","):
            _stage(name, args.device, args.repeats, lambda n=name: STAGES[n](args, Path(tmp)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
