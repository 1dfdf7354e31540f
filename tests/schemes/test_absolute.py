"""Property tests of the absolute schemes: learned, sinusoidal, multiplicative, FLOATER.

References are independent of the code under test: naive loops of the formulas (Vaswani et al. 2017,
arXiv:1706.03762, §3.5), trigonometric identities, float64 angles, matrix exponentials and closed-form ODE solutions.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc import AttentionBlock, AttentionConfig, ConfigError, build_scheme
from posenc.errors import PositionError
from posenc.functional import sinusoidal_table
from posenc.schemes.absolute import Floater, rk4_trajectory
from tests.conftest import SMALL, covers

E = SMALL.hidden_size  # 64
P = SMALL.max_position_embeddings  # 64


def _positions(*rows: list[int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


def _encoding(scheme, position_ids: torch.Tensor) -> torch.Tensor:
    """The additive position vectors: embed() of zero hidden states, ``[B, S, E]``."""
    hidden = torch.zeros(*position_ids.shape, scheme.config.hidden_size, dtype=torch.float64)
    return scheme.embed(hidden, position_ids)


# --------------------------------------------------------------------------------------------------
# sinusoidal
# --------------------------------------------------------------------------------------------------


def _naive_sinusoidal(num_positions: int, dim: int, layout: str, base: float) -> torch.Tensor:
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    for t in range(num_positions):
        for i in range(dim // 2):
            angle = t / base ** (2 * i / dim)
            if layout == "interleaved":
                table[t, 2 * i], table[t, 2 * i + 1] = math.sin(angle), math.cos(angle)
            else:
                table[t, i], table[t, dim // 2 + i] = math.sin(angle), math.cos(angle)
    return table


def _sinusoidal_rows(layout: str, base: float = 10000.0, mode: str = "precomputed", dtype=torch.float64):
    scheme = build_scheme("sinusoidal", SMALL, {"layout": layout, "base": base}, mode, table_dtype=dtype)
    return _encoding(scheme, torch.arange(P).unsqueeze(0))[0]


@covers("sinusoidal")
@pytest.mark.parametrize("layout", ["interleaved", "concat"])
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_sinusoidal_equals_naive_double_loop(layout: str, mode: str) -> None:
    for base in (10000.0, 500.0):
        expected = _naive_sinusoidal(P, E, layout, base)
        torch.testing.assert_close(_sinusoidal_rows(layout, base, mode), expected, atol=1e-12, rtol=0)
        torch.testing.assert_close(_sinusoidal_rows(layout, base, mode, torch.float32), expected, atol=1e-6, rtol=0)


@covers("sinusoidal")
def test_sinusoidal_matches_seed_numpy_recipe() -> None:
    """Vaswani et al. 2017 §3.5: angle pos / 10000^(2(j//2)/d), sin on even columns, cos on odd ones."""
    j = torch.arange(E, dtype=torch.float64)
    angles = torch.arange(P, dtype=torch.float64).unsqueeze(1) / torch.pow(
        10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / E
    )
    expected = torch.where(j.remainder(2) == 0, torch.sin(angles), torch.cos(angles))
    torch.testing.assert_close(_sinusoidal_rows("interleaved"), expected, atol=1e-12, rtol=0)


def _rotation(k: int, layout: str, base: float = 10000.0) -> torch.Tensor:
    """M_k with PE_{t+k} = M_k PE_t, from sin(a+b) = sin a cos b + cos a sin b, cos(a+b) = cos a cos b - sin a sin b."""
    m = torch.zeros(E, E, dtype=torch.float64)
    for i in range(E // 2):
        c, s = math.cos(k / base ** (2 * i / E)), math.sin(k / base ** (2 * i / E))
        si, ci = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, E // 2 + i)
        m[si, si], m[si, ci] = c, s
        m[ci, si], m[ci, ci] = -s, c
    return m


@covers("sinusoidal")
@pytest.mark.parametrize("layout", ["interleaved", "concat"])
def test_sinusoidal_shift_is_a_fixed_linear_map(layout: str) -> None:
    """PE_{t+k} = M_k PE_t for every t, M_k independent of t (Vaswani et al. 2017 §3.5)."""
    pe = _sinusoidal_rows(layout)
    for k in (1, 5, 17):
        shifted = pe[:-k] @ _rotation(k, layout).T
        torch.testing.assert_close(shifted, pe[k:], atol=1e-12, rtol=0)
        for wrong in (_rotation(k + 1, layout), _rotation(k, layout).T):
            assert not torch.allclose(pe[:-k] @ wrong.T, pe[k:], atol=1e-3)


@covers("sinusoidal")
@pytest.mark.parametrize("layout", ["interleaved", "concat"])
def test_sinusoidal_dot_product_depends_only_on_offset(layout: str) -> None:
    """PE_t·PE_{t+k} = Σ_i cos(ω_i k) = PE_t·PE_{t-k}: the dot product has no sense of direction."""
    pe = _sinusoidal_rows(layout)
    gram = pe @ pe.T
    for k in (1, 3, 10, 31):
        expected = sum(math.cos(k / 10000.0 ** (2 * i / E)) for i in range(E // 2))
        forward = torch.diagonal(gram, offset=k)  # t, t + k
        torch.testing.assert_close(forward, torch.full_like(forward, expected), atol=1e-12, rtol=0)
        torch.testing.assert_close(forward[k:], torch.diagonal(gram, offset=-k)[k:], atol=1e-12, rtol=0)


@covers("sinusoidal")
@pytest.mark.parametrize("layout", ["interleaved", "concat"])
def test_sinusoidal_dynamic_equals_precomputed_below_the_table(layout: str) -> None:
    positions = torch.randint(0, P, (3, 9))
    pre = build_scheme("sinusoidal", SMALL, {"layout": layout}, "precomputed")
    dyn = build_scheme("sinusoidal", SMALL, {"layout": layout}, "dynamic")
    hidden = torch.randn(3, 9, E)
    torch.testing.assert_close(dyn.embed(hidden, positions), pre.embed(hidden, positions), atol=2e-6, rtol=0)


@covers("sinusoidal")
def test_sinusoidal_dynamic_stays_accurate_at_long_positions() -> None:
    positions = _positions([131071, 131070, 131072 - 4096, 100003, 65537, 70001, 1 << 16, 12345])
    dynamic = build_scheme("sinusoidal", SMALL, table_mode="dynamic")
    got = _encoding(dynamic, positions).to(torch.float64)[0]
    omega = torch.tensor([1 / 10000.0 ** (2 * i / E) for i in range(E // 2)], dtype=torch.float64)
    angles64 = positions[0].to(torch.float64).unsqueeze(1) * omega
    expected = torch.stack((torch.sin(angles64), torch.cos(angles64)), dim=-1).flatten(-2)
    assert (got - expected).abs().max() < 1e-5
    angles32 = positions[0].to(torch.float32).unsqueeze(1) * omega.to(torch.float32)  # the naive recipe
    naive = torch.stack((torch.sin(angles32), torch.cos(angles32)), dim=-1).flatten(-2).to(torch.float64)
    assert (naive - expected).abs().max() > 1e-3


@covers("sinusoidal")
def test_sinusoidal_rejects_bad_parameters() -> None:
    with pytest.raises(ConfigError, match="one of"):
        build_scheme("sinusoidal", SMALL, {"layout": "half"})
    with pytest.raises(ConfigError, match="must be >"):
        build_scheme("sinusoidal", SMALL, {"base": 0})


@covers("sinusoidal", "floater")
@pytest.mark.parametrize(
    ("name", "mode"), [("sinusoidal", "precomputed"), ("sinusoidal", "dynamic"), ("floater", "precomputed")]
)
def test_tables_keep_their_dtype_when_the_module_is_cast(name: str, mode: str) -> None:
    scheme = build_scheme(name, SMALL, table_mode=mode).eval()
    expected = _encoding(scheme, torch.arange(8).unsqueeze(0)).float()
    scheme.half()
    assert all(t.dtype == torch.float32 for t in scheme.buffers())
    got = scheme.embed(torch.zeros(1, 8, E, dtype=torch.float16), torch.arange(8).unsqueeze(0))
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), expected, atol=2e-3, rtol=2e-3)


# --------------------------------------------------------------------------------------------------
# learned and multiplicative
# --------------------------------------------------------------------------------------------------


@covers("learned")
def test_learned_adds_the_gathered_rows() -> None:
    scheme = build_scheme("learned", SMALL)
    positions = torch.randint(0, P, (2, 7))
    hidden = torch.randn(2, 7, E)
    reference = torch.nn.Embedding(P, E)  # BERT's recipe (Devlin et al. 2019, arXiv:1810.04805)
    reference.weight.data.copy_(scheme.weight.data)
    got = scheme.embed(hidden, positions)
    torch.testing.assert_close(got, hidden + reference(positions), atol=0, rtol=0)
    torch.testing.assert_close(got, hidden + scheme.weight.detach()[positions], atol=0, rtol=0)
    weight = scheme.weight.detach()
    assert abs(float(weight.std()) - 0.02) < 0.002
    assert abs(float(weight.mean())) < 0.002


@covers("learned")
def test_learned_gradients_reach_only_the_used_rows() -> None:
    scheme = build_scheme("learned", SMALL)
    positions = _positions([3, 5, 5])
    scheme.embed(torch.zeros(1, 3, E), positions).sum().backward()
    used = scheme.weight.grad.abs().sum(-1) > 0
    assert used.nonzero().flatten().tolist() == [3, 5]
    torch.testing.assert_close(scheme.weight.grad[5], torch.full((E,), 2.0))


@covers("learned")
def test_learned_decode_step_uses_rows_past_onwards() -> None:
    block = AttentionBlock(SMALL, "learned").double()
    seen: list[torch.Tensor] = []
    embed = block.scheme.embed

    def spy(hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        out = embed(hidden, position_ids)
        seen.append(out - hidden)
        return out

    block.scheme.embed = spy
    x = torch.randn(2, 9, E, dtype=torch.float64)
    _, k, v = block(x[:, :6])
    block(x[:, 6:], past_key=k, past_value=v)
    weight = block.scheme.weight.detach()
    torch.testing.assert_close(seen[0], weight[0:6].expand(2, 6, E), atol=1e-15, rtol=0)
    torch.testing.assert_close(seen[1], weight[6:9].expand(2, 3, E), atol=1e-15, rtol=0)


@covers("learned", "multiplicative")
@pytest.mark.parametrize("name", ["learned", "multiplicative"])
def test_positions_past_a_learned_table_raise_with_the_remedy(name: str) -> None:
    scheme = build_scheme(name, SMALL, max_positions=10)
    assert scheme.weight.shape == (10, E)
    scheme.embed(torch.zeros(1, 1, E), _positions([9]))
    with pytest.raises(PositionError, match="past the precomputed table of 10 rows") as info:
        scheme.embed(torch.zeros(1, 2, E), _positions([9, 10]))
    assert "max_positions > 10" in str(info.value)
    assert "train the new rows" in str(info.value)
    assert "dynamic" not in str(info.value)
    with pytest.raises(PositionError, match=">= 0"):
        scheme.embed(torch.zeros(1, 1, E), _positions([-1]))
    with pytest.raises(ConfigError, match="integer"):
        scheme.embed(torch.zeros(1, 1, E), torch.zeros(1, 1))
    with pytest.raises(ConfigError, match="does not support table mode"):
        build_scheme(name, SMALL, table_mode="dynamic")


@covers("multiplicative")
def test_multiplicative_multiplies_elementwise() -> None:
    scheme = build_scheme("multiplicative", SMALL)
    table = scheme.weight.detach()
    assert abs(float(table.mean()) - 1.0) < 0.002
    assert abs(float(table.std()) - 0.02) < 0.002
    positions = torch.randint(0, P, (2, 7))
    hidden = torch.randn(2, 7, E)
    expected = torch.stack([torch.stack([hidden[b, s] * table[positions[b, s]] for s in range(7)]) for b in range(2)])
    torch.testing.assert_close(scheme.embed(hidden, positions), expected, atol=0, rtol=0)
    assert scheme.embed(torch.zeros(2, 7, E), positions).abs().max() == 0  # a product, not a sum


# --------------------------------------------------------------------------------------------------
# BERT / RoBERTa / BART embeddings (position offset, token type, LayerNorm)
# --------------------------------------------------------------------------------------------------


def _transformers():
    return pytest.importorskip("transformers", reason="transformers' embeddings are the reference")


@covers("learned")
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_learned_equals_bert_and_roberta_embeddings(family: str) -> None:
    """inputs_embeds + token_type_embeddings[0] + position_embeddings[p (+ padding_idx + 1)], then LayerNorm."""
    transformers = _transformers()
    geometry = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 40, "layer_norm_eps": 1e-12,
                "hidden_dropout_prob": 0.0, "vocab_size": 10, "type_vocab_size": 2}  # fmt: skip
    if family == "bert":
        from transformers.models.bert.modeling_bert import BertEmbeddings as Embeddings

        hf_config, offset = transformers.BertConfig(**geometry), 0
    else:
        from transformers.models.roberta.modeling_roberta import RobertaEmbeddings as Embeddings

        hf_config, offset = transformers.RobertaConfig(**{**geometry, "max_position_embeddings": 42}, pad_token_id=1), 2
    hf = Embeddings(hf_config).eval()
    with torch.no_grad():
        for parameter in (hf.position_embeddings.weight, hf.token_type_embeddings.weight, hf.LayerNorm.bias):
            parameter.normal_()
        hf.LayerNorm.weight.normal_(mean=1.0, std=0.3)
    params = {"position_offset": offset, "token_type": True, "embedding_norm": True, "norm_eps": 1e-12}
    scheme = build_scheme("learned", SMALL, params, max_positions=40)
    scheme.load_state_dict({
        "weight": hf.position_embeddings.weight,  # all rows, the offset ones included
        "token_type_embedding": hf.token_type_embeddings.weight[0],
        "embedding_norm.weight": hf.LayerNorm.weight,
        "embedding_norm.bias": hf.LayerNorm.bias,
    })  # fmt: skip
    assert scheme.weight.shape == (40 + offset, E)
    x = torch.randn(2, 23, E)
    with torch.no_grad():
        expected = hf(inputs_embeds=x)
        got = scheme.embed(x, torch.arange(23).expand(2, 23))
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-6)
    with torch.no_grad():  # a decode step at positions 30..32 against explicit position ids (+ offset)
        expected = hf(inputs_embeds=x[:, :3], position_ids=torch.arange(30, 33).expand(2, 3) + offset)
        got = scheme.embed(x[:, :3], torch.arange(30, 33).expand(2, 3))
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-6)


@covers("learned")
def test_learned_equals_bart_positions_and_layernorm_embedding() -> None:
    """BART: BartLearnedPositionalEmbedding (offset 2) added to the inputs, then layernorm_embedding."""
    _transformers()
    from transformers.models.bart.modeling_bart import BartLearnedPositionalEmbedding

    positions = BartLearnedPositionalEmbedding(40, E)
    norm = torch.nn.LayerNorm(E, eps=1e-5)
    with torch.no_grad():
        positions.weight.normal_()
        norm.weight.normal_(mean=1.0, std=0.3)
        norm.bias.normal_()
    scheme = build_scheme("learned", SMALL, {"position_offset": 2, "embedding_norm": True, "norm_eps": 1e-5},
                          max_positions=40)  # fmt: skip
    scheme.load_state_dict(
        {"weight": positions.weight, **{f"embedding_norm.{k}": v for k, v in norm.state_dict().items()}}
    )
    x = torch.randn(2, 5, E)
    with torch.no_grad():
        expected = norm(x + positions(x[..., 0], past_key_values_length=7))
        got = scheme.embed(x, torch.arange(7, 12).expand(2, 5))
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-6)


@covers("learned")
def test_learned_options_are_named_state_dict_entries_and_validated() -> None:
    scheme = build_scheme("learned", SMALL, {"position_offset": 2, "token_type": True, "embedding_norm": True},
                          max_positions=10)  # fmt: skip
    assert {k: tuple(v.shape) for k, v in scheme.state_dict().items()} == {
        "weight": (12, E), "token_type_embedding": (E,), "embedding_norm.weight": (E,), "embedding_norm.bias": (E,)
    }  # fmt: skip
    scheme.embed(torch.zeros(1, 1, E), _positions([9]))  # row 11, the last one
    with pytest.raises(PositionError, match="past the precomputed table of 10 rows"):
        scheme.embed(torch.zeros(1, 1, E), _positions([10]))  # positions stay 0-based: 10 rows serve 0..9
    assert set(build_scheme("learned", SMALL).state_dict()) == {"weight"}
    with pytest.raises(ConfigError, match="'position_offset' must be >= 0"):
        build_scheme("learned", SMALL, {"position_offset": -1})
    with pytest.raises(ConfigError, match="'norm_eps' must be > 0"):
        build_scheme("learned", SMALL, {"embedding_norm": True, "norm_eps": 0})


# --------------------------------------------------------------------------------------------------
# Odd widths: Marian (concat) and XLM (interleaved) tables
# --------------------------------------------------------------------------------------------------


@covers("sinusoidal")
@pytest.mark.parametrize("dim", [7, 63, 64])
@pytest.mark.parametrize("layout", ["concat", "interleaved"])
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_sinusoidal_equals_marian_and_xlm_tables_for_odd_and_even_widths(dim: int, layout: str, mode: str) -> None:
    _transformers()
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
    from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings

    if layout == "concat":
        expected = MarianSinusoidalPositionalEmbedding(50, dim).create_weight()
    else:
        expected = create_sinusoidal_embeddings(50, dim, torch.empty(50, dim))
    config = AttentionConfig(hidden_size=dim, num_heads=1, head_dim=8, max_position_embeddings=50)
    scheme = build_scheme("sinusoidal", config, {"layout": layout}, mode)
    got = _encoding(scheme, torch.arange(50).unsqueeze(0))[0].float()
    torch.testing.assert_close(got, expected, atol=2e-6 if mode == "dynamic" else 1e-7, rtol=0)
    torch.testing.assert_close(sinusoidal_table(50, dim, layout), expected, atol=1e-7, rtol=0)


@covers("sinusoidal")
def test_odd_width_block_runs_and_decodes_like_a_full_recompute() -> None:
    config = AttentionConfig(hidden_size=63, num_heads=4, head_dim=16, max_position_embeddings=32)
    block = AttentionBlock(config, "sinusoidal", {"layout": "concat"}, "dynamic").double()
    x = torch.randn(2, 9, 63, dtype=torch.float64)
    full, _, _ = block(x)
    _, k, v = block(x[:, :5])
    step, _, _ = block(x[:, 5:], past_key=k, past_value=v)
    torch.testing.assert_close(step, full[:, 5:])
    assert full.shape == (2, 9, 63)


# --------------------------------------------------------------------------------------------------
# FLOATER
# --------------------------------------------------------------------------------------------------


@covers("floater")
def test_rk4_matches_matrix_exponential_with_fourth_order_convergence() -> None:
    a = torch.randn(6, 6, dtype=torch.float64) * 0.5
    p0 = torch.randn(6, dtype=torch.float64)
    times = torch.arange(40, dtype=torch.float64) * 0.1
    exact = torch.stack([torch.linalg.matrix_exp(t * a) @ p0 for t in times])
    errors = []
    for steps in (1, 2, 4):
        got = rk4_trajectory(lambda p, t: a @ p, p0, 40, 0.1, steps)
        errors.append(float((got - exact).abs().max()))
    assert errors[2] < 1e-7
    assert 10 < errors[0] / errors[1] < 24
    assert 10 < errors[1] / errors[2] < 24


@covers("floater")
def test_rk4_recovers_the_sinusoidal_table_as_a_particular_solution() -> None:
    """With dp/dt = Ω p (2x2 rotation generators, frequencies ω_i) and p(0) = [0, 1, 0, 1, ...], p(t) is the
    interleaved sinusoidal table (Su Jianlin 2021, https://kexue.fm/archives/8130, section 递归式, on FLOATER)."""
    dim, count = 16, 64
    omega = torch.tensor([1 / 10000.0 ** (2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    generator = torch.zeros(dim, dim, dtype=torch.float64)
    generator[0::2, 1::2] = torch.diag(omega)  # d sin/dt = ω cos
    generator[1::2, 0::2] = -torch.diag(omega)  # d cos/dt = -ω sin
    p0 = torch.tensor([0.0, 1.0] * (dim // 2), dtype=torch.float64)
    got = rk4_trajectory(lambda p, t: generator @ p, p0, count, 1.0, 32)
    expected = sinusoidal_table(count, dim, "interleaved", dtype=torch.float64)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=0)
    assert not torch.allclose(got, sinusoidal_table(count, dim, "concat", dtype=torch.float64), atol=1e-2)


def _time_only_weights(scheme: Floater) -> dict[str, torch.Tensor]:
    """Weights making h(p, t) = W2 tanh(a t) + b2, whose solution is p0 + W2 log(cosh(a t)) / a + b2 t."""
    state = {k: v.clone() for k, v in scheme.state_dict().items()}
    width = state["dynamics.inner.weight"].shape[0]
    state["dynamics.inner.weight"].zero_()
    state["dynamics.inner.weight"][:, -1] = torch.linspace(0.3, 1.5, width)
    state["dynamics.inner.bias"].zero_()
    state["dynamics.outer.weight"].normal_(0.0, 0.3)
    state["dynamics.outer.bias"].normal_(0.0, 0.3)
    return state


@covers("floater")
def test_floater_table_equals_closed_form_solution_after_load_state_dict() -> None:
    scheme = build_scheme("floater", SMALL, {"delta_t": 0.1, "steps_per_position": 2, "width": 12}).eval()
    before = _encoding(scheme, torch.arange(P).unsqueeze(0))[0]
    state = _time_only_weights(scheme)
    scheme.load_state_dict(state)
    a = state["dynamics.inner.weight"][:, -1].double()
    w2, b2 = state["dynamics.outer.weight"].double(), state["dynamics.outer.bias"].double()
    t = torch.arange(P, dtype=torch.float64).unsqueeze(1) * 0.1
    expected = state["initial"].double() + (torch.log(torch.cosh(a * t)) / a) @ w2.T + t * b2
    assert "table" not in state
    torch.testing.assert_close(scheme.table.double(), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(_encoding(scheme, torch.arange(P).unsqueeze(0))[0], expected, atol=1e-6, rtol=0)
    assert not torch.allclose(before, expected, atol=1e-2)


@covers("floater")
def test_floater_matches_a_naive_rk4_of_the_mlp() -> None:
    """The MLP takes [p; t] with t = k Δt, p(0) = initial: compared with a step-by-step loop written out here."""
    scheme = build_scheme("floater", SMALL, {"delta_t": 0.25, "steps_per_position": 3, "width": 10}).eval()
    inner, outer = scheme.dynamics.inner, scheme.dynamics.outer
    with torch.no_grad():
        outer.weight.normal_(0.0, 0.2)  # strong p-dependence; an in-place update the table must follow

        def h(p: torch.Tensor, t: float) -> torch.Tensor:
            z = torch.cat((p, torch.tensor([t], dtype=torch.float64)))
            return (
                outer.weight.double() @ torch.tanh(inner.weight.double() @ z + inner.bias.double())
                + outer.bias.double()
            )

        p, rows, step = scheme.initial.double(), [], 0.25 / 3
        for k in range(20):
            rows.append(p)
            for j in range(3):
                t = (3 * k + j) * step
                k1 = h(p, t)
                k2 = h(p + step / 2 * k1, t + step / 2)
                k3 = h(p + step / 2 * k2, t + step / 2)
                k4 = h(p + step * k3, t + step)
                p = p + step / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    scheme64 = build_scheme(
        "floater", SMALL, {"delta_t": 0.25, "steps_per_position": 3, "width": 10}, table_dtype=torch.float64
    )
    scheme64.load_state_dict(scheme.state_dict())
    expected = torch.stack(rows)
    positions = torch.arange(20).unsqueeze(0)
    torch.testing.assert_close(_encoding(scheme64.eval(), positions)[0], expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(_encoding(scheme, positions)[0], expected, atol=1e-6, rtol=1e-6)


@covers("floater")
def test_floater_table_follows_weight_changes() -> None:
    scheme = build_scheme("floater", SMALL).eval()
    other = build_scheme("floater", SMALL).eval()
    positions = torch.arange(30).unsqueeze(0)
    assert not torch.allclose(_encoding(scheme, positions), _encoding(other, positions))
    scheme.load_state_dict(other.state_dict())
    torch.testing.assert_close(_encoding(scheme, positions), _encoding(other, positions), atol=0, rtol=0)
    scheme.dynamics.outer.bias.data.add_(0.5)  # through .data: invisible to version tracking
    stale = _encoding(scheme, positions)
    torch.testing.assert_close(stale, _encoding(other, positions), atol=0, rtol=0)
    scheme.refresh_table()
    assert not torch.allclose(_encoding(scheme, positions), stale, atol=1e-3)


@covers("floater")
def test_floater_training_mode_is_differentiable_and_agrees_with_the_table() -> None:
    scheme = build_scheme("floater", SMALL).train()
    positions = _positions([0, 4, 9, 11])
    hidden = torch.randn(1, 4, E)
    out = scheme.embed(hidden, positions)
    out.pow(2).sum().backward()
    assert scheme.initial.grad is not None
    assert scheme.initial.grad.abs().sum() > 0
    assert scheme.dynamics.inner.weight.grad.abs().sum() > 0
    torch.testing.assert_close(out.detach(), scheme.eval().embed(hidden, positions), atol=0, rtol=0)


@covers("floater")
def test_floater_export_only_gathers_from_the_table() -> None:
    class EmbedOnly(torch.nn.Module):
        def __init__(self, scheme: Floater) -> None:
            super().__init__()
            self.scheme = scheme

        def forward(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
            return self.scheme.embed(hidden, position_ids)

    scheme = build_scheme("floater", AttentionConfig(hidden_size=8, num_heads=2, max_position_embeddings=16))
    hidden, positions = torch.randn(1, 5, 8), torch.arange(5).unsqueeze(0)
    program = torch.export.export(EmbedOnly(scheme.train()), (hidden, positions))
    ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert any("embedding" in op for op in ops)
    assert not any("tanh" in op or "linear" in op or "addmm" in op for op in ops), ops
    torch.testing.assert_close(program.module()(hidden, positions), hidden + F.embedding(positions, scheme.table))


@covers("floater")
def test_floater_rejects_bad_parameters_and_long_positions() -> None:
    for bad in ({"delta_t": 0.0}, {"delta_t": -0.1}, {"steps_per_position": 0}, {"width": 0}, {"solver": "euler"}):
        with pytest.raises(ConfigError):
            build_scheme("floater", SMALL, bad)
    with pytest.raises(ConfigError, match="delta_t"):
        rk4_trajectory(lambda p, t: p, torch.zeros(2), 3, 0.0)
    scheme = build_scheme("floater", SMALL, max_positions=12)
    with pytest.raises(PositionError, match="max_positions > 12") as info:
        scheme.embed(torch.zeros(1, 1, E), _positions([12]))
    assert "integrate a longer table" in str(info.value)
