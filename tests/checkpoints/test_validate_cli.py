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
    floor = "hf-fp32, fp64 angles"  # what float32 arithmetic alone gets wrong: reported, never counted
    far = [row for row in data["rows"] if row["shape"].get("start") == 4092]  # start: left out for a contiguous feed
    assert {row["reference"] for row in far} == {"eager-fp64", "hf-fp32", floor, "hf-fp64, fp64 angles"}
    assert all(row["informational"] for row in data["rows"] if row["reference"] == floor)
    # informational exactly where transformers' float32 angles put hf-fp32 itself beyond the tolerance (with a note)
    assert all(row["informational"] == bool(row.get("note")) for row in data["rows"] if row["reference"] != floor)
    assert all("float32" in row["note"] for row in data["rows"] if row["informational"] and row["reference"] != floor)
    assert all(row["margin"] <= 1 for row in data["rows"] if not row["informational"])
    assert "max(atol, rtol * |ref|)" in data["criterion"]
    hf_rows = [row for row in data["rows"] if row["reference"].startswith("hf-")]
    assert hf_rows
    assert all(row["atol"] == 1e-5 for row in hf_rows)


def _tampered(checkpoint: Path, folder: Path, projection: str) -> Path:
    """Layer 1 exported with its checkpoint's provenance but one weight of ``projection`` moved by 1e-2."""
    loaded = load_layer(checkpoint, 1)
    block = loaded.block()
    with torch.no_grad():
        getattr(block, projection).weight[0, 0] += 1e-2
    return export_onnx(block, folder / "tampered.onnx", provenance=loaded.provenance()).path


