"""`posenc validate MODEL --against-hf DIR`: the report names each reference, passes for a faithful export, fails
for a wrong one, and refuses models that were not exported from that checkpoint layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posenc.checkpoints import load_layer
from posenc.cli import main
from posenc.export import export_onnx
from tests.checkpoints import tiny

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.llama(tmp_path_factory.mktemp("llama") / "ckpt", max_position_embeddings=4096)


@pytest.fixture(scope="module")
def exported(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "layer1.onnx"
    assert main(["export", "--hf-model", str(checkpoint), "--layer", "1", "-o", str(out)]) == 0
    return out


def test_faithful_export_passes_against_every_reference(
    exported: Path, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "parity.json"
    assert main(["validate", str(exported), "--against-hf", str(checkpoint), "--json-out", str(report)]) == 0
    text = capsys.readouterr().out
    assert "transformers LlamaAttention (checkpoint weights, layer 1" in text
    data = json.loads(report.read_text())
    assert data["passed"]
    counted = {row["reference"] for row in data["rows"] if not row["informational"]}
    assert counted == {"eager-fp64", "hf-fp32", "hf-fp64, fp64 angles"}
    far = [row for row in data["rows"] if row["shape"]["start"] == 4092]
    assert {row["reference"] for row in far} == {"eager-fp64", "hf-fp32 far", "hf-fp64, fp64 angles"}
    assert all(row["informational"] for row in far if row["reference"] == "hf-fp32 far")
    hf_rows = [row for row in data["rows"] if row["reference"].startswith("hf-")]
    assert hf_rows
    assert all(row["atol"] == 1e-5 for row in hf_rows)


def test_a_wrong_deployment_fails_against_the_checkpoint(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An export claiming the checkpoint's provenance but holding a slightly different weight is caught: exit 1."""
    loaded = load_layer(checkpoint, 1)
    block = loaded.block()
    with torch.no_grad():
        block.v_proj.weight[0, 0] += 1e-2
    out = tmp_path / "tampered.onnx"
    export_onnx(out, module=block, provenance=loaded.provenance())
    assert main(["validate", str(out), "--against-hf", str(checkpoint)]) == 1
    text = capsys.readouterr().out
    failing = [line for line in text.splitlines() if "**FAIL**" in line]
    assert failing
    assert all("| hf-" in line for line in failing)  # posenc's own rebuild of the tampered weights still agrees


def test_random_weights_are_refused(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "random.onnx"
    assert main(["export", "--hf-config", str(checkpoint / "config.json"), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["validate", str(out), "--against-hf", str(checkpoint)]) == 2
    assert "random weights (seed 0)" in capsys.readouterr().err


def test_another_layer_is_refused(exported: Path, checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(exported), "--against-hf", str(checkpoint), "--layer", "2"]) == 2
    assert "differ from those the model was exported from" in capsys.readouterr().err


def test_layer_without_checkpoint_is_refused(exported: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(exported), "--layer", "2"]) == 2
    assert "--against-hf" in capsys.readouterr().err
