"""Quantized checkpoints: fp8 block-scaled weights dequantized exactly as transformers' own fp8 dequantization does
(the export's weights and the ``--against-hf`` reference), MXFP4 checkpoints read where their attention is stored
unquantized, and every other quantization refused with its method named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from posenc.checkpoints import load_layer
from posenc.checkpoints.quantized import dequantize_fp8
from posenc.checkpoints.samples import get_sample
from posenc.cli import main
from posenc.errors import ConfigError, ModelFileError
from posenc.export.manifest import load_manifest

pytest.importorskip("transformers")
fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
E4M3_MAX = 448.0


def quantize_fp8(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(e4m3 weight, float32 scale_inv per block)`` of a weight ``[N, K]``, as DeepSeek-V3 ships them: each
    block scaled so its largest magnitude is e4m3's largest (blocks at the edges may be partial)."""
    rows, cols = weight.shape
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    padded = torch.zeros(grid[0] * block[0], grid[1] * block[1])
    padded[:rows, :cols] = weight.float()
    amax = padded.reshape(grid[0], block[0], grid[1], block[1]).abs().amax(dim=(1, 3))
    scale = (amax / E4M3_MAX).clamp(min=1e-12)
    per_element = scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return (weight.float() / per_element).to(torch.float8_e4m3fn), scale


def quantized_checkpoint(folder: Path, section: dict, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """The tiny Qwen3 checkpoint (one safetensors file) with ``quantization_config = section``; ``tensors``
    replace or add stored tensors."""
    get_sample("qwen3").build(folder, shard=None)
    state = load_file(folder / "model.safetensors")
    state.update(tensors or {})
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = section
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def fp8_tensors(folder: Path, block: tuple[int, int], layer: int = 0) -> dict[str, torch.Tensor]:
    """The e4m3 weights and block scales of layer ``layer``'s q/k/v/o of the tiny Qwen3 checkpoint in ``folder``."""
    get_sample("qwen3").build(folder, shard=None)
    state = load_file(folder / "model.safetensors")
    out: dict[str, torch.Tensor] = {}
    for projection in ATTENTION:
        name = f"model.layers.{layer}.self_attn.{projection}.weight"
        out[name], out[f"{name}_scale_inv"] = quantize_fp8(state[name], block)
    return out


FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [16, 16]}


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = fp8_tensors(tmp_path_factory.mktemp("plain") / "ckpt", (16, 16))
    return quantized_checkpoint(tmp_path_factory.mktemp("fp8") / "ckpt", FP8, tensors), tensors


