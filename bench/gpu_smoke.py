"""GPU smoke check: the tiny RadEdit, the SAM deformer, the LISA model, the baseline, the shipped U-Nets and the
YOLO detector.

Each stage builds a random tiny model of the real architecture (nothing is downloaded), runs it once to warm up,
then ``--repeats`` times, and prints the mean wall time per call and the peak device memory of the stage
(``torch.cuda.max_memory_allocated``; on CPU the process's peak resident memory instead)::

    python bench/gpu_smoke.py                          # cuda, bfloat16
    python bench/gpu_smoke.py --device cpu --dtype float32 --size 64 --repeats 1   # CPU smoke check

RadEdit needs diffusers (the ``gen`` extra); a stage whose library is missing prints why and is skipped.

``lisa-train`` trains the tiny LISA model ``--train-steps`` steps through the real trainer on an ILS dataset
built from 6 phantom studies (bfloat16 and gradient checkpointing on a GPU).

``radedit-full`` times one RadEdit edit at full size with random weights (a Stable-Diffusion-2-sized UNet, an
SDXL-sized VAE, a BERT-base text encoder; 100 DDIM steps at strength 0.6, 512 px, classifier-free guidance);
it is not in the default stages (GPU only: about 870M parameters).

``lung-unet`` and ``lesion-unet`` run the shipped weights (the built-in lung segmenter and lesion segmenter, not
tiny models) on ``--unet-batch`` random 256-px canvases per call and print canvases per second and the time of
the network alone over MIMIC-ILS's 192K films (reading, letterboxing and post-processing not included).

``hybridgnet`` and ``cxas`` run the released-size networks of the two segmenter adapters (our own torch code of
HybridGNet and of CXAS's UNet-ResNet50, random weights saved in the released checkpoint forms) through
``get_segmenter`` on one random ``--film``-px film, letterboxing and mask post-processing included.

``hf-vlm`` answers one two-image question through the ``hf:`` client with a tiny random model of each open chat-VLM
family (Qwen2-VL, Qwen2.5-VL, Gemma 3, Idefics3, SmolVLM, InternVL; transformers' real classes).

The two YOLO stages need ultralytics (the ``yolo`` extra, ``.venv-yolo``; run the script with that Python and
``--stages yolo,yolo-train`` there): ``yolo`` is one prediction of a random ``--yolo-model`` through the
pipeline's adapter on a ``--yolo-imgsz`` canvas (float16 on CUDA, ultralytics has no bfloat16 inference);
``yolo-train`` is one training epoch of ``detector train``'s recipe on ``--yolo-films`` synthetic films
letterboxed to ``--yolo-imgsz`` (batch ``--yolo-batch``, bf16 AMP on CUDA) and prints films/s, from which the
time of an epoch over VinDr-CXR's 15,000 training films follows.
"""

from __future__ import annotations

import argparse
import json
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


def _radedit_full(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    """RadEdit at full size with random weights: the time of one edit, not its quality. The UNet has Stable
    Diffusion 2's layout (about 870M parameters) with 768-wide cross-attention (BioViL-T's width; RadEdit's own UNet
    config is not at hand offline), the VAE SDXL-VAE's layout (8x down-sampling), the text encoder BERT-base."""
    import diffusers  # noqa: F401  (ImportError → stage skipped)
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import BertConfig, BertModel

    from cxrground.ils.spatial.radedit import RadEditSynthesizer, save_tiny_radedit

    folder = save_tiny_radedit(work / "radedit_full", text_hidden=768)
    torch.manual_seed(0)
    UNet2DConditionModel(
        sample_size=64, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280, 1280),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3, cross_attention_dim=768,
        attention_head_dim=(5, 10, 20, 20), use_linear_projection=True,
    ).to(torch.bfloat16).save_pretrained(folder / "unet")
    AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, sample_size=1024,
    ).to(torch.bfloat16).save_pretrained(folder / "vae")
    tokenizer_words = len((folder / "tokenizer" / "vocab.txt").read_text().split())
    BertModel(BertConfig(vocab_size=tokenizer_words, max_position_embeddings=512)).to(torch.bfloat16).save_pretrained(
        folder / "text_encoder")
    synth = RadEditSynthesizer(folder, size=512, device=args.device, dtype=args.dtype)  # 100 steps, strength 0.6
    rng = np.random.default_rng(0)
    image = (rng.random((1024, 1024)) * 255).astype(np.uint8)
    edit = np.zeros(image.shape, bool)
    edit[128:-128, 128:-128] = True
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


def _shipped_unet(args: argparse.Namespace, weights: str) -> Callable[[], Any]:
    """One forward pass of a shipped U-Net (real weights) over ``--unet-batch`` random 256-px canvases."""
    from cxrground.anatomy.segment.unet import load_model

    model, meta = load_model(Path(__file__).resolve().parents[1] / "src" / "cxrground" / weights)
    size = int(meta["input"]["size"])
    model = model.to(args.device, getattr(torch, args.dtype))
    batch = torch.randn(args.unet_batch, 1, size, size, device=args.device, dtype=getattr(torch, args.dtype))

    def call() -> Any:
        with torch.inference_mode():
            return model(batch)

    return call


