"""Kernel specs: validation with clear messages, plugin attributes, float64 constants for the kernel."""

from __future__ import annotations

import math
import struct

import pytest

from posenc.errors import BackendUnavailable, ConfigError
from posenc.plugins.rope import AngleSource, PositionMode, QKFormat, RopeKernelSpec
from posenc.plugins.rope.spec import split_float64


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rotary_dim": 7}, "even int"),
        ({"rotary_dim": 0}, "even int"),
        ({"rotary_dim": 80, "head_dim": 64}, "exceeds head_dim"),
        ({"head_dim": 4096, "rotary_dim": 64}, r"head_dim must be an int in \[2, 1024\]"),
        ({"layout": "neox"}, "unknown RoPE layout"),
        ({"angles": "lut"}, "unknown angle source"),
        ({"positions": "absolute"}, "unknown position mode"),
        ({"angles": "freq", "attention_factor": 0.0}, "attention_factor"),
        ({"angles": "freq", "longrope_original": -1}, "longrope_original"),
        ({"angles": "ntk", "max_position_embeddings": 0}, "max_position_embeddings"),
        ({"angles": "ntk", "max_position_embeddings": 8, "rotary_dim": 2, "head_dim": 2}, "rotary_dim > 2"),
        ({"angles": "ntk", "max_position_embeddings": 8, "factor": float("nan")}, "factor"),
    ],
)
def test_invalid_specs_say_what_to_do(kwargs: dict, message: str) -> None:
    args = {"angles": "table", "rotary_dim": 64, "head_dim": 128, **kwargs}
    with pytest.raises(ConfigError, match=message):
        RopeKernelSpec(**args)


@pytest.mark.parametrize("source", list(AngleSource))
def test_plugin_attributes_round_trip(source: AngleSource) -> None:
    spec = RopeKernelSpec(
        source,
        rotary_dim=64,
        head_dim=128,
        layout="interleaved",
        positions=PositionMode.OFFSET,
        attention_factor=1.5 if source is AngleSource.FREQ else 1.0,
        longrope_original=4096 if source is AngleSource.FREQ else 0,
        factor=8.0 if source is AngleSource.NTK else 1.0,
        max_position_embeddings=8192 if source is AngleSource.NTK else 0,
    )
    attrs = spec.plugin_attributes(QKFormat.BSHD)
    back, fmt = RopeKernelSpec.from_plugin_attributes(source, attrs, head_dim=128)
    assert fmt is QKFormat.BSHD
    if source is AngleSource.CACHE:  # no positions input: the mode does not apply
        assert "position_mode" not in attrs
        back = RopeKernelSpec(**{**back.__dict__, "positions": PositionMode.OFFSET})
    assert back == spec
    assert spec.plugin_name.startswith("Posenc")
    assert spec.plugin_name not in ("RotaryEmbedding", "Attention")


@pytest.mark.parametrize("value", [math.log2(10000.0), math.log2(500000.0), 64 / 62, 0.1, 8.0])
def test_float64_constants_survive_float32_constexprs(value: float) -> None:
    hi, lo = split_float64(value)
    for part in (hi, lo):  # each is exactly a float32
        assert struct.unpack("<f", struct.pack("<f", part))[0] == part
    assert abs((hi + lo) - value) <= abs(value) * 2.0**-46


def test_constexprs_for_partial_interleaved() -> None:
    spec = RopeKernelSpec("table", 24, 40, "interleaved")
    consts = spec.constexprs(8)
    assert consts["BLOCK_HALF"] == 16
    assert consts["BLOCK_TAIL"] == 16
    assert consts["COPY_TAIL"]
    assert consts["INTERLEAVED"]
    assert consts["ROT"] == 24
    assert consts["HEAD_DIM"] == 40
    assert not spec.constexprs(8, copy_tail=False)["COPY_TAIL"]
    with pytest.raises(ConfigError, match="power of two"):
        spec.constexprs(6)


def test_tensorrt_plugin_reports_missing_tensorrt() -> None:
    """Here only tensorrt_rtx (no plugins) is installed: registering says what to install."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        from posenc.plugins.rope.trt_plugin import register_rope_plugins

        with pytest.raises(BackendUnavailable, match="posenc\\[trt\\]"):
            register_rope_plugins()
    else:
        pytest.skip("datacenter tensorrt is installed; see test_trt_plugin.py")


def test_target_arch_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.errors import BuildError
    from posenc.plugins.rope.trt_plugin import target_arch

    monkeypatch.setenv("POSENC_ROPE_SM", "sm_89")
    assert target_arch() == 89
    monkeypatch.setenv("POSENC_ROPE_SM", "hopper")
    with pytest.raises(BuildError, match="POSENC_ROPE_SM"):
        target_arch()
