"""The rope_type registry: a registered type reaches functional, the schemes and the config import; entries agree
with what they claim (transformers' ROPE_INIT_FUNCTIONS, citations, length dependence); bad entries are refused.

References: transformers' ``ROPE_INIT_FUNCTIONS`` keys (which types transformers defines), and for the toy types
their formulas written out here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from posenc import ConfigError, build_scheme, from_hf_config, functional, get_spec, rope_types, scheme_names
from posenc.params import Param
from posenc.schemes import TableMode
from posenc.schemes.rope import rope_parameters
from tests.conftest import SMALL

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 64}


def _toy(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: Any) -> tuple[torch.Tensor, float]:
    """The default frequencies divided by ``stretch``, and cos/sin multiplied by 1.5."""
    stretch = rope_types.positive(rope_types.require(params, "stretch", "toy"), "stretch")
    return rope_types.default_inv_freq(rotary_dim, base) / stretch, 1.5


TOY = rope_types.RopeType(
    name="toy",
    inv_freq=_toy,
    scheme="rope_toy",
    title="RoPE + toy stretch",
    summary="Frequencies divided by a stretch; cos/sin times 1.5.",
    citation=rope_types.Citation("Nobody", "A toy for the registry test", 2026, "https://example.org/toy"),
    params=(Param("stretch", "float", 3.0, "divisor of every frequency", minimum=0, exclusive_minimum=True),),
    aliases=("toy_legacy",),
    cases={"stretched": {"stretch": 7.0}},
)


def toy_entry(name: str, inv_freq: rope_types.InvFreq, **fields: Any) -> rope_types.RopeType:
    """A RopeType for tests: scheme ``rope_<name>``, placeholder texts, not a transformers type."""
    return rope_types.RopeType(
        name=name,
        inv_freq=inv_freq,
        scheme=f"rope_{name}",
        title=f"toy {name}",
        summary="a test type",
        citation=TOY.citation,
        **{"in_transformers": False, **fields},
    )


def _expected_toy(rotary_dim: int, stretch: float, theta: float = 10000.0) -> torch.Tensor:
    return torch.tensor([theta ** (-2 * i / rotary_dim) / stretch for i in range(rotary_dim // 2)], dtype=torch.float64)


def _assert_gone(entry: rope_types.RopeType) -> None:
    assert entry.name not in rope_types.names()
    assert entry.scheme not in scheme_names()
    assert "stretch" not in functional.ROPE_PARAMETER_KEYS
    with pytest.raises(ConfigError, match="valid rope_type values"):
        functional.rope_inv_freq(8, {"rope_type": entry.name})


def test_a_registered_type_reaches_functional_schemes_and_config_import_and_leaves_nothing() -> None:
    with rope_types.registered(TOY):
        # functional: the contract dispatches to it, through its alias too
        assert "toy" in functional.ROPE_TYPES
        for name in ("toy", "toy_legacy"):
            inv_freq, factor = functional.rope_inv_freq(16, {"rope_type": name, "stretch": 2.0})
            torch.testing.assert_close(inv_freq, _expected_toy(16, 2.0), rtol=1e-15, atol=0)
            assert factor == 1.5
        with pytest.raises(ConfigError, match="needs 'stretch'"):
            functional.rope_inv_freq(16, {"rope_type": "toy"})
        # schemes: the spec is derived from the entry, the module computes its cos/sin
        spec = get_spec("rope_toy")
        assert spec.param_names() == ["rope_theta", "layout", "partial_rotary_factor", "stretch"]
        assert set(spec.cases) == {"default", "partial", "interleaved", "stretched"}
        assert spec.table_modes == {TableMode.PRECOMPUTED, TableMode.DYNAMIC}
        assert "A toy for the registry test" in spec.citation
        assert "RoFormer" in spec.citation
        for mode in ("precomputed", "dynamic"):
            scheme = build_scheme("rope_toy", SMALL, {"stretch": 4.0}, mode, table_dtype=torch.float64)
            positions = torch.arange(20).unsqueeze(0)
            cos, _ = scheme.cos_sin(positions)
            expected = torch.cos(positions[0, :, None].double() * _expected_toy(16, 4.0)) * 1.5
            torch.testing.assert_close(cos[0], expected, rtol=0, atol=1e-12)
            assert scheme.spec is spec
        with pytest.raises(ConfigError, match=r"stretch.*must be >"):
            build_scheme("rope_toy", SMALL, {"stretch": 0.0})
        # config import: rope_type (and alias) -> scheme; the type's own key is copied
        for name in ("toy", "toy_legacy"):
            imported = from_hf_config({**LLAMA, "rope_scaling": {"rope_type": name, "stretch": 5.0}})
            assert (imported.scheme, imported.params) == ("rope_toy", {"rope_theta": 10000.0, "stretch": 5.0})
    _assert_gone(TOY)
    with pytest.raises(ConfigError, match=r"rope_type 'toy' in config.json is not supported"):
        from_hf_config({**LLAMA, "rope_scaling": {"rope_type": "toy", "stretch": 5.0}})


def _proportional(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: Any) -> tuple[torch.Tensor, float]:
    """Frequencies over the whole head dim D (= rotary_dim here); the pairs past int(D * p) / 2 get 0."""
    rotated = int(rotary_dim * params.get("partial_rotary_factor", 1.0)) // 2
    inv_freq = rope_types.default_inv_freq(rotary_dim, base)
    inv_freq[rotated:] = 0.0
    return inv_freq, 1.0


def test_a_proportional_type_spans_the_head_dim_and_leaves_the_unrotated_pairs_alone() -> None:
    entry = toy_entry("toy_proportional", _proportional, partial_rotary="proportional")
    with rope_types.registered(entry):
        scheme = build_scheme(entry.scheme, SMALL, {"partial_rotary_factor": 0.5}, table_dtype=torch.float64)
        assert scheme.rotary_dim == 16  # the head dim, not int(16 * 0.5)
        q, k = torch.randn(1, 4, 5, 16, dtype=torch.float64), torch.randn(1, 2, 5, 16, dtype=torch.float64)
        positions = torch.arange(3, 8).unsqueeze(0)
        qr, _ = scheme.rotate(q, k, positions)
        # half layout pairs (i, i + 8): pairs 0..3 rotate with θ^(-2i/16), pairs 4..7 (features 4..7, 12..15) stay
        for i in range(8):
            angle = positions[0].double() * (10000.0 ** (-2 * i / 16) if i < 4 else 0.0)
            c, s = torch.cos(angle), torch.sin(angle)
            torch.testing.assert_close(qr[..., i], q[..., i] * c - q[..., i + 8] * s)
            torch.testing.assert_close(qr[..., i + 8], q[..., i + 8] * c + q[..., i] * s)
        assert torch.equal(qr[..., 4:8], q[..., 4:8])
        assert rope_parameters(entry.name, scheme.params, SMALL)["partial_rotary_factor"] == 0.5
    _assert_gone(entry)


def test_a_continuous_length_dependent_type_is_evaluated_in_the_graph() -> None:
    """A toy type whose base grows with L: one definition, evaluated on an int (eager) and a tensor (graph)."""

    def grow(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: Any) -> tuple[torch.Tensor, float]:
        length = 64 if seq_len is None else seq_len
        length = length.to(torch.float64) if isinstance(length, torch.Tensor) else float(length)
        return rope_types.default_inv_freq(rotary_dim, base * rope_types.at_least(length, 64) / 64), 1.0

    entry = toy_entry("toy_grow", grow, length_dependent=True, table_modes=frozenset({"dynamic"}))
    with rope_types.registered(entry):
        assert get_spec(entry.scheme).length_dependent
        with pytest.raises(ConfigError, match="does not support table mode 'precomputed'"):
            build_scheme(entry.scheme, SMALL, table_mode="precomputed")
        with pytest.raises(ConfigError, match="depends continuously on the current length"):
            functional.rope_frequency_sets(16, {"rope_type": "toy_grow"})
        scheme = build_scheme(entry.scheme, SMALL, table_mode="dynamic", table_dtype=torch.float64)
        for length in (10, 64, 200):
            positions = torch.arange(length).unsqueeze(0)
            cos, _ = scheme.cos_sin(positions)
            inv_freq = _expected_toy(16, 1.0, 10000.0 * max(length, 64) / 64)
            torch.testing.assert_close(cos[0], torch.cos(positions[0, :, None].double() * inv_freq))
    _assert_gone(entry)


def test_registry_refuses_contradictory_or_clashing_entries() -> None:
    base: dict[str, Any] = {"inv_freq": _toy, "title": "t", "summary": "s", "citation": TOY.citation}
    with pytest.raises(ConfigError, match="already registered"):
        rope_types.register(rope_types.RopeType(name="yarn", scheme="rope_other", **base))
    with pytest.raises(ConfigError, match="already registered"):
        rope_types.register(rope_types.RopeType(name="other", scheme="rope_other", aliases=("linear",), **base))
    with pytest.raises(ConfigError, match="already belongs"):
        rope_types.register(rope_types.RopeType(name="other", scheme="rope_yarn", **base))
    with pytest.raises(ConfigError, match="cannot have precomputed tables"):
        rope_types.register(rope_types.RopeType(name="other", scheme="rope_other", length_dependent=True, **base))
    with pytest.raises(ConfigError, match="which every rope_type has"):
        rope_types.register(
            rope_types.RopeType(
                name="other", scheme="rope_other", params=(Param("rope_theta", "float", 1.0, "x"),), **base
            )
        )
    with pytest.raises(ConfigError, match="partial_rotary"):
        rope_types.register(rope_types.RopeType(name="other", scheme="rope_other", partial_rotary="tail", **base))
    with pytest.raises(ConfigError, match="the label must be another type's name"):
        rope_types.register(rope_types.RopeType(name="other", scheme="rope_other", claims={"dynamic": "alpha"}, **base))
    with pytest.raises(ConfigError, match="needs static frequencies"):
        rope_types.register(
            rope_types.RopeType(
                name="other",
                scheme="rope_other",
                length_dependent=True,
                table_modes=frozenset({"dynamic"}),
                scale_rate=lambda r, p: torch.zeros(r // 2),
                **base,
            )
        )
    # The scheme registry refuses a name another (non-RoPE) scheme holds: nothing stays registered.
    with pytest.raises(ConfigError, match="already registered"):
        rope_types.register(rope_types.RopeType(name="other", scheme="rerope", **base))
    assert "other" not in rope_types.names()
    with pytest.raises(ConfigError, match="valid rope_type values are"):
        rope_types.get("other")


def test_entries_agree_with_transformers_and_their_schemes() -> None:
    transformers = pytest.importorskip("transformers.modeling_rope_utils", reason="transformers is the reference")
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1RotaryEmbedding
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    # types a model's own rotary class defines (HunYuan's NTK-α, Qwen2-VL's M-RoPE sections) count as transformers
    # types too
    per_model = {"ntk_alpha"} if hasattr(HunYuanDenseV1RotaryEmbedding, "compute_ntk_alpha_rope_parameters") else set()
    per_model |= {"mrope"} if hasattr(Qwen2VLRotaryEmbedding, "recomposition_frequencies") else set()
    hf_types = set(transformers.ROPE_INIT_FUNCTIONS) | {"default"} | per_model
    for name in rope_types.names():
        entry = rope_types.get(name)
        assert entry.in_transformers == (name in hf_types), name
        spec = get_spec(entry.scheme)
        assert spec.param_names()[3:] == list(entry.param_names)
        assert spec.length_dependent == entry.length_dependent
        assert {m.value for m in spec.table_modes} == set(entry.table_modes)
        assert str(entry.citation) in spec.citation
        assert entry.citation.link.startswith("https://")
        assert 2017 <= entry.citation.year <= 2026
    assert rope_types.transformers_schemes() == {
        "default": "rope", "linear": "rope_linear", "dynamic": "rope_dynamic", "yarn": "rope_yarn",
        "longrope": "rope_longrope", "llama3": "rope_llama3", "proportional": "rope_proportional",
        "ntk_alpha": "rope_ntk_alpha", "mrope": "rope_mrope",
    }  # fmt: skip


@pytest.mark.parametrize("length", [1, 16, 17, 40])
def test_longrope_frequency_sets_switch_after_the_original_context(length: int) -> None:
    params = {"rope_type": "longrope", "original_max_position_embeddings": 16, "factor": 4.0,
              "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 3.0, 5.0, 8.0]}  # fmt: skip
    points, sets = functional.rope_frequency_sets(8, params)
    assert points == (16,)
    index = int(length > 16)
    expected, factor = functional.rope_inv_freq(8, params, seq_len=length)
    torch.testing.assert_close(sets[index][0], expected, rtol=0, atol=0)
    assert sets[index][1] == factor == pytest.approx(math.sqrt(1 + math.log(4.0) / math.log(16)))
    static_points, static_sets = functional.rope_frequency_sets(8, {"rope_type": "linear", "factor": 2.0})
    assert static_points == ()
    assert len(static_sets) == 1
