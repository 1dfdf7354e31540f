"""Multi-axis RoPE: M-RoPE (Qwen2-VL / Qwen2.5-VL chunked sections, Qwen3-VL interleaved) and axial 2-D RoPE for
image patches (Qwen2-VL's vision tower, Pixtral).

References: transformers 5.23's ``Qwen2VLRotaryEmbedding`` / ``Qwen3VLTextRotaryEmbedding`` with
``apply_rotary_pos_emb`` (text attention), ``Qwen2VLVisionRotaryEmbedding`` / ``PixtralVisionRotaryEmbedding``
(vision towers), each built from its own config class; at long positions the float64 formula (the modules compute
float32 angles, within their own float32 error of it).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc import AttentionBlock, AttentionConfig, ConfigError, build_scheme, from_hf_config, functional
from tests.conftest import covers

transformers = pytest.importorskip("transformers")

CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=4096)
LONG_CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=131072)


def vision_ids(batch: int, text: int, rows: int, cols: int, after: int) -> torch.Tensor:
    """``[3, B, S]`` ids of ``text`` tokens, an image of ``rows x cols`` patches, then ``after`` text tokens
    (transformers' ``get_rope_index``: image patches at (t, t + row, t + col), text resuming past the image)."""
    t = torch.arange(text)
    image = torch.stack(
        [
            torch.full((rows * cols,), text),
            text + torch.arange(rows).repeat_interleave(cols),
            text + torch.arange(cols).repeat(rows),
        ]
    )
    resume = text + max(rows, cols) + torch.arange(after)
    ids = torch.cat((t.expand(3, text), image, resume.expand(3, after)), dim=1)
    return ids.unsqueeze(1).expand(3, batch, ids.shape[1]).contiguous()


def _qwen2_vl(sections: list[int]) -> Any:
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    config = transformers.Qwen2VLTextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": sections},
    )  # fmt: skip
    return config, Qwen2VLRotaryEmbedding(config)


def _qwen3_vl(sections: list[int]) -> Any:
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    config = transformers.Qwen3VLTextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": sections,
                         "mrope_interleaved": True},
    )  # fmt: skip
    return config, Qwen3VLTextRotaryEmbedding(config)


def _imported(config: Any, model_type: str) -> Any:
    data = {**config.to_dict(), "model_type": model_type}
    return from_hf_config(data)


MODELS = {
    "qwen2-vl": (lambda: _qwen2_vl([2, 3, 3]), "qwen2_vl_text", {"mrope_section": (2, 3, 3)}),
    "qwen3-vl": (
        lambda: _qwen3_vl([4, 2, 2]),
        "qwen3_vl_text",
        {"mrope_section": (4, 2, 2), "mrope_interleaved": True},
    ),
}


@covers("rope_mrope")
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_mrope_cos_sin_match_the_qwen_rotary_modules(model: str, mode: str) -> None:
    """Config import picks M-RoPE from rope_type "default" + mrope_section; cos/sin equal the module's at short
    vision-like ids, and at long ids posenc's float32 tables equal the float64 formula where the module is within
    its own float32-angle error."""
    build, model_type, expected = MODELS[model]
    hf, rotary = build()
    imported = _imported(hf, model_type)
    assert imported.scheme == "rope_mrope"
    assert {k: tuple(v) if isinstance(v, list) else v for k, v in imported.params.items() if k in expected} == expected
    scheme = build_scheme(imported.scheme, LONG_CONFIG, imported.params, mode, max_positions=131072)
    exact = build_scheme(imported.scheme, LONG_CONFIG, imported.params, "dynamic", table_dtype=torch.float64)
    short = vision_ids(2, 3, 4, 5, 6)
    far = short + 131000
    for ids, tolerance in ((short, 3e-6), (far, None)):
        hf_cos, hf_sin = rotary(torch.zeros(1), ids)
        for got, want, theirs in zip(scheme.cos_sin(ids), exact.cos_sin(ids), (hf_cos, hf_sin), strict=True):
            theirs = theirs.double()
            torch.testing.assert_close(theirs[..., :8], theirs[..., 8:])  # cat(freqs, freqs): the half layout
            if tolerance is not None:
                torch.testing.assert_close(got.double(), theirs[..., :8], atol=tolerance, rtol=0)
            else:
                assert (got.double() - want).abs().max() < 2e-6
                assert (theirs[..., :8] - want).abs().max() < 131064 * 2.0**-22 + 1e-6  # the module's fp32 angles


