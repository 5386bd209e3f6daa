"""Loading options for large LISA checkpoints (issue 12 item 6) and the multi-GPU launch configuration.

- **Quantisation** (``quantize``: ``none`` | ``8bit`` | ``4bit``): the language model's ``Linear`` layers
  (``lm_head`` excluded, as transformers' bitsandbytes integration does) are replaced by bitsandbytes
  ``Linear8bitLt`` (LLM.int8, threshold 6.0) or ``Linear4bit`` (NF4, compute dtype bf16); the weights are
  quantised when the model moves to the GPU. CLIP, SAM and ``text_hidden_fcs`` stay in bf16. bitsandbytes
  quantisation needs CUDA: on a machine without it :func:`check_loading` raises a :class:`ConfigError` saying so.
- **device_map** (``auto`` or a JSON object ``{"module prefix": device}``): the model is spread over the
  devices with accelerate (``infer_auto_device_map`` with the decoder / encoder layers kept whole, then
  ``dispatch_model``), whose hooks move activations between devices. A map naming ``cuda`` devices needs CUDA.
- **Multi-GPU training**: ``cxrground ils train`` runs data-parallel when launched by ``torchrun`` or
  ``accelerate launch`` (:mod:`cxrground.models.lisa.distributed`); :func:`accelerate_ddp_config` is the
  ``accelerate launch`` configuration for that (one process per GPU, no DeepSpeed). :func:`deepspeed_config` is
  the DeepSpeed ZeRO stage-2 configuration of ILS.md §17.4 (bf16, contiguous gradients, overlapped
  communication, 5e8 buckets, clipping 1.0; micro batch × accumulation × GPUs = the global batch) and
  :func:`accelerate_config` the ``accelerate launch`` configuration that points at it, under which the trainer
  runs ZeRO-2 (:mod:`cxrground.models.lisa.zero`, which derives the same settings from the training
  configuration and the world size rather than reading the file); :func:`write_launch_files` writes all three.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError

__all__ = [
    "NO_SPLIT_MODULES",
    "QUANTIZATIONS",
    "accelerate_config",
    "accelerate_ddp_config",
    "check_loading",
    "deepspeed_config",
    "dispatch",
    "parse_device_map",
    "quantize_language_model",
    "write_launch_files",
]

#: ``quantize`` choices.
QUANTIZATIONS: Final[tuple[str, ...]] = ("none", "8bit", "4bit")
#: Module classes a device map never splits (one transformer block stays on one device).
NO_SPLIT_MODULES: Final[list[str]] = ["LlamaDecoderLayer", "CLIPEncoderLayer", "SamVisionLayer",
                                      "SamTwoWayAttentionBlock"]


def parse_device_map(device_map: str | Mapping[str, Any] | None) -> str | dict[str, Any] | None:
    """``None``, ``"auto"`` or a ``{prefix: device}`` dict (a JSON string is parsed)."""
    if device_map is None or isinstance(device_map, Mapping):
        return dict(device_map) if device_map is not None else None
    text = str(device_map).strip()
    if text in ("", "none"):
        return None
    if text == "auto":
        return "auto"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"device_map must be 'auto' or a JSON object, got {text!r}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"device_map must be 'auto' or a JSON object, got {text!r}")
    return value


def _names_cuda(device_map: str | dict[str, Any] | None, device: str) -> bool:
    if str(device).startswith("cuda"):
        return True
    if isinstance(device_map, dict):
        return any(isinstance(v, int) or str(v).startswith("cuda") for v in device_map.values())
    return False


def check_loading(device: str, quantize: str, device_map: str | dict[str, Any] | None,
                  cuda_available: bool | None = None) -> None:
    """Refuse, with a clear message, options this machine cannot honour (no CUDA, no bitsandbytes)."""
    if quantize not in QUANTIZATIONS:
        raise ConfigError(f"quantize must be one of {QUANTIZATIONS}, got {quantize!r}")
    if cuda_available is None:
        import torch

        cuda_available = bool(torch.cuda.is_available())
    if quantize != "none":
        if not cuda_available:
            raise ConfigError(f"{quantize} loading (bitsandbytes) needs a CUDA GPU and this machine has none "
                              "(torch.cuda.is_available() is False); load with quantize=none instead")
        if importlib.util.find_spec("bitsandbytes") is None:
            raise ConfigError(f"{quantize} loading needs bitsandbytes: pip install bitsandbytes")
        if str(device) == "cpu" and device_map is None:
            raise ConfigError(f"{quantize} weights live on the GPU: use device=cuda or a device_map")
    if _names_cuda(device_map, device) and not cuda_available:
        raise ConfigError("a CUDA device was requested (device or device_map) but this machine has no CUDA GPU")


def quantize_language_model(model: Any, quantize: str, compute_dtype: Any = None) -> list[str]:
    """Replace the language model's ``Linear`` layers (not ``lm_head``) by bitsandbytes layers; returns their names.

    The weights stay unquantised until the model is moved to a CUDA device.
    """
    if quantize == "none":
        return []
    import bitsandbytes as bnb
    import torch
    from torch import nn

    compute_dtype = compute_dtype or torch.bfloat16
    replaced = []
    for parent_name, parent in list(model.language_model.named_modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear) or name == "lm_head":
                continue
            bias = child.bias is not None
            if quantize == "8bit":
                new = bnb.nn.Linear8bitLt(child.in_features, child.out_features, bias=bias, has_fp16_weights=False,
                                          threshold=6.0)
                new.weight = bnb.nn.Int8Params(child.weight.data.to(torch.float16), requires_grad=False,
                                               has_fp16_weights=False)
            else:
                new = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=bias, compute_dtype=compute_dtype,
                                        quant_type="nf4")
                new.weight = bnb.nn.Params4bit(child.weight.data.to(compute_dtype), requires_grad=False,
                                               quant_type="nf4")
            if bias:
                new.bias = nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, name, new)
            replaced.append(f"{parent_name}.{name}" if parent_name else name)
    return replaced


def dispatch(model: Any, device_map: str | dict[str, Any], dtype: Any = None) -> dict[str, Any]:
    """Spread ``model`` over devices with accelerate; returns the device map used."""
    from accelerate import dispatch_model, infer_auto_device_map

    if device_map == "auto":
        device_map = infer_auto_device_map(model, no_split_module_classes=NO_SPLIT_MODULES, dtype=dtype)
    assert isinstance(device_map, dict)
    dispatch_model(model, device_map=device_map)
    return dict(device_map)


def deepspeed_config(config: Any, num_gpus: int) -> dict[str, Any]:
    """DeepSpeed ZeRO-2 settings of ILS.md §17.4 for ``num_gpus`` GPUs (global batch = ``config.batch_size``)."""
    if num_gpus < 1:
        raise ConfigError(f"num_gpus must be >= 1, got {num_gpus}")
    per_step = config.micro_batch_size * num_gpus
    if config.batch_size % per_step:
        raise ConfigError(f"batch_size {config.batch_size} is not a multiple of micro_batch_size × GPUs = {per_step}")
    return {
        "train_batch_size": config.batch_size,
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "gradient_accumulation_steps": config.batch_size // per_step,
        "gradient_clipping": config.grad_clip,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": True,
                              "reduce_scatter": True, "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8},
    }


def accelerate_config(num_gpus: int, deepspeed_file: str) -> dict[str, Any]:
    """The ``accelerate launch --config_file`` content for a one-machine DeepSpeed run."""
    return {"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "num_machines": 1,
            "num_processes": int(num_gpus), "machine_rank": 0, "mixed_precision": "bf16",
            "deepspeed_config": {"deepspeed_config_file": deepspeed_file, "zero3_init_flag": False},
            "use_cpu": False}


def accelerate_ddp_config(num_gpus: int) -> dict[str, Any]:
    """The ``accelerate launch --config_file`` content for the built-in data-parallel trainer on one machine."""
    return {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_machines": 1,
            "num_processes": int(num_gpus), "machine_rank": 0, "mixed_precision": "no", "gpu_ids": "all",
            "use_cpu": False}


def write_launch_files(out: str | Path, config: Any, num_gpus: int) -> dict[str, Path]:
    """Write ``ds_config.json``, ``accelerate_config.json`` (DeepSpeed) and ``accelerate_ddp.json`` (data-parallel,
    for ``cxrground ils train``) into ``out`` (accelerate reads JSON configs)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ds = out / "ds_config.json"
    ds.write_text(json.dumps(deepspeed_config(config, num_gpus), indent=1), encoding="utf-8")
    acc = out / "accelerate_config.json"
    acc.write_text(json.dumps(accelerate_config(num_gpus, str(ds.resolve())), indent=1), encoding="utf-8")
    ddp = out / "accelerate_ddp.json"
    ddp.write_text(json.dumps(accelerate_ddp_config(num_gpus), indent=1), encoding="utf-8")
    return {"deepspeed": ds, "accelerate": acc, "accelerate_ddp": ddp}