def transformers_dequantized(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """transformers' fp8 dequantization (``Fp8Dequantize``, what ``from_pretrained`` runs without a GPU) of
    ``name``, into float32."""
    return fp8.Fp8Dequantize(None)._dequantize_one(
        tensors[name], tensors[f"{name}_scale_inv"], output_dtype=torch.float32
    )


def test_fp8_export_holds_transformers_dequantized_weights_and_validates(
    fp8_checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, tensors = fp8_checkpoint
    out = tmp_path / "layer0.onnx"
    assert main(["export", "--hf-model", str(folder), "-o", str(out)]) == 0
    weights = load_file(out.with_suffix(".weights.safetensors"))
    for projection in ATTENTION:
        name = f"model.layers.0.self_attn.{projection}.weight"
        expected = transformers_dequantized(tensors, name)
        assert not torch.equal(expected, tensors[name].float())  # the raw e4m3 values are not the weights
        assert torch.equal(weights[f"{projection}.weight.T"].T, expected), projection  # the graph's initializer
    source = load_manifest(out).weights.source
    assert source.quantization is not None
    assert (source.quantization.method, source.quantization.block_size) == ("fp8", [16, 16])
    assert source.quantization.dequantized == sorted(f"model.layers.0.self_attn.{p}.weight" for p in ATTENTION)
    # the --against-hf reference is built from the same dequantized weights, never the raw values
    loaded = load_layer(folder, 0)
    reference = loaded.reference()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(reference.attention.q_proj.weight, transformers_dequantized(tensors, name))
    capsys.readouterr()
    assert main(["validate", str(out), "--against-hf", str(folder), "--shape", "1,8,0"]) == 0
    assert "hf-fp32" in capsys.readouterr().out


def test_fp8_blocks_that_do_not_divide_the_weight_and_e8m0_scales() -> None:
    """Partial edge blocks follow transformers' ``_dequantize_fp8_weight``; E8M0 exponent scales stored as uint8
    follow ``Fp8Dequantize`` (``2 ** (byte - 127)``)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 56, generator=generator)
    raw, scale = quantize_fp8(weight, (16, 24))
    ours = dequantize_fp8(raw, scale, [16, 24], "w")
    assert torch.equal(ours, fp8._dequantize_fp8_weight(raw, scale, [16, 24], torch.float32))
    exponents = torch.randint(100, 140, (3, 2), dtype=torch.uint8, generator=generator)
    raw = (torch.randn(48, 32, generator=generator) * 50).to(torch.float8_e4m3fn)
    expected = fp8.Fp8Dequantize(None)._dequantize_one(raw, exponents, output_dtype=torch.float32)
    assert torch.equal(dequantize_fp8(raw, exponents, [16, 16], "w"), expected)
    with pytest.raises(ModelFileError, match="needs scales of shape"):
        dequantize_fp8(raw, exponents, [32, 16], "w")


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "bitsandbytes int8"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "bitsandbytes nf4"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "gptq 4-bit"),
        ({"quant_method": "awq", "bits": 4}, "awq 4-bit"),
        ({**FP8, "activation_scheme": "static"}, "activation_scheme 'static'"),
    ],
)
def test_other_quantizations_are_refused_naming_the_method(
    section: dict, named: str, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """bitsandbytes int8 as it ships (int8 ``q_proj`` with its ``SCB``), nf4, GPTQ, AWQ: refused before anything is
    exported, with the method and how to dequantize."""
    name = "model.layers.0.self_attn.q_proj.weight"
    int8 = {name: torch.randint(-127, 128, (64, 64), dtype=torch.int8), name[: -len("weight")] + "SCB": torch.ones(64)}
    folder = quantized_checkpoint(tmp_path_factory.mktemp("q") / "ckpt", section, int8)
    with pytest.raises(ConfigError, match=named) as caught:
        load_layer(folder, 0)
    assert "dequantize()" in str(caught.value)
    out = folder.parent / "out.onnx"
    assert main(["export", "--hf-model", str(folder), "-o", str(out)]) == 2
    assert named in capsys.readouterr().err
    assert not out.exists()


def test_quantized_weights_without_a_quantization_config_are_refused(
    fp8_checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    """A config that lost its quantization section: the e4m3 values are not read as weights, nor int8 ones."""
    _, tensors = fp8_checkpoint
    folder = quantized_checkpoint(tmp_path / "fp8", FP8, tensors)
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match=r"float8_e4m3fn while config.json says nothing about quantization"):
        load_layer(folder, 0)


def test_mxfp4_attention_stored_unquantized_loads_and_blocks_are_refused(tmp_path: Path) -> None:
    """gpt-oss's MXFP4 quantizes the MoE experts only: the attention reads as stored (recorded as such); an attention
    tensor stored as MXFP4 blocks is refused (transformers would not load it either)."""
    section = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    folder = quantized_checkpoint(tmp_path / "mxfp4", section)
    loaded = load_layer(folder, 0)
    stored = load_file(folder / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(loaded.tensors["q_proj.weight"], stored)
    record = loaded.provenance().quantization
    assert record is not None
    assert (record.method, record.dequantized) == ("mxfp4", [])
    name = "model.layers.0.self_attn.q_proj.weight"
    state = load_file(folder / "model.safetensors")
    state.pop(name)
    state[f"{name}_blocks"] = torch.zeros(64, 2, 16, dtype=torch.uint8)
    state[f"{name}_scales"] = torch.full((64, 2), 127, dtype=torch.uint8)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelFileError, match="MXFP4 blocks"):
        load_layer(folder, 0)


def test_fp8_layer_equals_from_pretrained(fp8_checkpoint: tuple[Path, dict[str, torch.Tensor]]) -> None:
    """The whole of transformers' loader (``from_pretrained`` in float32 without a GPU dequantizes fp8): the same
    weights bit for bit. Needs accelerate, which transformers' fp8 loader imports."""
    pytest.importorskip("accelerate")
    import transformers

    folder, _ = fp8_checkpoint
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    loaded = load_layer(folder, 0)
    for projection in ATTENTION:
        module = getattr(model.model.layers[0].self_attn, projection)
        assert torch.equal(module.weight, loaded.tensors[f"{projection}.weight"]), projection


@pytest.mark.slow
def test_fp8_traced_export_reads_dequantized_weights(
    fp8_checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    """The traced path reads its tensors through the same reader: dequantized weights, recorded in the manifest."""
    folder, tensors = fp8_checkpoint
    out = tmp_path / "traced.onnx"
    assert main(["export", "--hf-model", str(folder), "--via", "trace", "-o", str(out)]) == 0
    weights = load_file(out.with_suffix(".weights.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(weights["attention.q_proj.weight.T"].T, transformers_dequantized(tensors, name))
    quantization = load_manifest(out).weights.source.quantization
    assert quantization is not None
    assert name in quantization.dequantized
