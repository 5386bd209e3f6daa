"""Adapter for Microsoft RadEdit (``microsoft/radedit``), the reference "normal image" editor of ILS §8.

Weights are read from a local directory only (no download at run time). Expected layout, each a
``save_pretrained`` / ``huggingface-cli download`` snapshot:

```
model_dir/
  unet/          microsoft/radedit, subfolder "unet"   (diffusers UNet2DConditionModel)
  vae/           stabilityai/sdxl-vae                   (diffusers AutoencoderKL)
  text_encoder/  microsoft/BiomedVLP-BioViL-T           (transformers AutoModel, trust_remote_code)
  tokenizer/     microsoft/BiomedVLP-BioViL-T           (transformers AutoTokenizer)
```

Editing (documented choices; the paper gives no sampler settings, ILS §19.3): the canvas is resized to
``size``² (512, RadEdit's resolution), encoded by the VAE, noised to ``strength·T`` with a seeded
``torch.Generator``, and denoised with DDIM (linear betas, ``timestep_spacing="trailing"``, ε-prediction)
for ``steps·strength`` steps under classifier-free guidance ``guidance`` with the prompt
:data:`~cxrground.vocab.ils_templates.RADEDIT_PROMPT`. After every step the latents outside the (latent
resolution) edit mask are replaced by the input latents noised to the same level (blended latent
diffusion), so only lungs ∪ heart are edited; finally the decoded image is resized back and every pixel
outside the edit mask is copied from the input, so ``x̂ = x`` there exactly. Same inputs + seed ⇒ same
``x̂`` on the same hardware and library versions.

Device and dtype: ``device`` (``cuda``, ``cuda:1``, ``cpu``; default ``cuda`` when available) and ``dtype``
(``float32``, ``bfloat16``, ``float16``; default ``float32``) apply to the UNet, the VAE and the text encoder;
the latents blend and the scheduler run in that dtype, the seeded noise is drawn on the CPU in float32 (same
noise on every device). Options may come as strings (``--synthesizer-opt steps=50``).

Without ``diffusers`` / ``transformers`` / ``torch`` (the ``gen`` extra) or without the weights, the adapter
raises :class:`~cxrground.errors.ConfigError` saying what to install or download and where. The real-library
path is tested on a random tiny model of the same architecture saved in this layout (:func:`save_tiny_radedit`):
a diffusers ``UNet2DConditionModel`` and ``AutoencoderKL`` and a BERT text encoder with its tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np
from PIL import Image

from cxrground.errors import ConfigError
from cxrground.hf_offline import model_kwargs
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.vocab.ils_templates import RADEDIT_PROMPT

__all__ = ["DTYPES", "RADEDIT_SUBFOLDERS", "RadEditSynthesizer", "save_tiny_radedit"]

#: Sub-folders the local model directory must contain, with where each comes from.
RADEDIT_SUBFOLDERS: Final[dict[str, str]] = {
    "unet": "microsoft/radedit (subfolder unet)",
    "vae": "stabilityai/sdxl-vae",
    "text_encoder": "microsoft/BiomedVLP-BioViL-T",
    "tokenizer": "microsoft/BiomedVLP-BioViL-T",
}

#: The floating-point types an adapter may run in (``dtype=`` option).
DTYPES: Final[tuple[str, ...]] = ("float32", "bfloat16", "float16")

#: ``editor(image, mask, *, prompt, steps, guidance, seed, strength) -> image`` on ``size``² uint8 arrays.
Editor = Callable[..., np.ndarray]


class RadEditSynthesizer:
    """RadEdit normal-image synthesis (see the module docstring for the layout and the sampler)."""

    name = "radedit"

    def __init__(
        self,
        model_dir: str | Path,
        steps: int | str = 100,
        guidance: float | str = 7.5,
        seed: int | str = 0,
        strength: float | str = 0.6,
        size: int | str = 512,
        device: str | None = None,
        dtype: str = "float32",
        prompt: str = RADEDIT_PROMPT,
        editor: Editor | None = None,
    ) -> None:
        try:
            steps, seed, size = int(steps), int(seed), int(size)
            guidance, strength = float(guidance), float(strength)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"RadEdit options steps/seed/size must be integers, guidance/strength numbers: {exc}"
                              ) from None
        if steps < 1:
            raise ConfigError(f"RadEdit steps must be >= 1, got {steps}")
        if not 0.0 < strength <= 1.0:
            raise ConfigError(f"RadEdit strength must be in (0, 1], got {strength}")
        if guidance < 0:
            raise ConfigError(f"RadEdit guidance must be >= 0, got {guidance}")
        if seed < 0:
            raise ConfigError(f"RadEdit seed must be >= 0, got {seed}")
        if size < 8 or size % 8:
            raise ConfigError(f"RadEdit size must be a positive multiple of 8, got {size}")
        if dtype not in DTYPES:
            raise ConfigError(f"RadEdit dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.model_dir = Path(model_dir)
        self.steps = int(steps)
        self.guidance = float(guidance)
        self.seed = int(seed)
        self.strength = float(strength)
        self.size = int(size)
        self.device = device
        self.dtype = dtype
        self.prompt = prompt
        self._editor = editor
        if editor is None:
            _check_model_dir(self.model_dir)
            _check_packages(self.model_dir)

    # --- NormalSynthesizer -----------------------------------------------------------------------
    def synthesize(self, image: np.ndarray, edit_mask: np.ndarray, regions: Any = None) -> np.ndarray:
        """``x̂`` (uint8, same shape as ``image``); pixels outside ``edit_mask`` equal the input."""
        x = np.asarray(image)
        if x.ndim != 2:
            raise ValueError(f"image must be a 2-D grey array, got shape {x.shape}")
        edit = as_mask(edit_mask, "edit mask")
        check_same_shape(("image", x), ("edit mask", edit))
        x8 = np.clip(x, 0, 255).astype(np.uint8)
        if not edit.any():
            return x8.copy()
        h, w = x8.shape
        small = np.asarray(Image.fromarray(x8).resize((self.size, self.size), Image.Resampling.BILINEAR))
        small_mask = np.asarray(
            Image.fromarray(edit.astype(np.uint8) * 255).resize((self.size, self.size), Image.Resampling.NEAREST)
        ) > 0
        editor = self._editor or self._load()
        edited = np.asarray(editor(small, small_mask, prompt=self.prompt, steps=self.steps, guidance=self.guidance,
                                   seed=self.seed, strength=self.strength))
        if edited.shape != (self.size, self.size):
            raise ValueError(f"RadEdit returned shape {edited.shape}, expected {(self.size, self.size)}")
        back = np.asarray(Image.fromarray(np.clip(edited, 0, 255).astype(np.uint8)).resize((w, h),
                                                                                         Image.Resampling.BILINEAR))
        return np.where(edit, back, x8).astype(np.uint8)

    def provenance(self) -> dict[str, Any]:
        """Backend name, weights location and sampler settings."""
        return {
            "name": self.name,
            "model_dir": str(self.model_dir),
            "settings": {"steps": self.steps, "guidance": self.guidance, "seed": self.seed,
                         "strength": self.strength, "size": self.size, "dtype": self.dtype, "device": self.device,
                         "prompt": self.prompt, "scheduler": "DDIM linear trailing eps, blended latents"},
        }

    # --- loading ---------------------------------------------------------------------------------
    def _load(self) -> Editor:
        if self._editor is None:
            self._editor = _DiffusersEditor(self.model_dir, self.device, self.dtype)
        return self._editor


def _check_model_dir(model_dir: Path) -> None:
    hint = "; ".join(f"{k}/ ← {v}" for k, v in RADEDIT_SUBFOLDERS.items())
    if not model_dir.is_dir():
        raise ConfigError(
            f"RadEdit weights not found: {model_dir} is not a directory. Download them on a machine with "
            f"internet (huggingface-cli download ...) into that folder with the sub-folders {hint}"
        )
    missing = [k for k in RADEDIT_SUBFOLDERS if not (model_dir / k).is_dir()]
    if missing:
        raise ConfigError(
            f"RadEdit model folder {model_dir} lacks {', '.join(f'{m}/' for m in missing)}; expected {hint}"
        )


def _check_packages(model_dir: Path) -> None:
    import importlib.util

    missing = [p for p in ("diffusers", "transformers", "torch") if importlib.util.find_spec(p) is None]
    if missing:
        raise ConfigError(
            f"RadEdit needs {', '.join(missing)}: pip install 'cxrground[gen]' (diffusers, transformers, torch) "
            f"(weights are read from {model_dir})"
        )


def _transformers_dtype(dtype: Any) -> dict[str, Any]:
    """``{"dtype": dtype}`` for transformers ≥ 4.56, ``{"torch_dtype": dtype}`` before (the argument's old name)."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}


class _DiffusersEditor:
    """The blended-latent DDIM editor built from the local RadEdit components."""

    def __init__(self, model_dir: Path, device: str | None, dtype: str) -> None:
        try:
            import torch
            from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:
            raise ConfigError(
                "RadEdit needs diffusers, transformers and torch: pip install 'cxrground[gen]' "
                f"(missing: {exc.name}); weights are read from {model_dir}"
            ) from exc
        self.torch = torch
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = getattr(torch, dtype)
        kw: dict[str, Any] = {"local_files_only": True}
        self.unet = UNet2DConditionModel.from_pretrained(model_dir / "unet", torch_dtype=self.dtype, **kw).to(
            self.device)
        self.vae = AutoencoderKL.from_pretrained(model_dir / "vae", torch_dtype=self.dtype, **kw).to(self.device)
        self.text_encoder = AutoModel.from_pretrained(model_dir / "text_encoder", trust_remote_code=True,
                                                      **_transformers_dtype(self.dtype), **model_kwargs()
                                                      ).to(self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir / "tokenizer", model_max_length=128,
                                                       trust_remote_code=True, **kw)
        self.scheduler = DDIMScheduler(beta_schedule="linear", clip_sample=False, prediction_type="epsilon",
                                       timestep_spacing="trailing", steps_offset=1)
        for m in (self.unet, self.vae, self.text_encoder):
            m.eval()

    def _embed(self, texts: list[str]):
        tok = self.tokenizer(texts, padding="max_length", truncation=True, max_length=128, return_tensors="pt")
        out = self.text_encoder(input_ids=tok.input_ids.to(self.device),
                                attention_mask=tok.attention_mask.to(self.device))
        hidden = getattr(out, "last_hidden_state", None)
        return hidden if hidden is not None else out[0]

    def __call__(self, image: np.ndarray, mask: np.ndarray, *, prompt: str, steps: int, guidance: float,
                 seed: int, strength: float) -> np.ndarray:
        torch = self.torch
        with torch.no_grad():
            gen = torch.Generator(device="cpu").manual_seed(int(seed))
            img = torch.from_numpy(image.astype(np.float32) / 127.5 - 1.0)[None, None].repeat(1, 3, 1, 1)
            img = img.to(self.device, self.dtype)
            z0 = self.vae.encode(img).latent_dist.mean * self.vae.config.scaling_factor
            lat_mask = torch.nn.functional.interpolate(
                torch.from_numpy(mask.astype(np.float32))[None, None], size=z0.shape[-2:], mode="nearest"
            ).to(self.device, self.dtype)
            cond = self._embed([prompt])
            uncond = self._embed([""])
            self.scheduler.set_timesteps(steps)
            start = round((1.0 - strength) * len(self.scheduler.timesteps))
            timesteps = self.scheduler.timesteps[start:]
            noise = torch.randn(z0.shape, generator=gen, dtype=torch.float32).to(self.device, self.dtype)
            z = self.scheduler.add_noise(z0, noise, timesteps[:1])
            for i, t in enumerate(timesteps):
                inp = torch.cat([z, z])
                eps = self.unet(inp, t, encoder_hidden_states=torch.cat([uncond, cond])).sample
                e_u, e_c = eps.chunk(2)
                z = self.scheduler.step(e_u + guidance * (e_c - e_u), t, z).prev_sample
                last = i + 1 == len(timesteps)
                keep = z0 if last else self.scheduler.add_noise(z0, noise, timesteps[i + 1 : i + 2])
                z = lat_mask * z + (1.0 - lat_mask) * keep
            out = self.vae.decode(z / self.vae.config.scaling_factor).sample
            grey = out.float().mean(dim=1)[0].clamp(-1, 1)
            return ((grey.cpu().numpy() + 1.0) * 127.5).round().astype(np.uint8)


#: Words of the tiny test tokenizer's vocabulary (BERT WordPiece; the prompt's words and the special tokens).
_TINY_WORDS: Final[tuple[str, ...]] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "no", "acute",
                                       "cardiopulmonary", "process", "normal", "chest", "x", "-", "ray", ".")


