"""Artifacts without waste: one layer's export and both optimized graphs hold its weights and its position table once
(the export's weights file, which every graph reads as external data), and the in-place cache is sized apart from
the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc import AttentionConfig
from posenc.export import export_scheme, load_manifest
from posenc.graphs import optimize_file
from posenc.validate import check_ort_parity, validate_onnx

LLAMA_3_2_1B = AttentionConfig(
    hidden_size=2048, num_heads=32, num_kv_heads=8, head_dim=64, max_position_embeddings=131072
)
LLAMA3 = {"rope_theta": 500000.0, "factor": 32.0, "original_max_position_embeddings": 8192}


def _weights_and_table(config: AttentionConfig) -> int:
    """fp32 bytes of the attention weights and of one precomputed cos/sin table."""
    e, h, hkv, d = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    weights = 4 * (2 * e * h * d + 2 * e * hkv * d)
    table = 4 * 2 * config.max_position_embeddings * (d // 2)
    return weights + table


def _tour(folder: Path, config: AttentionConfig) -> int:
    """Export, optimize for ort-cpu and trt beside it; the bytes of every file written."""
    exported = export_scheme("rope_llama3", folder / "layer.onnx", params=LLAMA3, config=config).path
    for target in ("ort-cpu", "trt"):
        optimize_file(exported, folder / f"layer.{target}.onnx", target, check=check_ort_parity)
    return sum(p.stat().st_size for p in folder.iterdir())


def test_one_layer_and_both_optimized_graphs_store_weights_and_table_once(tmp_path: Path) -> None:
    config = AttentionConfig(hidden_size=256, num_heads=8, num_kv_heads=2, head_dim=32, max_position_embeddings=8192)
    total = _tour(tmp_path, config)
    assert total <= 1.2 * _weights_and_table(config), (total, _weights_and_table(config))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in names if n.endswith(".safetensors")] == ["layer.weights.safetensors"]  # one file, shared
    for target in ("ort-cpu", "trt"):
        assert load_manifest(tmp_path / f"layer.{target}.onnx").weights.path == "layer.weights.safetensors"
        assert validate_onnx(tmp_path / f"layer.{target}.onnx").passed


@pytest.mark.slow
def test_the_llama_3_2_1b_geometry_layer_tour_fits_the_target(tmp_path: Path) -> None:
    total = _tour(tmp_path, LLAMA_3_2_1B)
    assert total <= 1.2 * _weights_and_table(LLAMA_3_2_1B), (total, _weights_and_table(LLAMA_3_2_1B))


def test_the_in_place_cache_is_sized_apart_from_the_table(tmp_path: Path) -> None:
    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=131072)
    result = export_scheme("rope", tmp_path / "ip.onnx", config=config, table_mode="dynamic", kv_cache="inplace",
                         cache_capacity=128)  # fmt: skip
    manifest = result.manifest
    assert manifest.input("key_cache").shape[2] == 128
    assert manifest.dynamic_dims["seq"].max == 128
    from posenc.validate.decode import validate_decode

    assert validate_decode([result.path]).passed  # prefill, 64 steps, a jump to slot 127
    with pytest.raises(Exception, match="kv_cache='inplace'"):
        export_scheme("rope", tmp_path / "c.onnx", config=config, cache_capacity=64)
    with pytest.raises(Exception, match="cache_capacity must be an int >= 1"):
        export_scheme("rope", tmp_path / "d.onnx", config=config, kv_cache="inplace", cache_capacity=0)
