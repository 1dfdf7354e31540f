"""The registry drives the tests: every scheme needs property tests, and runs the generic checks here."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch

import tests.schemes
from posenc import AttentionBlock, AttentionConfig, ConfigError, build_scheme, get_spec, scheme_names, specs
from posenc.schemes import Param, Placement, SchemeSpec, TableMode, register
from posenc.schemes.base import PositionalScheme
from tests.conftest import SMALL, decode_in_steps

CASES = [
    pytest.param(spec.name, mode, case, id=f"{spec.name}-{mode.value}-{case}")
    for spec in specs()
    for mode in sorted(spec.table_modes, key=lambda m: m.value)
    for case in spec.cases
]


def _covered_schemes() -> set[str]:
    covered: set[str] = set()
    for info in pkgutil.iter_modules(tests.schemes.__path__):
        module = importlib.import_module(f"tests.schemes.{info.name}")
        for obj in vars(module).values():
            targets = [obj, *vars(obj).values()] if isinstance(obj, type) else [obj]
            for target in targets:
                for mark in getattr(target, "pytestmark", []):
                    if mark.name == "covers":
                        covered.update(mark.args)
    return covered


def test_every_registered_scheme_has_property_tests() -> None:
    missing = sorted(set(scheme_names()) - _covered_schemes())
    assert not missing, f"schemes without property tests (mark them with @covers): {missing}"


def test_every_family_from_the_design_is_registered() -> None:
    required = {
        "learned", "sinusoidal", "multiplicative", "floater", "shaw", "transformer_xl", "t5", "deberta", "tupe",
        "rope", "rope_linear", "rope_ntk", "rope_dynamic", "rope_yarn", "rope_longrope", "rope_llama3",
        "rope_truncation", "rerope", "leaky_rerope", "alibi", "rope_linear_attention", "nope",
    }  # fmt: skip
    assert required <= set(scheme_names()), sorted(required - set(scheme_names()))


def test_duplicate_registration_raises() -> None:
    spec = get_spec("nope")
    with pytest.raises(ConfigError, match="already registered"):
        register(spec, PositionalScheme)


def test_unknown_scheme_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="valid schemes are") as info:
        build_scheme("rope_typo", SMALL)
    assert "rope" in str(info.value)


def test_unknown_parameter_and_bad_values_raise() -> None:
    with pytest.raises(ConfigError, match="valid parameters"):
        build_scheme("rope", SMALL, {"theta": 1.0})
    with pytest.raises(ConfigError, match="must be >"):
        build_scheme("rope_linear", SMALL, {"factor": 0})
    with pytest.raises(ConfigError, match="one of"):
        build_scheme("rope", SMALL, {"layout": "neox"})


def test_unsupported_table_mode_raises() -> None:
    with pytest.raises(ConfigError, match="does not support table mode"):
        build_scheme("rope_dynamic", SMALL, table_mode="precomputed")
    with pytest.raises(ConfigError, match="unknown table mode"):
        build_scheme("rope", SMALL, table_mode="cached")


def test_spec_requires_default_case() -> None:
    spec = SchemeSpec(
        name="tmp_no_default", title="t", family="t", placement=Placement.NONE, params=(Param("a", "int", 1, "a"),),
        table_modes=frozenset({TableMode.DYNAMIC}), citation="c", summary="s", cases={"x": {}},
    )  # fmt: skip
    with pytest.raises(ConfigError, match="default"):
        register(spec, PositionalScheme)


def _pair(name: str, mode: TableMode, case: str, config: AttentionConfig = SMALL):
    params = get_spec(name).cases[case]
    block = AttentionBlock(config, name, params, mode)
    reference = AttentionBlock(config, name, params, mode, table_dtype=torch.float64).double()
    reference.load_state_dict({k: v.double() for k, v in block.state_dict().items()}, strict=False)
    return block, reference


@pytest.mark.parametrize(("name", "mode", "case"), CASES)
def test_block_fp32_and_fp16_match_float64_reference(name: str, mode: TableMode, case: str) -> None:
    spec = get_spec(name)
    block, reference = _pair(name, mode, case)
    x = torch.randn(2, 11, SMALL.hidden_size)
    expected, _, _ = reference(x.double())
    got, _, _ = block(x)
    tol = spec.tolerance("float32")
    torch.testing.assert_close(got.double(), expected, atol=tol.atol, rtol=tol.rtol)
    half = AttentionBlock(SMALL, name, spec.cases[case], mode)
    half.load_state_dict(block.state_dict())
    got16, _, _ = half.half()(x.half())
    tol = spec.tolerance("float16")
    torch.testing.assert_close(got16.double(), expected, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize(("name", "mode", "case"), CASES)
def test_decode_with_cache_equals_full_recompute(name: str, mode: TableMode, case: str) -> None:
    if get_spec(name).length_dependent:
        pytest.skip("length-dependent frequencies: cached keys were encoded for a shorter length by design")
    _, block = _pair(name, mode, case)
    x = torch.randn(2, 12, SMALL.hidden_size, dtype=torch.float64)
    full, _, _ = block(x)
    torch.testing.assert_close(decode_in_steps(block, x, 7), full, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", [s.name for s in specs() if s.name != "nope" and s.placement is not Placement.NONE])
def test_scheme_carries_position_information(name: str) -> None:
    """Without a causal mask, attention is permutation-equivariant unless the scheme encodes position."""
    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=64, causal=False)
    spec = get_spec(name)
    mode = sorted(spec.table_modes, key=lambda m: m.value)[0]
    block = AttentionBlock(config, name, spec.cases["default"], mode).double()
    x = torch.randn(1, 10, 64, dtype=torch.float64)
    perm = torch.randperm(10)
    out, _, _ = block(x)
    permuted, _, _ = block(x[:, perm])
    assert not torch.allclose(permuted, out[:, perm], atol=1e-6)


def test_nope_is_permutation_equivariant_without_mask() -> None:
    config = AttentionConfig(hidden_size=64, num_heads=4, max_position_embeddings=64, causal=False)
    block = AttentionBlock(config, "nope").double()
    x = torch.randn(1, 10, 64, dtype=torch.float64)
    perm = torch.randperm(10)
    out, _, _ = block(x)
    permuted, _, _ = block(x[:, perm])
    torch.testing.assert_close(permuted, out[:, perm])