def save_tiny_radedit(model_dir: str | Path, *, seed: int = 0, text_hidden: int = 32) -> Path:
    """Save a random tiny RadEdit in the documented layout (the real classes, a few thousand parameters).

    ``unet/``: a diffusers ``UNet2DConditionModel`` (4 latent channels, cross-attention on the text states);
    ``vae/``: an ``AutoencoderKL`` (3 channels in and out, 4 latent channels, down-sampling ×2);
    ``text_encoder/`` and ``tokenizer/``: a BERT ``BertModel`` and WordPiece tokenizer (the BioViL-T text model
    is a BERT; its 128-token prompt length is kept). For tests and smoke checks: the output is noise.
    """
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import BertConfig, BertModel, BertTokenizerFast

    root = Path(model_dir)
    root.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        UNet2DConditionModel(
            sample_size=32, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=text_hidden, attention_head_dim=4, norm_num_groups=4,
        ).save_pretrained(root / "unet")
        AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16), layers_per_block=1,
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=4,
            sample_size=64,
        ).save_pretrained(root / "vae")
        BertModel(BertConfig(vocab_size=len(_TINY_WORDS), hidden_size=text_hidden, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=2 * text_hidden, max_position_embeddings=128),
                  ).save_pretrained(root / "text_encoder")
    (root / "tokenizer").mkdir(exist_ok=True)
    vocab = root / "tokenizer" / "vocab.txt"
    vocab.write_text("\n".join(_TINY_WORDS) + "\n", encoding="utf-8")
    BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True, model_max_length=128).save_pretrained(
        root / "tokenizer")
    return root
