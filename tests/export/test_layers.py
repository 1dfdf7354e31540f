"""Every layer in one command (``posenc export --layers``, ``posenc validate FOLDER``): one artifact per layer, the
tables stored once for the folder, the weights once, each layer held to the checkpoint's own transformers module.

Checkpoints are built here with transformers (``LlamaConfig`` / ``Gemma3TextConfig`` + ``save_pretrained``)."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest

from posenc.artifacts.paths import sha256_file
from posenc.checkpoints.samples import TINY, get_sample
from posenc.cli import main
from posenc.errors import ConfigError, ExportError
from posenc.export.layers import export_layers, read_index
from posenc.validate.layers import validate_layers


def _checkpoint(folder: Path, name: str, **settings: object) -> Path:
    sample = get_sample(name)
    return dataclasses.replace(sample, settings={**sample.settings, **settings}).build(folder)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two Llama layers wide enough that weights and tables, not the graphs, fill the disk."""
    geometry = {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32}
    return _checkpoint(tmp_path_factory.mktemp("llama"), "llama", num_hidden_layers=2, max_position_embeddings=8192,
                       **geometry)  # fmt: skip


def _perturb(folder: Path, layer: str, entry: str) -> None:
    """Change one weight of a layer in place and re-hash it in its manifest: a wrong file that is consistent."""
    weights = folder / f"{layer}.weights.safetensors"
    data = bytearray(weights.read_bytes())
    (size,) = struct.unpack("<Q", data[:8])
    start = 8 + size + json.loads(data[8 : 8 + size])[entry]["data_offsets"][0]
    data[start : start + 4] = struct.pack("<f", struct.unpack("<f", data[start : start + 4])[0] + 0.5)
    weights.write_bytes(bytes(data))
    manifest = folder / f"{layer}.manifest.json"
    record = json.loads(manifest.read_text())
    record["weights"]["sha256"] = sha256_file(weights)
    manifest.write_text(json.dumps(record))


def test_every_layer_exported_once_validated_and_a_wrong_layer_named(
    llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "layers"
    import posenc.checkpoints.load as load

    real = load.load_layer

    def fail_at_layer_1(checkpoint, layer, layer_type=None):  # a failure after layer 0 was exported
        if layer == 1:
            raise ExportError("injected")
        return real(checkpoint, layer, layer_type)

    monkeypatch.setattr(load, "load_layer", fail_at_layer_1)
    with pytest.raises(ExportError, match="injected"):
        export_layers(out, llama)
    assert not out.exists()  # nothing half-written: the folder it created is gone
    monkeypatch.undo()

    result = export_layers(out, llama, "all")
    assert [(e.layer, e.onnx) for e in result.index.layers] == [(0, "layer0.onnx"), (1, "layer1.onnx")]
    assert [m.weights.source.layer for m in result.manifests] == [0, 1]
    # disk: both layers' fp32 attention weights + one cos/sin table, at most 1.2x
    hidden, heads, kv, dim, positions = 256, 8, 2, 32, 8192
    weights = 4 * (2 * hidden * heads * dim + 2 * hidden * kv * dim)
    table = 4 * 2 * positions * (dim // 2)
    total = sum(p.stat().st_size for p in out.iterdir())
    assert total <= 1.2 * (2 * weights + table), (total, 2 * weights + table)
    assert sorted(p.name for p in out.glob("*.safetensors")) == [
        "layer0.weights.safetensors", "layer1.weights.safetensors", "tables.safetensors"]  # fmt: skip

    report = validate_layers(out, llama)
    assert report.passed
    assert [v.layer for v in report.layers] == [0, 1]
    assert all(v.margin is not None and v.margin <= 1 for v in report.layers)

    _perturb(out, "layer1", "q_proj.weight.T")  # numbers that no longer match the checkpoint
    (out / "layer0.weights.safetensors").write_bytes(b"corrupt")  # unreadable: an error row, the others still run
    assert main(["validate", str(out), "--against-hf", str(llama), "--json-out", str(tmp_path / "r.json")]) == 1
    rows = json.loads((tmp_path / "r.json").read_text())["layers"]
    assert [(row["layer"], row["passed"]) for row in rows] == [(0, False), (1, False)]
    assert "does not match" in rows[0]["error"] or "sha256" in rows[0]["error"]
    assert rows[1]["error"] == ""
    assert "vs hf-" in rows[1]["worst"]
    assert rows[1]["margin"] > 1


def _gemma3_layers(tmp_path: Path) -> tuple[Path, Path]:
    """Gemma 3: a sliding layer (local RoPE, theta 1e4) and a full layer (linear-scaled, theta 1e6), by the CLI."""
    checkpoint = _checkpoint(tmp_path / "ckpt", "gemma3-full", num_hidden_layers=3, max_position_embeddings=256)
    out = tmp_path / "layers"
    assert main(["export", "--hf-model", str(checkpoint), "--layers", "0-1", "-o", str(out)]) == 0
    index = read_index(out)
    assert [(e.layer, e.layer_type) for e in index.layers] == [(0, "sliding_attention"), (1, "full_attention")]
    from safetensors import safe_open

    with safe_open(str(out / "tables.safetensors"), "pt") as tables:
        names = sorted(tables.keys())
    assert len(names) == 4, names
    assert sum(n.startswith("full_attention.") for n in names) == 2, names  # two distinct sets of cos/sin
    return checkpoint, out


def test_layer_kinds_each_record_theirs_and_tables_are_stored_once_per_content(tmp_path: Path) -> None:
    _gemma3_layers(tmp_path)


@pytest.mark.slow
def test_layers_of_two_kinds_each_match_the_checkpoint(tmp_path: Path) -> None:
    checkpoint, out = _gemma3_layers(tmp_path)
    assert main(["validate", str(out), "--against-hf", str(checkpoint)]) == 0


def test_layer_selections_and_their_errors(tmp_path: Path) -> None:
    from transformers import LlamaConfig

    from posenc.checkpoints.layers import checkpoint_layers, parse_layers, select_layers

    LlamaConfig(**{**TINY, "num_hidden_layers": 6}).save_pretrained(tmp_path)  # the config alone: no tensor is read
    entries = checkpoint_layers(tmp_path)
    assert [e.layer for e in select_layers(entries, "all")[0]] == [0, 1, 2, 3, 4, 5]
    assert [e.layer for e in select_layers(entries, "1-3,5")[0]] == [1, 2, 3, 5]
    assert parse_layers("0,2,5") == [0, 2, 5]
    for spec, message in (
        ("6", "layer 6 is out of range: the checkpoint has layers 0 .. 5"),
        ("3-1", "the range 3-1 is empty"),
        ("", "is not a layer or range"),
        ("1-", "is not a layer or range"),
        ("a,b", "is not a layer or range"),
    ):
        with pytest.raises(ConfigError, match=message):
            select_layers(entries, spec)


def test_layers_cli_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--layers", "all", "-o", str(tmp_path / "x")]) == 2
    assert "--layers selects layers of --hf-model" in capsys.readouterr().err