@covers("rope_mrope")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mrope_rotation_matches_apply_rotary_pos_emb(dtype: torch.dtype) -> None:
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

    _, rotary = _qwen2_vl([2, 3, 3])
    scheme = build_scheme("rope_mrope", CONFIG, {"rope_theta": 1e6, "mrope_section": [2, 3, 3]})
    ids = vision_ids(2, 2, 3, 3, 3)
    q = torch.randn(2, 4, ids.shape[-1], 16).to(dtype)
    k = torch.randn(2, 2, ids.shape[-1], 16).to(dtype)
    cos, sin = rotary(q, ids)
    want_q, want_k = apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())
    got_q, got_k = scheme.rotate(q, k, ids)
    tolerance = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    for got, want in ((got_q, want_q), (got_k, want_k)):
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want, atol=tolerance, rtol=tolerance)


@covers("rope_mrope")
@pytest.mark.parametrize("params", [{}, {"mrope_interleaved": True}, {"layout": "interleaved"}])
def test_mrope_of_text_tokens_is_plain_rope(params: dict[str, Any]) -> None:
    """Text-only input carries equal ids on the three axes: M-RoPE is then RoPE with the same frequencies, in the
    op and in the block ([B, S] ids stand for all three axes)."""
    layout = {"layout": params["layout"]} if "layout" in params else {}
    mrope = AttentionBlock(CONFIG, "rope_mrope", params, table_dtype=torch.float64).double()
    rope = AttentionBlock(CONFIG, "rope", layout, table_dtype=torch.float64).double()
    rope.load_state_dict(mrope.state_dict(), strict=False)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    x = torch.randn(2, 6, 64, dtype=torch.float64)
    for given in (ids, ids.unsqueeze(0).expand(3, 2, 6)):
        for got, want in zip(mrope(x, given), rope(x, ids), strict=True):
            torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    distinct = ids.unsqueeze(0).expand(3, 2, 6).clone()
    distinct[1] += torch.arange(6) % 3  # a vision-like height axis (a constant shift would cancel) changes it
    assert not torch.allclose(mrope(x, distinct)[0], rope(x, ids)[0])


@covers("rope_mrope")
def test_mrope_block_masks_in_token_order() -> None:
    """Image patches share their temporal id and later text may carry smaller ids than the token count, yet each
    token sees exactly the tokens before it (transformers' Qwen2-VL masks by cache position): changing the last
    token leaves every earlier output alone, and a decode step with a cache equals the full recompute."""
    block = AttentionBlock(CONFIG, "rope_mrope", table_dtype=torch.float64).double()
    ids = vision_ids(1, 2, 2, 3, 3)
    s = ids.shape[-1]
    x = torch.randn(1, s, 64, dtype=torch.float64)
    out = block(x, ids)[0]
    changed = x.clone()
    changed[:, -1] += 1.0
    torch.testing.assert_close(block(changed, ids)[0][:, :-1], out[:, :-1], atol=0, rtol=0)
    prefill, key, value = block(x[:, :-2], ids[..., :-2])
    step1, key, value = block(x[:, -2:-1], ids[..., -2:-1], key, value)
    step2, _, _ = block(x[:, -1:], ids[..., -1:], key, value)
    torch.testing.assert_close(torch.cat((prefill, step1, step2), dim=1), out, atol=1e-12, rtol=0)


@covers("rope_mrope")
def test_mrope_bad_input_raises() -> None:
    with pytest.raises(ConfigError, match=r"mrope_section \[2, 3, 4\] sums to 9, but the rotary dim 16 has 8"):
        build_scheme("rope_mrope", CONFIG, {"mrope_section": [2, 3, 4]})
    with pytest.raises(ConfigError, match="three slot counts"):
        build_scheme("rope_mrope", CONFIG, {"mrope_section": [4, 4]})
    with pytest.raises(ConfigError, match="cannot be interleaved over 8 slots"):
        build_scheme("rope_mrope", CONFIG, {"mrope_section": [0, 4, 4], "mrope_interleaved": True})
    block = AttentionBlock(CONFIG, "rope_mrope")
    with pytest.raises(ConfigError, match=r"needs \[3, 2, 5\] .* one row per axis of rope_mrope"):
        block(torch.randn(2, 5, 64), torch.zeros(2, 2, 5, dtype=torch.int64))
    hf, _ = _qwen2_vl([2, 3, 3])
    data = {**hf.to_dict(), "model_type": "qwen2_vl_text"}
    data["rope_parameters"] = {**data["rope_parameters"], "rope_type": "yarn", "factor": 2.0}
    with pytest.raises(ConfigError, match=r"carry 'mrope_section' .* with rope_type 'yarn'"):
        from_hf_config(data)