def _lung_unet(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    return _shipped_unet(args, "anatomy/segment/weights/lung_unet_v2.safetensors")


def _lesion_unet(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    return _shipped_unet(args, "lesions/weights/lesion_unet_v1.safetensors")


def _lisa_train(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    """``--train-steps`` steps of the tiny LISA model through the real trainer (``ils train --model lisa``) on an
    ILS dataset built from 6 phantom studies; each call trains from scratch into a new folder."""
    from cxrground.datasets.synthetic import write_cohort
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.config import IlsConfig
    from cxrground.ils.tasks import build_tasks
    from cxrground.models.lisa import train

    cohort = work / "lisa_cohort"
    write_cohort(cohort, 6, seed=0, progress=False)
    tasks, failures = build_tasks(cohort / "files")
    build_dataset(tasks, work / "lisa_ils", IlsConfig(seed=0), BackendSpec(), scan_failures=failures, progress=False)
    runs = iter(range(1000))

    def call() -> Any:
        out = train(work / "lisa_ils", work / f"lisa_run{next(runs)}", images=cohort / "files", seed=0,
                    overrides={"tiny": True, "max_steps": args.train_steps, "max_length": 256},
                    val_split="train", progress=False)
        info = json.loads((out / "checkpoint.json").read_text())
        print(f"{'':10s} trained {info['step']} steps on {args.device}; last loss {info['history'][-1]['loss']:.4f}")
        return out

    return call


def _yolo(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    import ultralytics  # noqa: F401  (ImportError → stage skipped)

    from cxrground.ils.detector.train import ultralytics_offline
    from cxrground.ils.spatial.boxes import YOLOBoxDetector, save_tiny_yolo

    ultralytics_offline(work / "ultralytics")
    weights = save_tiny_yolo(work / "yolo" / "random.pt", args.yolo_model)
    dtype = "float16" if args.device.startswith("cuda") and args.dtype != "float32" else "float32"
    detector = YOLOBoxDetector(weights, imgsz=args.yolo_imgsz, device=args.device, dtype=dtype)
    canvas = (np.random.default_rng(3).random((args.yolo_imgsz, args.yolo_imgsz)) * 255).astype(np.uint8)
    return lambda: detector.detect(canvas)


def _yolo_train(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    import ultralytics  # noqa: F401  (ImportError → stage skipped)

    from cxrground.datasets.synthetic import SynthConfig, write_cohort
    from cxrground.ils.detector.prepare import PrepareSettings, prepare_dataset
    from cxrground.ils.detector.synthetic import export_synthetic_vindr
    from cxrground.ils.detector.train import ultralytics_offline

    ultralytics_offline(work / "ultralytics")
    from ultralytics import YOLO

    cohort = work / "yolo_cohort"
    write_cohort(cohort, args.yolo_films, seed=0, config=SynthConfig(width=args.yolo_imgsz), progress=False)
    export_synthetic_vindr(cohort, work / "yolo_vindr")
    data = prepare_dataset(work / "yolo_vindr" / "train.csv", cohort / "files", work / "yolo_data",
                           PrepareSettings(imgsz=args.yolo_imgsz, val=0.0, test=0.0), workers=4)
    (work / "yolo_data" / "images" / "val").symlink_to(work / "yolo_data" / "images" / "train")
    (work / "yolo_data" / "labels" / "val").symlink_to(work / "yolo_data" / "labels" / "train")
    amp: bool | str = "bf16" if args.device.startswith("cuda") and args.dtype != "float32" else False
    device = "0" if args.device == "cuda" else args.device.removeprefix("cuda:")

    def epoch() -> Any:
        model = YOLO(args.yolo_model)
        return model.train(data=str(data.yaml), epochs=1, imgsz=args.yolo_imgsz, batch=args.yolo_batch,
                           device=device, workers=4, project=str(work / "yolo_runs"), name="run", exist_ok=True,
                           pretrained=False, amp=amp, plots=False, val=False, verbose=False)

    return epoch


def _random_film(side: int) -> Any:
    from cxrground.io.image import CXRImage

    pixels = (np.random.default_rng(5).random((side, side)) * 255).astype(np.uint8)
    return CXRImage(pixels=pixels, path="random.png")


def _hybridgnet(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    """The released-size HybridGNet (random weights, saved in the released state-dict form ``bestMSE.pt``) through
    the ``hybridgnet`` segmenter adapter on one random ``--film``-px film (landmarks, then rasterised masks)."""
    from cxrground.anatomy.segment import get_segmenter
    from cxrground.anatomy.segment.hybridgnet_net import HybridGNet

    torch.manual_seed(0)
    path = work / "hybridgnet" / "bestMSE.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(HybridGNet().state_dict(), path)
    seg = get_segmenter("hybridgnet", weights_path=str(path), device=args.device, dtype=args.dtype)
    film = _random_film(args.film)
    return lambda: seg.segment(film)


def _cxas(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    """The released-size CXAS UNet-ResNet50 (random weights, saved in the cxas package's checkpoint form) through the
    ``cxas`` segmenter adapter on one random ``--film``-px film."""
    from cxrground.anatomy.segment import get_segmenter
    from cxrground.anatomy.segment.cxas_net import CXASUNet

    torch.manual_seed(0)
    folder = work / "cxas"
    folder.mkdir(parents=True, exist_ok=True)
    state = {f"module.{k}": v for k, v in CXASUNet().state_dict().items()}
    torch.save({"model": state}, folder / "UNet_ResNet50_default.pth")
    seg = get_segmenter("cxas", weights_dir=str(folder), device=args.device, dtype=args.dtype)
    film = _random_film(args.film)
    return lambda: seg.segment(film)


def _hf_vlm(args: argparse.Namespace, work: Path) -> Callable[[], Any]:
    """The ``hf:`` client on tiny random chat VLMs of each open family (:mod:`cxrground.testing.vlm_families`): one
    call answers one two-image question with every family's model, each on ``--device`` (bfloat16 on CUDA)."""
    import asyncio
    import base64
    import io

    from PIL import Image

    from cxrground.evaluation.percept.clients.hf import HFClient
    from cxrground.testing.vlm_families import FAMILIES

    def data_url(h: int, w: int) -> str:
        buf = io.BytesIO()
        Image.fromarray((np.random.default_rng(h * w).random((h, w)) * 255).astype(np.uint8)).save(buf, "PNG")
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(56, 84)}},
        {"type": "image_url", "image_url": {"url": data_url(112, 56)}},
        {"type": "text", "text": "Is there an opacity in the left lung? Options: Yes No"}]}]
    clients, shown = {}, []
    for family, (build, _) in sorted(FAMILIES.items()):
        try:
            clients[family] = HFClient(str(build(work / family.replace(".", "_"))), max_tokens=8, device=args.device)
        except Exception as exc:  # a family this transformers cannot build is reported, the others run
            print(f"{'':10s} {family}: not built ({type(exc).__name__}: {exc})")

    def call() -> Any:
        async def ask() -> dict[str, str]:
            return {f: (await c.complete(messages)).content for f, c in clients.items()}

        replies = asyncio.run(ask())
        if not shown:
            shown.append(True)
            for family, client in clients.items():
                model = client._load()[1]
                print(f"{'':10s} {family:11s} on {model.device} {str(model.dtype).removeprefix('torch.')}: "
                      f"{len(replies[family])}-character reply")
        return replies

    return call


STAGES = {"radedit": _radedit, "radedit-full": _radedit_full, "sam": _sam, "lisa": _lisa, "baseline": _baseline,
          "lisa-train": _lisa_train, "lung-unet": _lung_unet,
          "lesion-unet": _lesion_unet, "yolo": _yolo,
          "yolo-train": _yolo_train, "hybridgnet": _hybridgnet, "cxas": _cxas,
          "hf-vlm": _hf_vlm}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: bfloat16 on cuda)")
    p.add_argument("--size", type=int, default=512, help="image side (RadEdit canvas, SAM/LISA/baseline inputs)")
    p.add_argument("--steps", type=int, default=20, help="RadEdit DDIM steps")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--stages", default=",".join(n for n in STAGES if n != "radedit-full"))
    p.add_argument("--train-steps", type=int, default=20, help="steps of the lisa-train stage")
    p.add_argument("--unet-batch", type=int, default=64, help="canvases per call of the shipped U-Net stages")
    p.add_argument("--film", type=int, default=2048, help="side of the random film of the hybridgnet and cxas stages")
    p.add_argument("--yolo-model", default="yolov8s.yaml", help="ultralytics model yaml of the YOLO stages")
    p.add_argument("--yolo-imgsz", type=int, default=1024)
    p.add_argument("--yolo-films", type=int, default=64, help="synthetic films in the yolo-train epoch")
    p.add_argument("--yolo-batch", type=int, default=16)
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
            result = _stage(name, args.device, args.repeats, lambda n=name: STAGES[n](args, Path(tmp)))
            if name.endswith("-unet") and "per_call_s" in result:
                rate = args.unet_batch / result["per_call_s"]
                print(f"{'':10s} {rate:.0f} canvases/s at batch {args.unet_batch} (network only): about "
                      f"{192000 / rate / 60:.1f} min for MIMIC-ILS's 192K films")
            if name == "yolo-train" and "per_call_s" in result:
                rate = args.yolo_films / result["per_call_s"]
                print(f"{'':10s} {rate:.1f} films/s in a {args.yolo_imgsz} px epoch (model build, loader start, "
                      f"final val included): about {15000 / rate / 60:.1f} min per epoch over 15,000 films")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
