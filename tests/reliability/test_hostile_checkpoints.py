"""Hostile checkpoints (issue 25): config values checked before use, which weights are read, symlink loops and the
hub cache's blob store, a checkpoint changed since export, and damaged weights named with their file.

Every config finding of the issue is a row of :data:`HOSTILE`: the value is put into a Llama (or Gemma, Qwen2-VL)
config and must be refused with a :class:`~posenc.errors.ConfigError` naming the field and the value, both by
``--hf-config``'s import (:func:`posenc.config.from_hf_config`) and by a checkpoint folder's reader
(:class:`~posenc.checkpoints.source.CheckpointSource`), before transformers or posenc computes with it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from posenc.checkpoints.source import CheckpointSource
from posenc.config import from_hf_config
from posenc.errors import ConfigError, ModelFileError, PosencError

LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 3,
    "max_position_embeddings": 256,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
GEMMA3 = {**LLAMA, "model_type": "gemma3_text", "layer_types": ["sliding_attention", "sliding_attention",
          "full_attention"], "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
          "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}  # fmt: skip
QWEN2_VL = {**LLAMA, "model_type": "qwen2_vl", "head_dim": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}}  # fmt: skip
GEMMA2 = {**LLAMA, "model_type": "gemma2", "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 16}


def _set(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(base))
    *parents, leaf = path.split(".")
    target = data
    for key in parents:
        target = target[key]
    target[leaf] = value
    return data


# (name, base config, dotted field, hostile value, words the message must hold)
HOSTILE: list[tuple[str, dict[str, Any], str, Any, str]] = [
    ("rope_theta a string", LLAMA, "rope_parameters.rope_theta", "big", "rope_parameters.rope_theta"),
    ("rope_theta NaN", LLAMA, "rope_parameters.rope_theta", float("nan"), "NaN"),
    ("hidden_size a string", LLAMA, "hidden_size", "64", "hidden_size"),
    ("hidden_size true", LLAMA, "hidden_size", True, "hidden_size is true"),
    ("num_hidden_layers 'two'", LLAMA, "num_hidden_layers", "two", "num_hidden_layers"),
    ("num_attention_heads 0", LLAMA, "num_attention_heads", 0, "num_attention_heads is 0"),
    ("num_attention_heads 4.7", LLAMA, "num_attention_heads", 4.7, "num_attention_heads is 4.7"),
    ("kv heads not dividing", LLAMA, "num_key_value_heads", 3, "does not divide"),
    ("max_position_embeddings 256.7", LLAMA, "max_position_embeddings", 256.7, "256.7"),
    ("max_position_embeddings NaN", LLAMA, "max_position_embeddings", float("nan"), "max_position_embeddings is NaN"),
    ("max_position_embeddings Infinity", LLAMA, "max_position_embeddings", float("inf"), "Infinity"),
    ("rope_parameters a list", LLAMA, "rope_parameters", [1, 2], "rope_parameters"),
    ("rope_parameters a string", LLAMA, "rope_parameters", "default", "rope_parameters"),
    ("rope_scaling a list", LLAMA, "rope_scaling", [2.0], "rope_scaling"),
    ("rope factor 0", LLAMA, "rope_parameters", {"rope_type": "linear", "factor": 0}, "factor is 0"),
    ("partial_rotary_factor 0", LLAMA, "partial_rotary_factor", 0, "partial_rotary_factor is 0"),
    ("partial_rotary_factor 0.1: width 1", LLAMA, "partial_rotary_factor", 0.1, "rotary width of 1"),
    ("layer_types short", GEMMA3, "layer_types", ["sliding_attention", "full_attention"], "lists 2 layers"),
    ("layer_types unknown kind", GEMMA3, "layer_types", ["weird", "sliding_attention", "full_attention"], "weird"),
    ("mrope_section a string", QWEN2_VL, "rope_parameters.mrope_section", "233", "mrope_section"),
    ("mrope_section wrong sum", QWEN2_VL, "rope_parameters.mrope_section", [1, 1, 1], "sum 3"),
    ("soft-cap 0", GEMMA2, "attn_logit_softcapping", 0, "attn_logit_softcapping is 0"),
    ("query_pre_attn_scalar 0", GEMMA2, "query_pre_attn_scalar", 0, "query_pre_attn_scalar is 0"),
]


@pytest.mark.parametrize(("base", "field", "value", "words"), [row[1:] for row in HOSTILE], ids=[r[0] for r in HOSTILE])
def test_a_hostile_config_value_is_refused_by_name(
    base: dict[str, Any], field: str, value: Any, words: str, tmp_path: Path
) -> None:
    """Both readers refuse the value with one line naming it, before any computation (today: tracebacks, or 4.7
    heads read as 4, a soft-cap of 0 dropped)."""
    data = _set(base, field, value)
    with pytest.raises(ConfigError, match=r"config\.json field") as imported:
        from_hf_config(data, "full_attention" if base is GEMMA3 else None)
    assert words in str(imported.value)
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"config\.json field") as read:
        CheckpointSource.from_folder(tmp_path)
    assert words in str(read.value)
    assert len(str(read.value).splitlines()) == 1


def test_the_untouched_configs_of_the_table_import() -> None:
    """The table's base configs are valid: each row fails only on its value."""
    for data, layer_type in ((LLAMA, None), (GEMMA3, "full_attention"), (QWEN2_VL, None), (GEMMA2, None)):
        assert from_hf_config(data, layer_type).config.num_heads == 4


