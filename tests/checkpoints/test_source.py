"""Reading checkpoints: folder layouts, lazy tensors, and every bad input with a clear error and nothing written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from posenc.checkpoints import block_from_hf, load_layer, supported_model_types
from posenc.cli import main
from posenc.errors import ConfigError, ModelFileError
from tests.checkpoints.tiny import TINY, llama

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llama(tmp_path_factory.mktemp("llama") / "ckpt")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _state_layer(folder: Path, layer: int) -> dict[str, torch.Tensor]:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder)
    return {k: v for k, v in model.state_dict().items() if f"layers.{layer}.self_attn." in k}


def test_reads_only_the_requested_layer_of_a_sharded_checkpoint(llama_dir: Path) -> None:
    shards = sorted(p.name for p in llama_dir.glob("*.safetensors"))
    assert len(shards) > 3, "the fixture must be sharded"
    loaded = load_layer(llama_dir, layer=2)
    expected = _state_layer(llama_dir, 2)
    assert set(loaded.names.values()) == set(expected)
    for key, name in loaded.names.items():
        torch.testing.assert_close(loaded.tensors[key], expected[name], rtol=0, atol=0)
    # the provenance names every tensor with the sha256 of its stored bytes
    source = loaded.provenance()
    assert (source.kind, source.layer, source.model_type) == ("checkpoint", 2, "llama")
    assert set(source.tensors) == set(expected)
    assert len({*source.tensors.values()}) == len(expected)


def test_legacy_bin_and_in_memory_models_load_the_same_weights(llama_dir: Path, tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(llama_dir)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    shutil.copy(llama_dir / "config.json", legacy)
    torch.save(model.state_dict(), legacy / "pytorch_model.bin")
    reference = load_layer(llama_dir, 1).state
    for source in (legacy, model):
        state = load_layer(source, 1).state
        assert state.keys() == reference.keys()
        for key in state:
            torch.testing.assert_close(state[key], reference[key], rtol=0, atol=0)


def test_block_from_hf_equals_the_checkpoint_module(llama_dir: Path) -> None:
    block, loaded = block_from_hf(llama_dir, layer=1)
    reference = loaded.reference()
    hidden = torch.randn(2, 5, TINY["hidden_size"])
    positions = torch.arange(3, 8).expand(2, 5)
    past = torch.randn(2, 2, 3, 16), torch.randn(2, 2, 3, 16)
    got, want = block(hidden, positions, *past), reference(hidden, positions, *past)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2-0.5B"])
def test_hub_id_is_refused_with_the_download_command(name: str) -> None:
    with pytest.raises(ConfigError, match=r"never downloads.*--local-dir"):
        load_layer(name)


def test_missing_folder_and_file_instead_of_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_layer(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a checkpoint folder"):
        load_layer(tmp_path / "config.json")


def test_config_without_weights(llama_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "cfg"
    folder.mkdir()
    shutil.copy(llama_dir / "config.json", folder)
    with pytest.raises(ModelFileError, match="no weights"):
        load_layer(folder)


def test_missing_shard(llama_dir: Path, tmp_path: Path) -> None:
    folder = _copy(llama_dir, tmp_path / "ckpt")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    victim = index["weight_map"]["model.layers.0.self_attn.q_proj.weight"]
    (folder / victim).unlink()
    with pytest.raises(ModelFileError, match=f"{victim}.*missing"):
        load_layer(folder)


def test_a_missing_shard_that_holds_none_of_the_layer_is_not_needed(llama_dir: Path, tmp_path: Path) -> None:
    """Only the shards holding the requested layer's tensors are read: another missing shard does not matter, and
    a missing one that holds the layer is named when its tensor is read."""
    folder = _copy(llama_dir, tmp_path / "ckpt")
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    needed = {file for name, file in weight_map.items() if "layers.1.self_attn." in name}
    spare = sorted(set(weight_map.values()) - needed)
    assert spare, "the fixture must have shards without layer 1's attention"
    for file in spare:
        (folder / file).unlink()
    loaded = load_layer(folder, 1)
    torch.testing.assert_close(loaded.state, load_layer(llama_dir, 1).state, rtol=0, atol=0)
    victim = sorted(needed)[0]
    (folder / victim).unlink()
    with pytest.raises(ModelFileError, match=f"in shard {re.escape(victim)}, which is missing.*download"):
        load_layer(folder, 1)


def test_index_naming_a_file_outside_the_folder_is_refused(llama_dir: Path, tmp_path: Path) -> None:
    folder = _copy(llama_dir, tmp_path / "ckpt")
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.layers.0.self_attn.q_proj.weight"] = "../elsewhere.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(ModelFileError, match="outside"):
        load_layer(folder)


@pytest.mark.parametrize("layer", [-1, 3, 1000])
def test_layer_out_of_range(llama_dir: Path, layer: int) -> None:
    with pytest.raises(ConfigError, match=r"out of range.*3 layers \(0 \.\. 2\)"):
        load_layer(llama_dir, layer)


def test_unsupported_model_type_lists_the_supported_ones(llama_dir: Path, tmp_path: Path) -> None:
    folder = _copy(llama_dir, tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "bart_of_the_future"}))
    with pytest.raises(ConfigError, match="not supported") as info:
        load_layer(folder)
    for model_type in supported_model_types():
        assert model_type in str(info.value)


def test_tensor_shapes_that_do_not_fit_the_config(llama_dir: Path, tmp_path: Path) -> None:
    folder = _copy(llama_dir, tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    # 8 kv heads claimed, 2 stored: k_proj is [32, 64] in the file but the config implies [128, 64]
    (folder / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 4}))
    with pytest.raises(ConfigError, match=r"k_proj.weight.*shape \[32, 64\].*needs \[64, 64\]"):
        block_from_hf(folder, layer=0)


def test_corrupt_shard(llama_dir: Path, tmp_path: Path) -> None:
    folder = _copy(llama_dir, tmp_path / "ckpt")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    victim = folder / index["weight_map"]["model.layers.1.self_attn.k_proj.weight"]
    victim.write_bytes(victim.read_bytes()[:20])
    with pytest.raises(ModelFileError, match=r"corrupt|truncated"):
        load_layer(folder, 1)


def test_cli_bad_inputs_exit_2_and_write_nothing(
    llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    cases = [
        (["--hf-model", str(tmp_path / "missing")], "does not exist"),
        (["--hf-model", "org/model"], "never downloads"),
        (["--hf-model", str(llama_dir), "--layer", "7"], "out of range"),
        (["--hf-model", str(llama_dir), "--hidden-size", "32"], "drop --hidden-size"),
        (["--layer", "1", "--scheme", "rope"], "--layer selects a layer of --hf-model"),
    ]
    for extra, message in cases:
        assert main(["export", *extra, "-o", str(out / "m.onnx")]) == 2, extra
        assert message in capsys.readouterr().err
    assert not out.exists()
