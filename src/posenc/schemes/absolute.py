"""Absolute schemes: token k carries a position vector p_k that is combined with its hidden state.

- ``learned``: ``x_k + P[k]``, P a trained table (BERT, GPT-2).
- ``sinusoidal``: ``x_k + PE[k]``, the fixed sin/cos table of Vaswani et al. (interleaved or concat layout).
- ``multiplicative``: ``x_k ⊙ p_k`` with a trained table p (Su Jianlin 2021, https://kexue.fm/archives/8130,
  section 相乘式).
- ``floater``: ``x_k + p(k·Δt)``, p the solution of a neural ODE ``dp/dt = h(p, t)`` (FLOATER).

All act at the embedding: ``embed(hidden [B, S, E], position_ids [B, S]) -> [B, S, E]``. The combination runs
in float32 (float64 for float64 hidden states) and returns the hidden states' dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posenc import functional
from posenc.citations import SU_2021_POSITION_ENCODINGS
from posenc.dtypes import compute_dtype
from posenc.errors import ConfigError
from posenc.schemes.base import BOTH_TABLE_MODES, Param, Placement, PositionalScheme, SchemeSpec, TableMode, is_tracing
from posenc.schemes.registry import register

__all__ = [
    "Floater",
    "FloaterDynamics",
    "LearnedAbsolute",
    "MultiplicativeAbsolute",
    "SinusoidalAbsolute",
    "rk4_trajectory",
]

_PRECOMPUTED = frozenset({TableMode.PRECOMPUTED})
_INIT_STD = 0.02
"""Standard deviation of freshly initialised learned tables (BERT's initializer range)."""

Velocity = Callable[[torch.Tensor, float], torch.Tensor]
"""An ODE right-hand side ``h(p [..., E], t) -> [..., E]``."""


class _Absolute(PositionalScheme):
    """Shared ``embed``: check the positions, gather the position rows, add them (or multiply by them)."""

    multiply = False

    def rows(self, position_ids: torch.Tensor) -> torch.Tensor:
        """Position vectors ``[B, S, E]`` of ``position_ids [B, S]``."""
        raise NotImplementedError

    def embed(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """``hidden [B, S, E]`` combined with the position vectors of ``position_ids [B, S]``."""
        self.check_positions(position_ids)
        compute = compute_dtype(hidden)
        x, p = hidden.to(compute), self.rows(position_ids).to(compute)
        return (x * p if self.multiply else x + p).to(hidden.dtype)


# --------------------------------------------------------------------------------------------------
# Learned tables: learned (x + P[k]) and multiplicative (x ⊙ P[k])
# --------------------------------------------------------------------------------------------------


def _normal_table(rows: int, dim: int, dtype: torch.dtype, mean: float) -> nn.Parameter:
    """A learned ``[rows, dim]`` table initialised ``N(mean, 0.02)``."""
    return nn.Parameter(nn.init.normal_(torch.empty(rows, dim, dtype=dtype), mean=mean, std=_INIT_STD))


class LearnedAbsolute(_Absolute):
    """Learned absolute embedding as BERT, RoBERTa, BART, GPT-2 and OPT add it to the token embeddings.

    ``out = LayerNorm((hidden + token_type) + weight[position + position_offset])`` with the pieces that are
    switched on, in transformers' order (``BertEmbeddings``: ``inputs_embeds + token_type_embeddings``, then
    ``+ position_embeddings``, then ``LayerNorm``; dropout off). Computed in float32 (float64 for float64).

    Parameters (state dict keys under the block's ``scheme.``):

    - ``weight [max_positions + position_offset, E]`` in ``table_dtype``, initialised N(0, 0.02): the position
      table (``embeddings.position_embeddings.weight``; BART's ``embed_positions.weight``). Position ids stay
      0-based: row ``p + position_offset`` serves position ``p`` (RoBERTa: offset ``padding_idx + 1``; BART,
      OPT: 2), so the table holds the checkpoint's rows unchanged;
    - ``token_type_embedding [E]`` with ``token_type``: the segment vector added to every token
      (``embeddings.token_type_embeddings.weight[0]`` for single-segment input);
    - ``embedding_norm.weight`` / ``embedding_norm.bias`` ``[E]`` with ``embedding_norm``: the LayerNorm after
      the sum (``embeddings.LayerNorm``; BART's ``layernorm_embedding``), epsilon ``norm_eps``.

    The rows were trained only up to ``max_positions``: there is no dynamic mode and no extrapolation.
    """

    def build(self) -> None:
        dim = self.config.hidden_size
        self.position_offset = int(self.params["position_offset"])
        self.weight = _normal_table(self.max_positions + self.position_offset, dim, self.table_dtype, 0.0)
        self.token_type_embedding = nn.Parameter(torch.randn(dim) * _INIT_STD) if self.params["token_type"] else None
        self.embedding_norm = nn.LayerNorm(dim, eps=self.params["norm_eps"]) if self.params["embedding_norm"] else None

    def rows(self, position_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(position_ids + self.position_offset if self.position_offset else position_ids, self.weight)

    def embed(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """``hidden [B, S, E]`` plus the token-type vector and position rows of ``position_ids [B, S]``, normed."""
        if self.token_type_embedding is None and self.embedding_norm is None:
            return super().embed(hidden, position_ids)
        self.check_positions(position_ids)
        compute = compute_dtype(hidden)
        x = hidden.to(compute)
        if self.token_type_embedding is not None:
            x = x + self.token_type_embedding.to(compute)
        x = x + self.rows(position_ids).to(compute)
        norm = self.embedding_norm
        if norm is not None:
            x = F.layer_norm(x, norm.normalized_shape, norm.weight.to(compute), norm.bias.to(compute), norm.eps)
        return x.to(hidden.dtype)

    def beyond_table_remedy(self, position: int) -> str:
        return (
            f"a learned table has no rows past its {self.max_positions} trained positions: keep inputs within "
            f"{self.max_positions} tokens (truncate or slide a window), or build with max_positions > {position} "
            f"and train the new rows before deploying."
        )


class MultiplicativeAbsolute(LearnedAbsolute):
    """Multiplicative absolute encoding ``hidden ⊙ weight[position]`` (element-wise).

    ``weight [max_positions, E]`` is learned and initialised ``1 + N(0, 0.02)``, so a fresh module starts
    close to the identity.
    """

    multiply = True

    def build(self) -> None:
        self.position_offset = 0
        self.weight = _normal_table(self.max_positions, self.config.hidden_size, self.table_dtype, 1.0)
        self.token_type_embedding = self.embedding_norm = None


# --------------------------------------------------------------------------------------------------
# Sinusoidal
# --------------------------------------------------------------------------------------------------

SINUSOIDAL_LAYOUTS = ("interleaved", "concat")


class SinusoidalAbsolute(_Absolute):
    """Vaswani et al.'s fixed sinusoidal encoding added to the hidden states.

    ``interleaved``: ``PE[t, 2i] = sin(t ω_i)``, ``PE[t, 2i+1] = cos(t ω_i)``; ``concat``:
    ``PE[t] = [sin(t ω), cos(t ω)]``; ``ω_i = base^(-2i/E)``. An odd E has one sine more than cosines:
    ``concat`` is then Marian's table (``MarianSinusoidalPositionalEmbedding``: ``(E + 1) / 2`` sines, then
    ``(E - 1) / 2`` cosines), ``interleaved`` XLM's (the last column a sine).

    ``precomputed``: the table ``[max_positions, E]`` from :func:`posenc.functional.sinusoidal_table`
    (float64 angles, stored in ``table_dtype``). ``dynamic``: angles computed from the positions with
    float32-exact range reduction (:func:`posenc.functional.exact_angles`), or in float64 when
    ``table_dtype`` is float64; no table limit, accurate to ~1e-6 rad below position 2**24.
    """

    # Buffers registered by register_table (which ones depends on the table mode): typed for the checker.
    table: torch.Tensor
    inv_freq: torch.Tensor
    turns: torch.Tensor

    def build(self) -> None:
        self.layout = self.params["layout"]
        dim, base = self.config.hidden_size, self.params["base"]
        if self.table_mode is TableMode.PRECOMPUTED:
            self.register_table(
                "table", functional.sinusoidal_table(self.max_positions, dim, self.layout, base, self.table_dtype)
            )
        elif self.table_dtype == torch.float64:
            self.register_table("inv_freq", functional.sinusoidal_inv_freq(dim, base))
        else:
            self.register_table("turns", functional.split_turns(functional.sinusoidal_inv_freq(dim, base)))

    def rows(self, position_ids: torch.Tensor) -> torch.Tensor:
        if self.table_mode is TableMode.PRECOMPUTED:
            return F.embedding(position_ids, self.table)
        if self.table_dtype == torch.float64:
            angles = position_ids.to(torch.float64).unsqueeze(-1) * self.inv_freq
        else:
            angles = functional.exact_angles(position_ids, self.turns)
        return functional.sinusoidal_from_angles(angles, self.layout, self.config.hidden_size).to(self.table_dtype)


# --------------------------------------------------------------------------------------------------
# FLOATER
# --------------------------------------------------------------------------------------------------


def rk4_trajectory(
    velocity: Velocity,
    initial: torch.Tensor,
    num_points: int,
    delta_t: float,
    steps_per_point: int = 1,
) -> torch.Tensor:
    """Solve ``dp/dt = velocity(p, t)``, ``p(0) = initial`` with the classic fixed-step Runge-Kutta method.

    Each interval ``[kΔt, (k+1)Δt]`` is crossed in ``steps_per_point`` RK4 steps of size
    ``Δt / steps_per_point`` (global error O(step⁴)). The times handed to ``velocity`` are computed from
    integer step counts, so long trajectories do not accumulate rounding in t. Differentiable.

    Args:
        velocity: right-hand side ``h(p [..., E], t: float) -> [..., E]``.
        initial: ``p(0)``, ``[..., E]``; its dtype is the arithmetic dtype.
        num_points: number of points returned (``p(0)`` included).
        delta_t: time between consecutive points.
        steps_per_point: RK4 steps per interval.

    Returns:
        ``[num_points, ..., E]``: ``p(k·Δt)`` for ``k = 0 .. num_points - 1``.
    """
    if num_points < 1 or steps_per_point < 1 or not delta_t > 0:
        raise ConfigError(
            f"rk4_trajectory needs num_points >= 1, steps_per_point >= 1 and delta_t > 0, got {num_points}, "
            f"{steps_per_point}, {delta_t}."
        )
    step = delta_t / steps_per_point
    p = initial
    points = [p]
    for n in range((num_points - 1) * steps_per_point):
        t = n * step
        k1 = velocity(p, t)
        k2 = velocity(p + (step / 2) * k1, t + step / 2)
        k3 = velocity(p + (step / 2) * k2, t + step / 2)
        k4 = velocity(p + step * k3, t + step)
        p = p + (step / 6) * (k1 + 2 * k2 + 2 * k3 + k4)
        if (n + 1) % steps_per_point == 0:
            points.append(p)
    return torch.stack(points)


class FloaterDynamics(nn.Module):
    """The FLOATER vector field ``h(p, t) = W2 tanh(W1 [p; t] + b1) + b2``.

    ``inner``: ``Linear(E + 1 -> width)`` (the last input column multiplies t); ``outer``:
    ``Linear(width -> E)``, initialised N(0, 0.02) with zero bias so a fresh encoding drifts slowly.
    """

    def __init__(self, dim: int, width: int) -> None:
        super().__init__()
        self.inner = nn.Linear(dim + 1, width)
        self.outer = nn.Linear(width, dim)
        nn.init.normal_(self.outer.weight, std=_INIT_STD)
        nn.init.zeros_(self.outer.bias)

    def velocity(self, dtype: torch.dtype = torch.float64) -> Velocity:
        """``h`` as a function of ``(p [..., E], t)`` evaluated in ``dtype`` (weights cast once, differentiably)."""
        w1, b1 = self.inner.weight.to(dtype), self.inner.bias.to(dtype)
        w_p, w_t = w1[:, :-1], w1[:, -1]
        w2, b2 = self.outer.weight.to(dtype), self.outer.bias.to(dtype)

        def h(p: torch.Tensor, t: float) -> torch.Tensor:
            return F.linear(torch.tanh(F.linear(p, w_p, b1 + t * w_t)), w2, b2)

        return h

    def forward(self, p: torch.Tensor, t: float) -> torch.Tensor:
        """``h(p [..., E], t) -> [..., E]`` in ``p``'s dtype."""
        return self.velocity(p.dtype)(p, t)


def _refresh_after_load(module: nn.Module, incompatible_keys: Any) -> None:
    module.refresh_table()  # type: ignore[operator]  # the hook is registered on Floater only


class Floater(_Absolute):
    """FLOATER: position vectors from a neural ODE, ``x_k + p(k·Δt)`` with ``dp/dt = h(p, t)``.

    Parameters: ``initial`` = p(0) ``[E]`` (learned, N(0, 0.02)) and ``dynamics`` (:class:`FloaterDynamics`).
    The ODE is integrated with fixed-step RK4 (:func:`rk4_trajectory`), always in float64, and the table is
    stored in ``table_dtype``.

    The table follows the weights:

    - ``table [max_positions, E]`` is a non-persistent buffer (not in the state dict; it is derived),
      integrated in ``build``, after every ``load_state_dict`` and by :meth:`refresh_table`;
    - eager calls in training mode with autograd on (``module.train()``, grad mode, weights that require
      grad) integrate afresh up to the largest position of the call, so gradients reach p(0) and h; this
      costs ``4 * steps_per_position`` MLP evaluations per position, every call;
    - other eager calls (``.eval()``, ``torch.no_grad``, frozen weights) gather from the buffer,
      re-integrating first if a weight changed since (in-place update, ``.half()``, device move);
    - while exporting or compiling the forward only gathers from the buffer (a ``Gather`` of a
      ``[max_positions, E]`` initializer in ONNX): call :meth:`refresh_table` before exporting if you
      changed weights in a way the checks above cannot see.

    Building the table costs ``4 * steps_per_position * max_positions`` sequential MLP evaluations
    (~0.6 s for 4096 rows, E = 1024, width 64 on one CPU core). Freshly initialised weights make p drift
    roughly linearly in t once tanh saturates, so random-init tables grow with their length; trained
    weights define the real encoding.
    """

    def build(self) -> None:
        dim = self.config.hidden_size
        self.delta_t = float(self.params["delta_t"])
        self.steps_per_position = int(self.params["steps_per_position"])
        self.initial = nn.Parameter(torch.randn(dim) * _INIT_STD)
        self.dynamics = FloaterDynamics(dim, int(self.params["width"]))
        self.register_table("table", torch.empty(0, dim, dtype=self.table_dtype), persistent=False)
        self._fingerprint: tuple[Any, ...] = ()
        self.register_load_state_dict_post_hook(_refresh_after_load)
        self.refresh_table()

    def trajectory(self, num_positions: int) -> torch.Tensor:
        """``p(k·Δt)`` for ``k < num_positions``: float64 ``[num_positions, E]``, differentiable."""
        initial = self.initial.to(torch.float64)
        velocity = self.dynamics.velocity(torch.float64)
        return rk4_trajectory(velocity, initial, num_positions, self.delta_t, self.steps_per_position)

    @torch.no_grad()
    def refresh_table(self) -> None:
        """Re-integrate the table from the current weights (call after changing them by other means)."""
        self.table = self.trajectory(self.max_positions).to(self.table_dtype)
        self._fingerprint = self._weights_fingerprint()

    def _weights_fingerprint(self) -> tuple[Any, ...]:
        return tuple((p._version, p.data_ptr(), p.dtype, p.device) for p in self.parameters())

    def rows(self, position_ids: torch.Tensor) -> torch.Tensor:
        if is_tracing():
            return F.embedding(position_ids, self.table)
        if self.training and torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            count = int(position_ids.max()) + 1 if position_ids.numel() else 1
            return F.embedding(position_ids, self.trajectory(count).to(self.table_dtype))
        if self._fingerprint != self._weights_fingerprint():
            self.refresh_table()
        return F.embedding(position_ids, self.table)

    def beyond_table_remedy(self, position: int) -> str:
        return (
            f"the ODE extends to any length: build with max_positions > {position} to integrate a longer table "
            f"(positions past the training length are extrapolated by the learned dynamics)."
        )


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

_BERT = "Devlin et al., BERT: Pre-training of Deep Bidirectional Transformers, NAACL 2019 (arXiv:1810.04805)"
_VASWANI = "Vaswani et al., Attention Is All You Need, NeurIPS 2017 (arXiv:1706.03762), §3.5"

LearnedAbsolute.spec = SchemeSpec(
    name="learned",
    title="Learned absolute position embedding",
    family="absolute",
    placement=Placement.EMBEDDING,
    params=(
        Param(
            "position_offset",
            "int",
            0,
            "table row of position p is p + offset (RoBERTa: padding_idx + 1; BART, OPT: 2); the table has "
            "max_positions + offset rows",
            minimum=0,
        ),
        Param("token_type", "bool", False, "add a learned token-type vector (BERT/RoBERTa token_type_embeddings[0])"),
        Param(
            "embedding_norm",
            "bool",
            False,
            "LayerNorm after adding the rows (BERT/RoBERTa embeddings.LayerNorm, BART layernorm_embedding)",
        ),
        Param(
            "norm_eps", "float", 1e-12, "epsilon of that LayerNorm (layer_norm_eps)", minimum=0, exclusive_minimum=True
        ),
    ),
    table_modes=_PRECOMPUTED,
    citation=f"{_BERT}; Gehring et al., Convolutional Sequence to Sequence Learning, ICML 2017",
    summary="A trained [max_positions, hidden] table added to the hidden states (BERT, RoBERTa, BART, GPT-2, OPT).",
    cases={
        "default": {},
        "bert": {"token_type": True, "embedding_norm": True},
        "roberta_offset": {"position_offset": 2},
    },
    verified_against="transformers BertEmbeddings, RobertaEmbeddings, BartLearnedPositionalEmbedding + "
    "layernorm_embedding (copied weights)",
)
MultiplicativeAbsolute.spec = SchemeSpec(
    name="multiplicative",
    title="Multiplicative absolute position embedding (x ⊙ p)",
    family="absolute",
    placement=Placement.EMBEDDING,
    params=(),
    table_modes=_PRECOMPUTED,
    citation=f"{SU_2021_POSITION_ENCODINGS}, section 相乘式 (multiplicative)",
    summary="A trained table multiplied element-wise into the hidden states, initialised near 1.",
    verified_against="element-wise product with the gathered rows",
)
SinusoidalAbsolute.spec = SchemeSpec(
    name="sinusoidal",
    title="Sinusoidal absolute position encoding",
    family="absolute",
    placement=Placement.EMBEDDING,
    params=(
        Param(
            "layout",
            "str",
            "interleaved",
            "interleaved = sin at 2i, cos at 2i+1 (Vaswani); concat = [sin(all), cos(all)] (tensor2tensor)",
            choices=SINUSOIDAL_LAYOUTS,
        ),
        Param("base", "float", 10000.0, "frequencies base^(-2i/hidden)", minimum=0, exclusive_minimum=True),
    ),
    table_modes=BOTH_TABLE_MODES,
    citation=_VASWANI,
    summary="The fixed sin/cos table added to the hidden states; PE(t+k) is a rotation of PE(t).",
    cases={"default": {}, "concat": {"layout": "concat"}},
    verified_against="naive double loop of the paper's formula; transformers' MarianSinusoidalPositionalEmbedding "
    "(concat) and XLM create_sinusoidal_embeddings (interleaved), even and odd widths; float64 angles",
)
Floater.spec = SchemeSpec(
    name="floater",
    title="FLOATER (position encoding from a neural ODE)",
    family="absolute",
    placement=Placement.EMBEDDING,
    params=(
        Param("delta_t", "float", 0.1, "ODE time between consecutive positions Δt", minimum=0, exclusive_minimum=True),
        Param("steps_per_position", "int", 1, "RK4 steps per interval Δt (accuracy vs. table build time)", minimum=1),
        Param("width", "int", 64, "hidden width of the MLP h(p, t)", minimum=1),
    ),
    table_modes=_PRECOMPUTED,
    citation=(
        "Liu, Yu, Dhillon, Hsieh, Learning to Encode Position for Transformer with Continuous Dynamical Model, "
        f"ICML 2020 (arXiv:2003.09229); {SU_2021_POSITION_ENCODINGS}, section 递归式 (recursive)"
    ),
    summary="p(k·Δt) from dp/dt = h(p, t), h a small MLP, integrated by fixed-step RK4 into a precomputed table.",
    cases={"default": {}, "fine_steps": {"delta_t": 0.25, "steps_per_position": 3, "width": 24}},
    verified_against="matrix exponential of linear dynamics; sinusoidal table as an exact solution; log-cosh solution",
)

for _cls in (LearnedAbsolute, MultiplicativeAbsolute, SinusoidalAbsolute, Floater):
    register(_cls.spec, _cls)