def test_transformers_cannot_run_a_query_scalar_of_zero() -> None:
    """The refusal of ``query_pre_attn_scalar: 0`` is transformers' own outcome: its Gemma 2 module divides by it."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention

    config = transformers.Gemma2Config(**{k: v for k, v in GEMMA2.items() if k != "model_type"})
    config.query_pre_attn_scalar = 0
    with pytest.raises(ZeroDivisionError):
        Gemma2Attention(config, layer_idx=0)


def test_a_config_nested_100000_deep_is_refused_without_recursion(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for read in (CheckpointSource.from_folder, lambda folder: from_hf_config(folder / "config.json")):
        with pytest.raises(ConfigError, match="nests 100001 levels deep"):
            read(tmp_path)


def test_an_oversized_config_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import posenc.config.hf_json

    monkeypatch.setattr(posenc.config.hf_json, "MAX_CONFIG_BYTES", 1000)
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "pad": "x" * 2000}))
    with pytest.raises(ConfigError, match=r"MiB; a config or index is at most"):
        from_hf_config(tmp_path)


# --------------------------------------------------------------------------------------------------
# Which weights, symlink loops, the hub cache's blob store
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama checkpoint saved as one model.safetensors."""
    pytest.importorskip("transformers")
    from posenc.checkpoints.samples import get_sample

    return get_sample("llama").build(tmp_path_factory.mktemp("single") / "ckpt", shard=None)


