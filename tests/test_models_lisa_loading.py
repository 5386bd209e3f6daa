"""Loading options for large LISA checkpoints and the multi-GPU launch configuration (issue 12 item 6), CPU only."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from cxrground.errors import ConfigError  # noqa: E402
from cxrground.io.image import CXRImage  # noqa: E402
from cxrground.models.lisa.config import LisaConfig  # noqa: E402
from cxrground.models.lisa.loading import (  # noqa: E402
    check_loading,
    deepspeed_config,
    parse_device_map,
    quantize_language_model,
    write_launch_files,
)
from cxrground.models.lisa.model import LisaForSegmentation, tiny_arch  # noqa: E402
from cxrground.models.lisa.text import seg_token_id, tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from cxrground.models.lisa.checkpoint import save_checkpoint

    tok = tiny_tokenizer()
    torch.manual_seed(1)
    model = LisaForSegmentation(tiny_arch(len(tok), 64), seg_token_id(tok))
    out = tmp_path_factory.mktemp("load") / "ckpt"
    config = LisaConfig.tiny_defaults(max_new_tokens=4).to_dict()
    save_checkpoint(out, model, tok, {"arch": model.arch, "config": config, "select_layer": -2})
    return out


def test_options_this_machine_cannot_honour_are_clear_errors():
    for quant in ("8bit", "4bit"):
        with pytest.raises(ConfigError, match="needs a CUDA GPU"):
            check_loading("cpu", quant, None, cuda_available=False)
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        check_loading("cuda", "none", None, cuda_available=False)
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        check_loading("cpu", "none", {"language_model": 0}, cuda_available=False)
    with pytest.raises(ConfigError, match="quantize must be"):
        check_loading("cpu", "3bit", None, cuda_available=False)
    with pytest.raises(ConfigError, match="on the GPU"):
        check_loading("cpu", "8bit", None, cuda_available=True)
    check_loading("cpu", "none", "auto", cuda_available=False)
    check_loading("cuda", "4bit", None, cuda_available=True)
    assert parse_device_map('{"": "cpu"}') == {"": "cpu"} and parse_device_map("auto") == "auto"
    with pytest.raises(ConfigError, match="JSON object"):
        parse_device_map("[1, 2]")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_quantized_loading_without_cuda_is_refused(ckpt):
    from cxrground.models.base import load_model

    with pytest.raises(ConfigError, match="CUDA"):
        load_model(ckpt, quantize="8bit")
    with pytest.raises(ConfigError, match="CUDA"):
        load_model(ckpt, device="cuda")


@pytest.mark.parametrize("bits", ["8bit", "4bit"])
def test_language_model_linears_are_replaced_by_bitsandbytes_layers(bits):
    bnb = pytest.importorskip("bitsandbytes")
    tok = tiny_tokenizer()
    model = LisaForSegmentation(tiny_arch(len(tok), 64), seg_token_id(tok))
    linears = [n for n, m in model.language_model.named_modules()
               if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")]
    replaced = quantize_language_model(model, bits)
    assert sorted(replaced) == sorted(linears) and replaced
    cls = bnb.nn.Linear8bitLt if bits == "8bit" else bnb.nn.Linear4bit
    modules = dict(model.language_model.named_modules())
    assert all(isinstance(modules[n], cls) for n in replaced)
    assert type(model.language_model.lm_head) is torch.nn.Linear
    assert type(model.text_hidden_fcs[0]) is torch.nn.Linear and type(model.mm_projector) is torch.nn.Linear
    assert quantize_language_model(model, "none") == []


def test_device_map_dispatch_on_cpu_gives_the_same_prediction(ckpt):
    from cxrground.models.base import load_model

    rng = np.random.default_rng(0)
    image = CXRImage(pixels=rng.integers(0, 255, (40, 52), dtype=np.uint8))
    plain = load_model(ckpt)
    spread = load_model(ckpt, device_map='{"language_model": "cpu", "vision_tower": "cpu", "mm_projector": "cpu", '
                                         '"visual_model": "cpu", "text_hidden_fcs": "cpu"}')
    auto = load_model(ckpt, device_map="auto")
    assert spread.info["loading"]["device_map"]["language_model"] == "cpu" and auto.device == "cpu"
    want = plain.predict(image, "Segment the edema.")
    for other in (spread, auto):
        got = other.predict(image, "Segment the edema.")
        assert got.answer == want.answer and np.array_equal(got.mask, want.mask)


def test_deepspeed_and_accelerate_launch_configuration(tmp_path):
    cfg = LisaConfig(base_model="x")  # the paper configuration: global batch 256
    ds = deepspeed_config(cfg, 2)
    assert ds["train_batch_size"] == 256 and ds["train_micro_batch_size_per_gpu"] == cfg.micro_batch_size
    assert ds["gradient_accumulation_steps"] * cfg.micro_batch_size * 2 == 256
    zero = ds["zero_optimization"]
    assert zero["stage"] == 2 and zero["contiguous_gradients"] and zero["overlap_comm"]
    assert zero["reduce_bucket_size"] == 5e8 and ds["bf16"]["enabled"] and ds["gradient_clipping"] == 1.0
    with pytest.raises(ConfigError, match="multiple"):
        deepspeed_config(LisaConfig(base_model="x", batch_size=24, micro_batch_size=8), 2)
    files = write_launch_files(tmp_path, cfg, 2)
    acc = json.loads(files["accelerate"].read_text())
    assert acc["num_processes"] == 2 and acc["distributed_type"] == "DEEPSPEED"
    assert json.loads(files["deepspeed"].read_text()) == json.loads(json.dumps(ds))
    from accelerate.commands.config.config_args import ClusterConfig

    parsed = ClusterConfig.from_json_file(str(files["accelerate"]))
    assert parsed.num_processes == 2 and str(parsed.distributed_type).endswith("DEEPSPEED")
    ddp = ClusterConfig.from_json_file(str(files["accelerate_ddp"]))  # the built-in data-parallel trainer's launch
    assert ddp.num_processes == 2 and str(ddp.distributed_type).endswith("MULTI_GPU") and not ddp.deepspeed_config
