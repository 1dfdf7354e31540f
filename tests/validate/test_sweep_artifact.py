"""``posenc sweep MODEL.onnx``: one export swept as it is (its parameters, tables, dtype and weights) up to the last
position it serves, against the float64 eager rebuild of the same file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc import AttentionConfig
from posenc.cli import main
from posenc.export import export_scheme

CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=3000)


@pytest.fixture(scope="module")
def yarn_block(tmp_path_factory: pytest.TempPathFactory) -> Path:
    params = {"factor": 4.0, "original_max_position_embeddings": 750}
    return export_scheme("rope_yarn", tmp_path_factory.mktemp("sweep") / "yarn.onnx", params=params, config=CONFIG).path


def test_a_block_is_swept_to_the_last_position_it_serves(yarn_block: Path, tmp_path: Path) -> None:
    assert main(["sweep", str(yarn_block), "--per-bucket", "3", "-o", str(tmp_path / "s")]) == 0
    report = json.loads((tmp_path / "s.json").read_text())
    (series,) = report["series"]
    assert series["scheme"] == "rope_yarn"
    assert series["case"] == "yarn.onnx"
    assert [(b["lo"], b["hi"]) for b in series["buckets"]] == [(0, 1024), (1024, 3000)]
    assert max(p["position"] for p in series["points"]) == 2999
    assert all(b["within_tolerance"] for b in series["buckets"])


def test_a_file_whose_tables_disagree_with_its_manifest_fails(yarn_block: Path, tmp_path: Path) -> None:
    """The graph holds YaRN x4 tables; a manifest claiming x2 rebuilds another reference: exit 1."""
    copy = tmp_path / "yarn.onnx"
    for suffix in (".onnx", ".manifest.json", ".weights.safetensors"):
        source = yarn_block.with_name(f"yarn{suffix}")
        (tmp_path / source.name).write_bytes(source.read_bytes())
    manifest = json.loads((tmp_path / "yarn.manifest.json").read_text())
    manifest["params"]["factor"] = 2.0
    (tmp_path / "yarn.manifest.json").write_text(json.dumps(manifest))
    assert main(["sweep", str(copy), "--per-bucket", "2", "-o", str(tmp_path / "bad")]) == 1


def test_refusals(yarn_block: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(yarn_block), "-s", "rope", "-o", str(tmp_path / "a")]) == 2
    assert "drop --scheme" in capsys.readouterr().err
    assert main(["sweep", str(yarn_block), "--last-position", "5000", "-o", str(tmp_path / "b")]) == 2
    assert "past the last position yarn.onnx serves (2999)" in capsys.readouterr().err
    in_place = export_scheme("rope", tmp_path / "ip.onnx", config=CONFIG, kv_cache="inplace").path
    assert main(["sweep", str(in_place), "-o", str(tmp_path / "c")]) == 2
    assert "--kv-cache concat" in capsys.readouterr().err