def _with_other_weights(single: Path, folder: Path, kind: str) -> Path:
    """``single`` plus a second, different set of weights beside it: a sharded index (``index``) or a
    ``pytorch_model.bin`` (``bin``)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(single, folder)
    other = {name: t + 1.0 for name, t in load_file(single / "model.safetensors").items()}
    if kind == "index":
        save_file(other, folder / "model-00001-of-00001.safetensors", metadata={"format": "pt"})
        weight_map = dict.fromkeys(other, "model-00001-of-00001.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        torch.save(other, folder / "pytorch_model.bin")
    return folder


@pytest.mark.parametrize("kind", ["index", "bin"])
def test_ambiguous_folders_read_what_from_pretrained_reads(single: Path, tmp_path: Path, kind: str) -> None:
    """transformers' ``from_pretrained`` takes model.safetensors over a shard index and over pytorch_model.bin; so
    does posenc, and its provenance says which file it read."""
    transformers = pytest.importorskip("transformers")
    from posenc.checkpoints import load_layer

    folder = _with_other_weights(single, tmp_path / "ckpt", kind)
    loaded = load_layer(folder, 1)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    expected = model.model.layers[1].self_attn.q_proj.weight.detach()
    assert torch.equal(loaded.tensors["q_proj.weight"], expected)
    assert loaded.provenance().weights_file == "model.safetensors"
    assert "read from model.safetensors" in loaded.provenance().describe()


def test_a_shard_index_alone_is_read(single: Path, tmp_path: Path) -> None:
    folder = _with_other_weights(single, tmp_path / "ckpt", "index")
    (folder / "model.safetensors").unlink()
    with CheckpointSource.from_folder(folder) as source:
        assert source.weights_file == "model.safetensors.index.json"
        assert source.ignored_files == ()


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_symlink_loop_is_refused_by_name(single: Path, tmp_path: Path, name: str) -> None:
    folder = Path(shutil.copytree(single, tmp_path / "ckpt"))
    (folder / name).unlink()
    os.symlink(folder / "loop_b", folder / name)
    os.symlink(folder / name, folder / "loop_b")
    with pytest.raises(PosencError, match="symlink loop"):
        CheckpointSource.from_folder(folder)


def _hub_cache(single: Path, root: Path) -> Path:
    """A hub-cache layout: ``models--org--m/snapshots/rev/<file>`` -> ``../../blobs/<hash>``."""
    repo = root / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    for index, path in enumerate(sorted(single.iterdir())):
        shutil.copy(path, repo / "blobs" / f"hash{index}")
        (snapshot / path.name).symlink_to(Path("../../blobs") / f"hash{index}")
    return snapshot


def test_a_hub_cache_snapshot_reads_its_own_blobs(single: Path, tmp_path: Path) -> None:
    with CheckpointSource.from_folder(_hub_cache(single, tmp_path)) as source:
        assert source.tensor("model.layers.0.self_attn.q_proj.weight").shape == (64, 64)


def test_a_hub_cache_whose_blobs_are_a_symlink_elsewhere_is_refused(single: Path, tmp_path: Path) -> None:
    """The blob store must be the repository's own folder: a ``blobs`` symlink to another directory would let a
    snapshot read any file there (today: read and exported)."""
    snapshot = _hub_cache(single, tmp_path / "cache")
    repo = snapshot.parent.parent
    elsewhere = Path(shutil.move(repo / "blobs", tmp_path / "elsewhere"))
    (repo / "blobs").symlink_to(elsewhere)
    with pytest.raises(ModelFileError, match=r"blob store .* is a symlink"):
        CheckpointSource.from_folder(snapshot)


# --------------------------------------------------------------------------------------------------
# Damaged weights, partial rotations the module cannot run
# --------------------------------------------------------------------------------------------------


def _damaged(single: Path, folder: Path, tensor: str, value: float) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(single, folder)
    weights = load_file(folder / "model.safetensors")
    weights[tensor][0, 0] = value
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_a_nan_in_the_checkpoint_names_the_tensor_and_file(single: Path, tmp_path: Path) -> None:
    """Today: "AttentionBlock with parameters {} computes non-finite values ... choose parameters"."""
    from posenc.checkpoints import load_layer

    name = "model.layers.1.self_attn.v_proj.weight"
    folder = _damaged(single, tmp_path / "ckpt", name, float("nan"))
    with pytest.raises(ConfigError, match=rf"checkpoint tensor '{name}' in .*model\.safetensors holds 1 NaN"):
        load_layer(folder, 1)


def test_a_weight_overflowing_fp16_names_the_checkpoint_tensor(single: Path, tmp_path: Path) -> None:
    from posenc.checkpoints import load_layer
    from posenc.export import export_onnx

    name = "model.layers.1.self_attn.o_proj.weight"
    loaded = load_layer(_damaged(single, tmp_path / "ckpt", name, 1e6), 1)
    with pytest.raises(ConfigError, match=rf"checkpoint tensor {name} in .*model\.safetensors\) is not finite in "):
        export_onnx(loaded.block(), tmp_path / "m.onnx", dtype="fp16", provenance=loaded.provenance())
    assert not (tmp_path / "m.onnx").exists()


def test_a_partial_rotation_the_module_cannot_run_is_refused(single: Path, tmp_path: Path) -> None:
    """Llama's module rotates the whole head whatever ``partial_rotary_factor`` says (today: exported as a partial
    rotation, then ``validate --against-hf`` crashed in the module)."""
    from posenc.checkpoints import load_layer

    folder = Path(shutil.copytree(single, tmp_path / "ckpt"))
    data = json.loads((folder / "config.json").read_text())
    data["rope_parameters"]["partial_rotary_factor"] = 0.5
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"partial_rotary_factor=0\.5: transformers' LlamaAttention cannot run it"):
        load_layer(folder, 1)


# --------------------------------------------------------------------------------------------------
# A checkpoint changed since export
# --------------------------------------------------------------------------------------------------


def _edit(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads((folder / "config.json").read_text())
    change(data)
    (folder / "config.json").write_text(json.dumps(data))


def test_a_checkpoint_changed_since_export_is_named_before_any_numbers(
    single: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dynamic-NTK export whose checkpoint's factor then changes 2 -> 8 (today: PASS at the default feeds), and
    one whose tensors change: ``validate --against-hf`` names each change and computes nothing."""
    from posenc.cli import main

    folder = Path(shutil.copytree(single, tmp_path / "ckpt"))
    _edit(folder, lambda d: d.update(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}))
    model = tmp_path / "out" / "m.onnx"
    assert main(["export", "--hf-model", str(folder), "--layer", "1", "--no-optimize", "-o", str(model)]) == 0
    assert json.loads(model.with_suffix(".manifest.json").read_text())["weights"]["source"]["config"]
    _edit(folder, lambda d: d["rope_parameters"].update(factor=8.0))
    capsys.readouterr()
    assert main(["validate", str(model), "--against-hf", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "the checkpoint changed since export: field rope_parameters.factor was 2.0, is 8.0" in err
    _edit(folder, lambda d: d["rope_parameters"].update(factor=2.0))
    _damaged(single, tmp_path / "retrained", "model.layers.1.self_attn.k_proj.weight", 0.5)
    shutil.copy(tmp_path / "retrained" / "model.safetensors", folder / "model.safetensors")
    assert main(["validate", str(model), "--against-hf", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "changed since export: tensor model.layers.1.self_attn.k_proj.weight sha256 was" in err