def test_a_wrong_deployment_fails_against_the_checkpoint(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An export claiming the checkpoint's provenance but holding a slightly different weight is caught: exit 1."""
    out = _tampered(checkpoint, tmp_path, "v_proj")
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


def test_an_export_of_another_model_is_refused_as_such(
    exported: Path, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Llama export checked against a Qwen2 checkpoint: the manifest's provenance says where it came from, before
    any layer type or geometry is compared."""
    from posenc.checkpoints.samples import get_sample

    qwen = get_sample("qwen2-yarn").build(tmp_path / "qwen")
    assert main(["validate", str(exported), "--against-hf", str(qwen)]) == 2
    err = capsys.readouterr().err
    assert "came from another checkpoint" in err
    assert f"{checkpoint} (llama, layer 1)" in err
    assert f"{qwen} is a qwen2 checkpoint" in err


def test_a_config_mismatch_names_only_the_fields_that_differ(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same family with another geometry: one line per differing field, model value vs checkpoint value."""
    other = tiny.llama(tmp_path / "other", max_position_embeddings=2048, rms_norm_eps=1e-5)
    assert main(["validate", str(exported), "--against-hf", str(other)]) == 2
    err = capsys.readouterr().err
    assert "max_position_embeddings: 4096 vs 2048" in err
    assert "num_heads" not in err  # an equal field is not listed
    assert str(tmp_path / "other") in err


def test_layer_without_checkpoint_is_refused(exported: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(exported), "--layer", "2"]) == 2
    assert "--against-hf" in capsys.readouterr().err


def test_far_positions_get_one_verdict_however_they_are_asked_for(exported: Path, checkpoint: Path) -> None:
    """The feed that ends at the context length, added by validate itself or asked for with --shape, gets the same
    rows: which of them are informational is decided by the data (hf-fp32's own drift), not by who asked."""
    from posenc.export import FeedShape
    from posenc.validate.checkpoint import validate_against_checkpoint

    far = FeedShape(1, 4, 0, start=4092)
    added = validate_against_checkpoint(exported, checkpoint, shapes=[FeedShape(1, 3)])
    # the same data: feed i is seeded seed + i, and the added feed comes second
    asked = validate_against_checkpoint(exported, checkpoint, shapes=[far], long_positions=False, seed=1)

    def strip(report):
        rows = [r for r in report.rows if r.shape == far]
        return [(r.reference, r.output, r.passed, r.informational, r.note, r.max_abs) for r in rows]

    assert strip(added) == strip(asked)
    assert strip(asked)
    assert added.passed == asked.passed


def test_a_bf16_export_is_compared_with_the_module_in_bf16(checkpoint: Path, tmp_path: Path) -> None:
    """A bf16 graph is held to the module run in bf16 and to twice that module's own error against the exact
    rendering; a candidate three times as far off as the bf16 module fails the bound."""
    from posenc.export import FeedShape
    from posenc.validate.checkpoint import validate_against_checkpoint

    out = tmp_path / "layer1-bf16.onnx"
    assert main(["export", "--hf-model", str(checkpoint), "--layer", "1", "--dtype", "bf16", "-o", str(out)]) == 0
    shapes = [FeedShape(1, 5), FeedShape(2, 1, 4)]
    report = validate_against_checkpoint(out, checkpoint, shapes=shapes, long_positions=False)
    assert report.passed, report.to_markdown()
    references = {r.reference for r in report.rows}
    assert {"hf-bf16", "hf-fp64, fp64 angles (≤ 2 × hf-bf16's error)"} <= references
    bound = [r for r in report.rows if r.reference.endswith("hf-bf16's error)")]
    assert bound
    assert all(not r.informational and r.rtol == 0 for r in bound)

    loaded = load_layer(checkpoint, 1)
    exact, half = loaded.reference("float64", torch.float64), loaded.reference("native", torch.bfloat16)
    names = ["out", "present_key", "present_value"]

    def three_times_as_far(feed):
        args = [torch.from_numpy(feed[k].copy()) for k in ("hidden", "position_ids", "past_key", "past_value")]
        args[0] = args[0].float()
        want = exact(*[a.double() if a.is_floating_point() else a for a in args])
        got = half(*args)
        return {n: w + 3 * (g.double() - w) for n, w, g in zip(names, want, got, strict=True)}

    from posenc.validate import TorchModuleRunner

    wrong = validate_against_checkpoint(
        out, checkpoint, shapes=shapes, long_positions=False, runners=[TorchModuleRunner(three_times_as_far, "x3")]
    )
    failed = {r.reference for r in wrong.failures()}
    assert "hf-fp64, fp64 angles (≤ 2 × hf-bf16's error)" in failed


def test_decode_steps_are_held_to_the_module_with_its_own_cache(
    exported: Path, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`validate --decode --against-hf`: every step against transformers' module carrying its own DynamicCache; a
    graph holding a slightly different weight passes against posenc's rebuild of itself and fails against hf."""
    steps = ["--shape", "2,5", "--shape", "2,1,5", "--shape", "2,1,6", "--shape", "2,3,7"]
    report = tmp_path / "decode.json"
    code = main(
        ["validate", str(exported), "--decode", "--against-hf", str(checkpoint), *steps, "--json-out", str(report)]
    )
    assert code == 0
    data = json.loads(report.read_text())
    floor = "hf-fp32, fp64 angles"  # float32 arithmetic alone: reported, not counted
    assert {row["reference"] for row in data["rows"]} == {"eager-fp64", "hf-fp32", floor, "hf-fp64, fp64 angles"}
    assert len(data["rows"]) == 4 * 4 * 3  # steps x references x outputs
    assert all(row["passed"] for row in data["rows"] if row["reference"] != floor)
    tampered = _tampered(checkpoint, tmp_path, "k_proj")
    capsys.readouterr()
    assert main(["validate", str(tampered), "--decode", "--against-hf", str(checkpoint), *steps]) == 1
    out = capsys.readouterr().out
    assert "| eager-fp64 | onnxrt-0:tampered | present_key |" in out
    failing = [
        line for line in out.splitlines() if line.startswith("| hf-") and "/4 |" in line and "| 4/4 |" not in line
    ]
    assert failing
