"""The RoPE kernel and its ONNX Runtime twin with multi-axis positions (M-RoPE sections: Qwen2-VL chunks and
Qwen3-VL interleaving; axial rows and columns) and with MLA's rope slice (q rotated from ``rotary_offset``, k the
shared rope head), under Triton's interpreter, against posenc's float64 schemes (themselves tested against
transformers' rotary modules in tests/schemes/test_rope_multimodal.py and tests/test_mla.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc import AttentionConfig, build_scheme, functional
from posenc.errors import ConfigError, ExportError
from posenc.plugins.rope import RopeKernelSpec, freq_inputs, rope_qk
from posenc.plugins.rope.aot import contiguous_scalar_args, expected_param_count
from posenc.plugins.rope.ort_twin import rope_function
from posenc.schemes.rope import rope_parameters
from tests.plugins.rope.test_aot import _compile_in_subprocess
from tests.plugins.rope.test_ort_twin import run_twin

pytest.importorskip("triton", reason="the RoPE kernel needs triton")

CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=64)
MULTI = {
    "qwen2-vl": ("rope_mrope", {"mrope_section": [2, 3, 3]}),
    "qwen3-vl": ("rope_mrope", {"mrope_section": [4, 2, 2], "mrope_interleaved": True}),
    "axial": ("rope_axial", {"column_freqs": "odd"}),
}


def _multi_case(name: str, batch_rows: int = 2) -> tuple:
    scheme_name, params = MULTI[name]
    scheme = build_scheme(scheme_name, CONFIG, params, "dynamic", table_dtype=torch.float64)
    axes = scheme.spec.position_axes
    positions = torch.randint(0, 60, (axes, batch_rows, 5))
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    rope_type = scheme.rope_type
    slot_axes = scheme.axis_select.reshape(axes, -1).argmax(0)
    sections = tuple(int((slot_axes == a).sum()) for a in range(axes))
    spec_args = {"mrope_section": sections, "mrope_interleaved": bool(params.get("mrope_interleaved", False))}
    inv_freq, _ = functional.rope_inv_freq(16, rope_parameters(rope_type, scheme.params, CONFIG))
    return scheme, positions, q, k, inv_freq, spec_args


def _table(inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return functional.rope_cos_sin(torch.arange(64), inv_freq)


@pytest.mark.parametrize("name", sorted(MULTI))
@pytest.mark.parametrize("source", ["table", "freq"])
def test_multi_axis_positions_in_kernel_and_twin(name: str, source: str) -> None:
    scheme, positions, q, k, inv_freq, spec_args = _multi_case(name, batch_rows=1 if source == "freq" else 2)
    want_q, want_k = scheme.rotate(q.double(), k.double(), positions.expand(-1, 2, -1))
    if source == "table":
        cos, sin = _table(inv_freq)
        spec = RopeKernelSpec("table", 16, 16, **spec_args)
        inputs = {"cos": cos, "sin": sin}
        feeds = {"cos_table": cos.numpy(), "sin_table": sin.numpy()}
    else:
        turns, extra = freq_inputs(16, rope_parameters(scheme.rope_type, scheme.params, CONFIG))
        spec = RopeKernelSpec("freq", 16, 16, **spec_args, **extra)
        inputs, feeds = {"turns": turns}, {"turns": turns.numpy()}
    got_q, got_k = rope_qk(q, k, spec, positions=positions, **inputs)
    torch.testing.assert_close(got_q.double(), want_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(got_k.double(), want_k, atol=2e-6, rtol=0)
    twin_q, twin_k = run_twin(spec, {"q": q.numpy(), "k": k.numpy(), **feeds, "positions": positions.numpy()})
    np.testing.assert_allclose(twin_q, want_q.numpy(), atol=2e-6, rtol=0)
    np.testing.assert_allclose(twin_k, want_k.numpy(), atol=2e-6, rtol=0)


def test_multi_axis_kernel_in_half_precision_and_a_wrong_section_shows() -> None:
    scheme, positions, q, k, inv_freq, spec_args = _multi_case("qwen2-vl")
    want_q, _ = scheme.rotate(q.double(), k.double(), positions)
    cos, sin = _table(inv_freq)
    spec = RopeKernelSpec("table", 16, 16, **spec_args)
    got_q, _ = rope_qk(q.half(), k.half(), spec, cos=cos, sin=sin, positions=positions)
    torch.testing.assert_close(got_q.double(), want_q, atol=4e-3, rtol=4e-3)
    shifted = RopeKernelSpec("table", 16, 16, mrope_section=(3, 2, 3))  # one slot read from the wrong axis
    wrong_q, _ = rope_qk(q, k, shifted, cos=cos, sin=sin, positions=positions)
    assert (wrong_q.double() - want_q).abs().max() > 1e-2


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mla_rope_slice_in_kernel_and_twin(layout: str, dtype: torch.dtype) -> None:
    """q ``[B, H, S, nope + R]`` rotated from feature ``nope`` (the position-free part copied), k the one shared
    rope head ``[B, 1, S, R]``: the DeepSeek layout read in place, no slice or concat around the kernel."""
    q, k = torch.randn(2, 4, 5, 24), torch.randn(2, 1, 5, 8)
    positions = torch.randint(0, 64, (2, 5))
    inv_freq, _ = functional.rope_inv_freq(8)
    cos, sin = _table(inv_freq)
    c, s = functional.rope_cos_sin(positions, inv_freq, dtype=torch.float64)
    want_rope = functional.apply_rope(q[..., 16:].double(), c.unsqueeze(1), s.unsqueeze(1), layout)
    want_k = functional.apply_rope(k.double(), c.unsqueeze(1), s.unsqueeze(1), layout)
    spec = RopeKernelSpec("table", 8, 24, layout, rotary_offset=16, key_head_dim=8)
    got_q, got_k = rope_qk(q.to(dtype), k.to(dtype), spec, cos=cos, sin=sin, positions=positions)
    tolerance = 2e-6 if dtype == torch.float32 else 3e-2
    assert torch.equal(got_q[..., :16], q[..., :16].to(dtype))
    torch.testing.assert_close(got_q[..., 16:].double(), want_rope, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(got_k.double(), want_k, atol=tolerance, rtol=tolerance)
    if dtype == torch.float32:
        feeds = {"q": q.numpy(), "k": k.numpy(), "cos_table": cos.numpy(), "sin_table": sin.numpy(),
                 "positions": positions.numpy()}  # fmt: skip
        twin_q, twin_k = run_twin(spec, feeds)
        np.testing.assert_array_equal(twin_q[..., :16], q[..., :16].numpy())
        np.testing.assert_allclose(twin_q[..., 16:], want_rope.numpy(), atol=2e-6, rtol=0)
        np.testing.assert_allclose(twin_k, want_k.numpy(), atol=2e-6, rtol=0)


def test_new_attributes_round_trip_and_compile() -> None:
    spec = RopeKernelSpec("table", 8, 24, rotary_offset=16, key_head_dim=8)
    attrs = spec.plugin_attributes()
    assert attrs["rotary_offset"] == 16
    assert RopeKernelSpec.from_plugin_attributes("table", attrs, 24, 8)[0] == spec
    multi = RopeKernelSpec("freq", 16, 16, mrope_section=(4, 2, 2), mrope_interleaved=True)
    back, _ = RopeKernelSpec.from_plugin_attributes("freq", multi.plugin_attributes(), 16)
    assert back == multi
    assert "mrope_axes" not in RopeKernelSpec("table", 16, 16).plugin_attributes()  # old nodes stay as they were
    scalars = contiguous_scalar_args(spec, "bhsd", [2, 4, 5, 24], [2, 1, 5, 8], None, [2, 5])
    assert scalars[7:10] == [1 * 5 * 8, 5 * 8, 8]  # k strides follow k's own head dim
    assert contiguous_scalar_args(multi, "bhsd", [2, 4, 5, 16], [2, 2, 5, 16], None, [3, 1, 5])[3] == 1


def test_ptx_of_the_new_forms_compiles_and_assembles_without_a_gpu() -> None:
    """The MLA slice and interleaved M-RoPE kernels compile for sm_90 with the launch contract TensorRT uses."""
    mla = {"angles": "table", "rotary_dim": 64, "head_dim": 192, "rotary_offset": 128, "key_head_dim": 64}
    mrope = {"angles": "freq", "rotary_dim": 128, "head_dim": 128, "mrope_section": [24, 20, 20],
             "mrope_interleaved": True}  # fmt: skip
    requests = [
        {"spec": mla, "qk_dtype": "float16", "table_dtype": "float32", "assemble": True},
        {"spec": mrope, "qk_dtype": "bfloat16", "table_dtype": None, "assemble": True},
    ]
    for spec, result in zip((mla, mrope), _compile_in_subprocess(90, requests), strict=True):
        assert "error" not in result, result.get("error")
        assert len(result["params"]) == result["expected_params"] == expected_param_count(RopeKernelSpec(**spec))
        assert result["cubin_bytes"] > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"angles": "table", "rotary_dim": 8, "head_dim": 16, "rotary_offset": 12}, "rotary_offset must be"),
        ({"angles": "table", "rotary_dim": 8, "head_dim": 16, "key_head_dim": 6}, "key_head_dim must be"),
        ({"angles": "table", "rotary_dim": 16, "head_dim": 16, "mrope_section": (2, 3, 4)}, "must sum to r/2 = 8"),
        ({"angles": "cache", "rotary_dim": 16, "head_dim": 16, "mrope_section": (2, 3, 3)}, "position ids with a"),
        ({"angles": "table", "rotary_dim": 16, "head_dim": 16, "mrope_section": (0, 4, 4), "mrope_interleaved": True},
         "cannot be interleaved"),
        ({"angles": "table", "rotary_dim": 16, "head_dim": 16, "mrope_interleaved": True}, "needs mrope_section"),
    ],
)  # fmt: skip
def test_bad_slice_and_section_specs_say_what_to_do(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RopeKernelSpec(**kwargs)


def test_multi_axis_positions_are_checked_before_launch() -> None:
    spec = RopeKernelSpec("table", 16, 16, mrope_section=(2, 3, 3))
    cos, sin = _table(functional.rope_inv_freq(16)[0])
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    with pytest.raises(ConfigError, match=r"multi-axis position ids must be \[3, B or 1, S\]"):
        rope_qk(q, k, spec, cos=cos, sin=sin, positions=torch.zeros(2, 5, dtype=torch.int64))
    with pytest.raises(ExportError, match="no multi-axis form"):
        rope_function("cache", 23, multi_axis=True)
