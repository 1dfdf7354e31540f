"""Masks by chunks of positions: the rule a traced unit rebuilds beside causal, bidirectional and sliding masks.

Cache-aware streaming conformers attend by **chunks**: the frames are cut into chunks of ``c`` positions, and a
query in chunk ``q // c`` sees every key of its own chunk (later frames of the chunk too: the lookahead) and of
the ``L`` chunks before it, ``0 <= q // c - k // c <= L`` (transformers' ``chunked_limited_mask_function`` of
Nemotron ASR streaming; the "chunked limited" mask of "Stateful Conformer with Cache-based Inference for Streaming
Automatic Speech Recognition", Noroozi et al., 2023, https://arxiv.org/abs/2312.17279). Llama 4's chunked attention
is the same rule with ``L = 0`` and causality (transformers' ``chunked_overlay``).

Neither ``c`` nor ``L`` shows on a short capture (a 16-frame capture holds two chunks: any ``L >= 1`` fits), so they
are read from the config (or a stack's sub-config) by the rules of :data:`CHUNK_RULES`, each keyed by the config
field that declares it; the capture runs long enough to see ``L + 2`` chunks (:func:`chunk_span`) and checks the
rebuilt mask equal to the model's (:func:`posenc.trace.calls._mask_recipe`), and the unit rebuilds it from positions
(:func:`visible`), so it follows the queries' and keys' positions at any length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from posenc.schemes.base import attention_mask
from posenc.trace.record import MaskRecipe


@dataclasses.dataclass(frozen=True)
class ChunkRule:
    """How a config declares attention by chunks.

    Attributes:
        chunk: ``c``, the positions per chunk, from the config.
        left: ``L``, the chunks before its own a query sees, from the config (None: every earlier chunk).
        why: where the rule comes from (the model's code).
    """

    chunk: Callable[[Any], int]
    left: Callable[[Any], int | None]
    why: str


def _lookahead_chunk(config: Any) -> int:
    return int(config.default_num_lookahead_tokens) + 1


CHUNK_RULES: dict[str, ChunkRule] = {
    "default_num_lookahead_tokens": ChunkRule(
        chunk=_lookahead_chunk,
        left=lambda config: (int(config.sliding_window) - 1) // _lookahead_chunk(config),
        why="Nemotron ASR streaming's encoder (chunked_limited_mask_function): chunks of lookahead + 1 frames, "
        "left context sliding_window - 1 frames in whole chunks; the forward's num_lookahead_tokens defaults to "
        "the config's default_num_lookahead_tokens, the call the unit rebuilds",
    ),
    "attention_chunk_size": ChunkRule(
        chunk=lambda config: int(config.attention_chunk_size),
        left=lambda config: 0,
        why="chunked attention (transformers' chunked_overlay, Llama 4's): a query sees its own chunk only",
    ),
}
"""Config field declaring a chunk rule -> the rule (see the module docstring)."""


def with_sub_configs(hf: Any) -> list[Any]:
    """``hf`` and its sub-configs (``encoder_config``: a stack's own config, as ASR models hold it)."""
    subs = [value for key, value in vars(hf).items() if key.endswith("_config") and hasattr(value, "model_type")]
    return [hf, *subs]


def _rules(hf: Any) -> Iterator[tuple[int, int | None]]:
    """``(c, L)`` of every chunk rule ``hf`` or one of its sub-configs declares."""
    for config in with_sub_configs(hf):
        for name, rule in CHUNK_RULES.items():
            value = getattr(config, name, None)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                continue
            try:
                chunk, left = rule.chunk(config), rule.left(config)
            except (AttributeError, TypeError, ValueError):  # a field the rule reads is unset
                continue
            if chunk > 0 and (left is None or left >= 0):
                yield chunk, left


def chunk_candidates(kind: str, hf: Any) -> Iterator[MaskRecipe]:
    """The chunked masks the config ``hf`` declares (:data:`CHUNK_RULES`), bidirectional and causal, for a mask of
    ``kind`` (``bool`` or ``additive``)."""
    for chunk, left in _rules(hf):
        for causal in (False, True):
            yield MaskRecipe(kind, causal=causal, chunk=chunk, chunk_left=left)


SPAN_LIMIT = 256
"""The most tokens a capture runs to see a chunk rule whole (a rule of larger chunks is checked on fewer)."""


def chunk_span(hf: Any) -> int:
    """Tokens a capture needs to tell a declared chunk rule apart from another: ``(L + 2) · c + 1`` (a query more than
    ``L`` chunks after some keys), within :data:`SPAN_LIMIT`; 0 without a rule."""
    spans = [(left + 2) * chunk + 1 for chunk, left in _rules(hf) if left is not None]
    return max([span for span in spans if span <= SPAN_LIMIT], default=0)


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, recipe: MaskRecipe) -> torch.Tensor | None:
    """Which keys each query sees under ``recipe``: boolean ``[B, 1, Sq, Sk]`` (True = may attend), or None for all.

    The causal and window terms are :func:`posenc.schemes.base.attention_mask`'s; a bidirectional window that is not
    symmetric (``recipe.ahead``: T5Gemma 2's encoder) is the band ``q - window < k <= q + ahead``; with chunks of ``c``
    positions also ``0 <= q // c - k // c <= L`` (``L`` = ``recipe.chunk_left``; no upper bound where it is None).
    """
    if recipe.ahead is not None and recipe.window is not None:
        offset = (k_pos.unsqueeze(1) - q_pos.unsqueeze(2)).unsqueeze(1)  # k - q, [B, 1, Sq, Sk]
        return (offset > -recipe.window) & (offset <= recipe.ahead)
    mask = attention_mask(q_pos, k_pos, recipe.causal, recipe.window)
    if recipe.chunk is None:
        return mask
    behind = (torch.div(q_pos, recipe.chunk, rounding_mode="floor").unsqueeze(2)
              - torch.div(k_pos, recipe.chunk, rounding_mode="floor").unsqueeze(1))  # fmt: skip
    seen = behind >= 0
    if recipe.chunk_left is not None:
        seen = seen & (behind <= recipe.chunk_left)
    seen = seen.unsqueeze(1)
    return seen if mask is None else mask & seen


__all__ = ["CHUNK_RULES", "SPAN_LIMIT", "ChunkRule", "chunk_candidates", "chunk_span", "visible", "with_sub_configs"]
