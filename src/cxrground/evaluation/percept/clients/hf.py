"""``hf:MODEL_DIR``: a local transformers chat VLM (``AutoProcessor`` + ``AutoModelForImageTextToText``).

transformers and torch are imported on first use only, with ``local_files_only=True`` (nothing is
downloaded). OpenAI-format messages are converted by :func:`to_hf_messages` (data URLs decoded to PIL
images, ``{"type": "image"}`` parts, system text kept as a system turn); the processor's chat template
renders them. Generation runs in a worker thread, one request at a time (one model in memory), greedy when
``temperature`` is 0, else sampled with torch's generators seeded from the sample's ``seed`` (forked, so
the global random state is left as it was); ``max_tokens`` becomes ``max_new_tokens``. ``max_images`` (default 7)
must cover the 7 images of an RR conversation; the runner refuses to start otherwise.

``model.generate`` fills every setting it is not given from the model's ``generation_config.json`` (e.g.
``repetition_penalty`` 1.05, ``top_k`` 1 of Qwen2.5-VL-based models). With ``sampling_params="explicit"`` (``auto``, the
default, is explicit here) the client gives it :data:`EXPLICIT_GENERATION` (one beam, no repetition penalty or n-gram
blocking; when sampling also top-p 1 or ``top_p``, no top-k, min-p or typical-p cut), so that only the run's settings
apply; the token settings (EOS, padding, suppressed tokens) still come from the model. ``minimal`` passes only
``max_new_tokens``, ``do_sample`` and, when sampling, ``temperature`` / ``top_p``, leaving the rest to the model's
generation config (as the reference's Hulu-Med run did). :func:`generate_kwargs` maps ``decoding`` to the arguments
of ``generate``.

Families tested on tiny random models of their real classes with a 7-image RR conversation
(``tests/test_percept_eval_hf_families.py``): LLaVA, Qwen2-VL and Qwen2.5-VL (image tokens follow each image's
size), Gemma 3 and MedGemma (same architecture), Idefics3 and SmolVLM, InternVL in the transformers layout
(``*-hf`` checkpoints; the original ``trust_remote_code`` InternVL with its own ``chat()`` is not supported). Their
video processors need torchvision; without it :func:`load_processor` builds the image-only processor.

The model runs on ``device`` (default: ``cuda`` when available, else ``cpu``), in bfloat16 on CUDA and float32
on CPU; the processor's floating-point outputs (pixel values) are cast to the model's dtype. A folder that
lacks ``config.json`` is refused when the client is made; one that transformers cannot load as a processor +
image-text-to-text model raises :class:`~cxrground.errors.ConfigError` on the first request, which stops the
run (rather than failing every case one by one).

Cache identity: ``{"kind": "hf", "fingerprint"}`` with :func:`cxrground.llm.model_fingerprint` of the folder
(weights, config, tokenizer; not its path), computed when the client is made.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError
from cxrground.evaluation.percept.clients.decoding import resolve_sampling_params
from cxrground.hf_offline import model_kwargs
from cxrground.llm import Completion, PermanentError, model_fingerprint

__all__ = ["EXPLICIT_GENERATION", "HFClient", "generate_kwargs", "load_processor", "to_hf_messages"]

#: The generation settings of ``sampling_params="explicit"`` (recorded in ``decoding``): neutral values that keep
#: the model's generation config from applying its own (transformers' names; ``top_k`` 0 = off).
EXPLICIT_GENERATION: Final[dict[str, float | int]] = {"num_beams": 1, "repetition_penalty": 1.0,
                                                      "no_repeat_ngram_size": 0, "top_p": 1.0, "top_k": 0,
                                                      "min_p": 0.0, "typical_p": 1.0}
#: Settings that apply to sampling only (given to ``generate`` only when sampling, as transformers expects).
_SAMPLING_ONLY: Final[tuple[str, ...]] = ("top_p", "top_k", "min_p", "typical_p")
_ALWAYS: Final[tuple[str, ...]] = ("num_beams", "repetition_penalty", "no_repeat_ngram_size")


def generate_kwargs(decoding: dict[str, Any]) -> dict[str, Any]:
    """The generation arguments of ``decoding``: ``max_new_tokens``, ``do_sample`` (temperature > 0), the settings
    of :data:`EXPLICIT_GENERATION` it holds, and when sampling ``temperature`` and its sampling-only settings."""
    temperature = float(decoding["temperature"])
    kwargs: dict[str, Any] = {"max_new_tokens": int(decoding["max_tokens"]), "do_sample": temperature > 0}
    kwargs.update({k: decoding[k] for k in _ALWAYS if k in decoding})
    if temperature > 0:
        kwargs["temperature"] = temperature
        kwargs.update({k: decoding[k] for k in _SAMPLING_ONLY if k in decoding})
    return kwargs


def _decode_image(url: str) -> Any:
    from PIL import Image

    if not url.startswith("data:image/"):
        raise PermanentError(f"hf client accepts only data URLs, got {url[:40]!r}")
    data = base64.b64decode(url.split(",", 1)[1])
    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB")


def to_hf_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages → transformers chat-template messages with PIL images (order kept)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) or content is None:
            parts = [{"type": "text", "text": content or ""}]
        else:
            parts = []
            for p in content:
                if p.get("type") == "text":
                    parts.append({"type": "text", "text": p["text"]})
                elif p.get("type") == "image_url":
                    parts.append({"type": "image", "image": _decode_image(p["image_url"]["url"])})
                else:
                    raise PermanentError(f"unsupported message part {p.get('type')!r}")
        out.append({"role": m["role"], "content": parts})
    return out


def load_processor(folder: str) -> Any:
    """The folder's ``AutoProcessor``; without torchvision, the image-only form of a processor that also handles video.

    transformers' video processors (Qwen2-VL / Qwen2.5-VL, InternVL, SmolVLM) need torchvision, and
    ``AutoProcessor`` refuses the whole processor without it. The harness sends images only, so the processor
    is then built from its tokenizer, image processor, settings (``processor_config.json``) and chat template
    with no video processor; a request with a video would fail.
    """
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(folder, local_files_only=True)
    except ImportError as exc:
        if "torchvision" not in str(exc).lower():
            raise
        return _image_only_processor(Path(folder), exc)


def _processor_settings(root: Path) -> dict[str, Any]:
    """The saved processor settings (``processor_config.json``, else the ``processor_class`` in the image config)."""
    import json

    for name in ("processor_config.json", "preprocessor_config.json"):
        path = root / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("processor_class"):
                return data
    return {}


def _chat_template(root: Path, tokenizer: Any) -> str | None:
    import json

    if (root / "chat_template.jinja").is_file():
        return (root / "chat_template.jinja").read_text(encoding="utf-8")
    if (root / "chat_template.json").is_file():
        return json.loads((root / "chat_template.json").read_text(encoding="utf-8")).get("chat_template")
    return getattr(tokenizer, "chat_template", None)


class _NoVideoProcessor:
    """Stands in for a video processor that needs torchvision: no frame defaults, and any other use is an error."""

    num_frames = None
    fps = None

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"video input needs the model's video processor, which needs torchvision ({name})")


def _image_only_processor(root: Path, exc: ImportError) -> Any:
    import inspect

    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    settings = _processor_settings(root)
    cls = getattr(transformers, str(settings.get("processor_class", "")), None)
    parts = set(cls.get_attributes()) if cls is not None else set()
    if "video_processor" not in parts or parts - {"image_processor", "tokenizer", "video_processor"}:
        raise exc

    class ImageOnlyProcessor(cls):  # type: ignore[misc, valid-type]
        """The processor with :class:`_NoVideoProcessor` in place of its video processor."""

        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and isinstance(argument, _NoVideoProcessor):
                return _NoVideoProcessor
            return super().check_argument_for_proper_class(argument_name, argument)

    tokenizer = AutoTokenizer.from_pretrained(root, local_files_only=True)
    image_processor = AutoImageProcessor.from_pretrained(root, local_files_only=True)
    accepted = set(inspect.signature(cls.__init__).parameters) - parts - {"self", "chat_template", "kwargs"}
    options = {k: v for k, v in settings.items() if k in accepted}
    return ImageOnlyProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=_NoVideoProcessor(),
                              chat_template=_chat_template(root, tokenizer), **options)


class HFClient:
    """A local transformers VLM; the model is loaded on the first request."""

    kind = "hf"

    def __init__(self, model_dir: str, *, temperature: float = 0.0, max_tokens: int = 8192,
                 top_p: float | None = None, max_images: int = 7, device: str | None = None,
                 sampling_params: str = "auto", **_: Any) -> None:
        sampling_params = resolve_sampling_params(sampling_params)
        if not Path(model_dir).is_dir():
            raise ConfigError(f"hf model folder not found: {model_dir}")
        if not (Path(model_dir) / "config.json").is_file():
            raise ConfigError(f"{model_dir} is not a transformers model folder (no config.json)")
        self.model = str(model_dir)
        self.max_images = int(max_images)
        self.decoding: dict[str, Any] = {"temperature": float(temperature), "max_tokens": int(max_tokens)}
        if sampling_params == "explicit":
            self.decoding.update(EXPLICIT_GENERATION)
        if top_p is not None:
            self.decoding["top_p"] = float(top_p)
        self.device = device
        self.fingerprint = model_fingerprint(model_dir)
        self._loaded: tuple[Any, Any] | None = None
        self._lock = asyncio.Lock()

    @property
    def identity(self) -> dict[str, Any]:
        """Kind and the fingerprint of the model folder."""
        return {"kind": self.kind, "fingerprint": self.fingerprint}

    def cache_context(self, question: Any, case_id: str) -> None:
        """None: the answer depends on the messages only."""
        return None

    def _load(self) -> tuple[Any, Any]:
        if self._loaded is None:
            try:
                import torch
                import transformers
                from transformers import AutoModelForImageTextToText
            except ImportError as exc:
                raise ConfigError(f"hf: models need torch and transformers (the 'vlm' extra): {exc}") from None

            device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
            dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
            # transformers < 4.56 names the argument torch_dtype (deprecated since)
            major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
            dtype_kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
            try:
                processor = load_processor(self.model)
                model = AutoModelForImageTextToText.from_pretrained(self.model, **model_kwargs(),
                                                                    **{dtype_kw: dtype})
            except Exception as exc:  # any loading failure means the folder is unusable: stop the run
                raise ConfigError(f"cannot load {self.model} as a transformers chat VLM (AutoProcessor + "
                                  f"AutoModelForImageTextToText): {type(exc).__name__}: {exc}") from exc
            if getattr(processor, "chat_template", None) is None:
                raise ConfigError(f"the processor in {self.model} has no chat template")
            self._loaded = (processor, model.to(device).eval())
        return self._loaded

    def _generate(self, messages: Sequence[dict[str, Any]]) -> Completion:
        import torch

        processor, model = self._load()
        inputs = processor.apply_chat_template(to_hf_messages(messages), add_generation_prompt=True, tokenize=True,
                                               return_dict=True, return_tensors="pt")
        inputs = inputs.to(model.device, dtype=model.dtype)  # floating tensors only: ids stay integers
        with torch.inference_mode():
            out = model.generate(**inputs, **generate_kwargs(self.decoding))
        n_in = int(inputs["input_ids"].shape[1])
        new = out[0, n_in:]
        text = processor.decode(new, skip_special_tokens=True)
        return Completion(text, {"prompt_tokens": n_in, "completion_tokens": int(new.shape[0])}, self.model)

    def _seeded(self, messages: Sequence[dict[str, Any]], seed: int | None) -> Completion:
        """:meth:`_generate`, with torch's generators forked and seeded when sampling with a seed."""
        if seed is None or self.decoding["temperature"] <= 0:
            return self._generate(messages)
        import torch

        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(seed))
            return self._generate(messages)

    async def complete(self, messages: Sequence[dict[str, Any]], question: Any = None, case_id: str = "",
                       seed: int | None = None) -> Completion:
        """Generate the answer to the last user message (one generation at a time)."""
        async with self._lock:
            return await asyncio.to_thread(self._seeded, messages, seed)

    async def aclose(self) -> None:
        """Drop the model."""
        self._loaded = None