# --------------------------------------------------------------------------------------------------
# Axial 2-D RoPE (vision patches)
# --------------------------------------------------------------------------------------------------


def _patch_ids(rows: int, cols: int) -> torch.Tensor:
    """``[N, 2]`` (row, column) of a rows x cols grid in raster order (the vision towers' meshgrid)."""
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return torch.stack((r.flatten(), c.flatten()), dim=-1)


def _vision_modules() -> dict[str, Any]:
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionRotaryEmbedding
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLVisionRotaryEmbedding

    qwen = transformers.Qwen2VLVisionConfig(embed_dim=64, num_heads=4)
    pixtral = transformers.PixtralVisionConfig(hidden_size=64, num_attention_heads=4, head_dim=16)
    return {
        "same": Qwen2VLVisionRotaryEmbedding(qwen),
        "odd": PixtralVisionRotaryEmbedding(pixtral),
    }


@covers("rope_axial")
@pytest.mark.parametrize("columns", ["same", "odd"])
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_axial_matches_the_vision_rotary_modules(columns: str, mode: str) -> None:
    """Rows and columns recombined as Qwen2-VL's vision tower (columns with the rows' frequencies) and Pixtral's
    (columns with the odd ones) do, rotation by ``apply_rotary_pos_emb`` (rotate_half)."""
    from transformers.models.pixtral.modeling_pixtral import apply_rotary_pos_emb

    module = _vision_modules()[columns]
    theta = float(module.config.rope_parameters["rope_theta"])
    config = AttentionConfig(hidden_size=64, num_heads=4, causal=False, max_position_embeddings=64)
    scheme = build_scheme("rope_axial", config, {"column_freqs": columns, "rope_theta": theta}, mode)
    patches = _patch_ids(5, 7)
    cos, sin = module(torch.zeros(1), patches)
    ids = patches.T.unsqueeze(1)  # posenc: [2, B=1, N]
    got_cos, got_sin = scheme.cos_sin(ids)
    torch.testing.assert_close(torch.cat((got_cos, got_cos), -1)[0], cos.float(), atol=3e-6, rtol=0)
    torch.testing.assert_close(torch.cat((got_sin, got_sin), -1)[0], sin.float(), atol=3e-6, rtol=0)
    q, k = torch.randn(1, 4, 35, 16), torch.randn(1, 4, 35, 16)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos.unsqueeze(0), sin.unsqueeze(0))
    got_q, got_k = scheme.rotate(q, k, ids)
    torch.testing.assert_close(got_q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=1e-5)


@covers("rope_axial")
def test_axial_scores_depend_on_the_row_and_column_offsets_only() -> None:
    """⟨R(r1, c1) q, R(r2, c2) k⟩ is a function of (r1 - r2, c1 - c2): shifting both patches by the same grid
    offset keeps the score; moving one along a row changes it, and rows and columns are not interchangeable."""
    config = AttentionConfig(hidden_size=64, num_heads=4, causal=False, max_position_embeddings=64)
    scheme = build_scheme("rope_axial", config, {"column_freqs": "odd"}, "dynamic", table_dtype=torch.float64)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)

    def score(qi: tuple[int, int], ki: tuple[int, int]) -> float:
        rq, _ = scheme.rotate(q, q, torch.tensor(qi).view(2, 1, 1))
        rk, _ = scheme.rotate(k, k, torch.tensor(ki).view(2, 1, 1))
        return float((rq * rk).sum())

    base = score((3, 5), (1, 2))  # offsets (2, 3)
    assert score((13, 10), (11, 7)) == pytest.approx(base, abs=1e-12)
    assert score((3, 6), (1, 2)) != pytest.approx(base, abs=1e-6)
    assert score((4, 4), (1, 2)) != pytest.approx(base, abs=1e-6)  # offsets (3, 2)


@covers("rope_axial")
def test_axial_bad_input_raises() -> None:
    odd_width = AttentionConfig(hidden_size=56, num_heads=4, max_position_embeddings=64)  # head_dim 14
    with pytest.raises(ConfigError, match="needs a rotary dim divisible by 4"):
        build_scheme("rope_axial", odd_width)
    with pytest.raises(ConfigError, match="must be one of"):
        build_scheme("rope_axial", CONFIG, {"column_freqs": "even"})
    scheme = build_scheme("rope_axial", CONFIG)
    with pytest.raises(ConfigError, match=r"takes position ids \[2, B, S\]"):
        scheme.cos_sin(torch.zeros(3, 1, 4, dtype=torch.int64))
    assert functional.rope_inv_freq(16, {"rope_type": "axial"})[0].shape == (8,)
