"""``posenc export`` end to end (in-process through posenc.cli.main)."""

from __future__ import annotations

import json

from posenc.cli import main
from posenc.export import load_manifest


def test_export_op_prints_summary_and_writes_three_files(tmp_path, capsys) -> None:
    out = tmp_path / "alibi.onnx"
    argv = ["export", "--scheme", "alibi", "--unit", "op", "--table-mode", "dynamic", "--dtype", "fp16"]
    argv += ["--num-heads", "6", "--hidden-size", "96", "--param", "symmetric=true", "-o", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text
    assert "posenc validate" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "alibi.manifest.json",
        "alibi.onnx",
        "alibi.weights.safetensors",
    ]
    manifest = load_manifest(out)
    assert manifest.params == {"symmetric": True, "scaled": False, "bf16_rounding": False, "alibi_bias_max": 8.0}
    assert manifest.attention["num_heads"] == 6
    assert manifest.attention["head_dim"] == 16
    assert manifest.dtype == "float16"


def test_export_from_hf_config_with_json_output(tmp_path, capsys) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "llama.onnx"
    assert main(["export", "--hf-config", str(path), "--unit", "op", "--json", "-o", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["scheme"] == "rope_llama3"
    assert printed["params"]["rope_theta"] == 500000.0
    assert printed["params"]["factor"] == 8.0
    assert printed["attention"]["num_kv_heads"] == 2
    assert printed["max_positions"] == 128
    assert printed == load_manifest(out).to_dict()


def test_export_errors_exit_2_with_the_remedy(tmp_path, capsys) -> None:
    out = str(tmp_path / "x.onnx")
    assert main(["export", "--scheme", "rope", "--opset", "19", "-o", out]) == 2
    assert "[17, 18, 23, 24]" in capsys.readouterr().err
    assert main(["export", "--scheme", "rope", "--param", "factor", "-o", out]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["export", "--scheme", "rope", "--dtype", "fp8", "-o", out]) == 2
    assert "fp16" in capsys.readouterr().err
    assert main(["export", "-o", out]) == 2
    assert "--scheme" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_t5_direction_follows_causal_unless_given(tmp_path, capsys) -> None:
    """A T5 config exported as a causal (decoder) block gets unidirectional buckets; --param still wins."""
    from posenc.cli import build_parser
    from posenc.export.cli import _geometry

    config = {"model_type": "t5", "d_model": 64, "num_heads": 4, "d_kv": 16, "is_encoder_decoder": True,
              "relative_attention_num_buckets": 16, "relative_attention_max_distance": 32}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "t5.onnx"
    base = ["export", "--hf-config", str(path), "-o", str(out)]
    assert main([*base, "--unit", "op", "--causal", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["attention"]["causal"], printed["params"]["bidirectional"]) == (True, False)
    parser = build_parser()
    for extra, causal, bidirectional in (
        ([], False, True),  # the encoder as imported
        (["--causal", "--param", "bidirectional=true"], True, "true"),  # the user's choice wins (coerced later)
        (["--no-causal"], False, True),
    ):
        geometry, scheme, params = _geometry(parser.parse_args(base + extra))
        assert (scheme, geometry.causal, params["bidirectional"]) == ("t5", causal, bidirectional), extra
    geometry, _, params = _geometry(parser.parse_args([*base, "--scheme", "alibi", "--causal"]))
    assert "bidirectional" not in params  # another scheme than the imported one takes no T5 parameters


def test_export_kv_cache_inplace_writes_a_preallocated_cache_block(tmp_path, capsys) -> None:
    out = tmp_path / "rope.onnx"
    argv = ["export", "--scheme", "rope", "--kv-cache", "inplace", "--hidden-size", "32", "--num-heads", "2"]
    argv += ["--max-position-embeddings", "40", "-o", str(out)]
    assert main(argv) == 0
    manifest = load_manifest(out)
    assert (manifest.unit, manifest.opset) == ("block-inplace", 24)
    assert [(s.name, s.role) for s in manifest.inputs][2:] == [
        ("key_cache", "cache"),
        ("value_cache", "cache"),
        ("past_length", "length"),
    ]
    assert manifest.input("key_cache").shape[2] == 40  # one slot per position the block serves
    assert main(["export", "--scheme", "rope", "--kv-cache", "inplace", "--opset", "23", "-o", str(out)]) == 2
    assert "--opset 24" in capsys.readouterr().err
