"""Tensor-wise rewrites of model code that reads the sequence length as a Python number, used while exporting only.

A derived argument (:mod:`posenc.trace.derived`) is computed by the model's own code. Where that code turns the length
into Python numbers (a ``list(range(seq_len))`` sliced and measured), torch.export specialises the length and a graph
would serve one length only. For such a method this module holds a rewrite with the same values computed from
tensors (``arange`` on the symbolic length), which :func:`rewritten` binds to the module for the duration of an export
(``torch.compiler.is_exporting()``): the graph holds the rewrite, while every eager call (the capture's check, the
references ``validate --against-hf`` compares the graph with) runs the model's own code. So the graph is held to the
model's code at every length ``validate`` feeds, and the rewrite is never its own reference.

:data:`REWRITES` maps ``module.QualName.method`` of a transformers class to the rewrite and what it covers.

Funnel-Transformer: "Funnel-Transformer: Filtering out Sequential Redundancy for Efficient Language Processing" (Dai,
Lai, Yang and Le, 2020, https://arxiv.org/abs/2006.03236); its relative-shift attention (appendix A.2.1) reads the
sinusoid of each relative distance.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from posenc.errors import ExportError


def funnel_position_embeds(structure: Any, seq_len: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """Funnel's ``FunnelAttentionStructure.get_position_embeds`` for the first block, from tensors.

    For ``attention_type="relative_shift"`` and one block (the traced layers are the first block's: the capture cuts
    the model to it), the model returns ``[[R, None]]``: ``R [2S, d_model]`` the sinusoid ``[sin(d·f), cos(d·f)]`` of
    the relative distances ``d = S, S - 1, .., 1 - S`` (its ``relative_pos(pos, 1)``, gathered from a table of
    ``-2S .. 2S - 1``), ``f = 1 / 10000^(i / (d_model / 2))``; the same float operations on the same values here. A
    factorized attention's code is tensor-wise already: it runs as the model's.

    Args:
        structure: the model's ``FunnelAttentionStructure`` (its ``config``, ``sin_dropout``, ``cos_dropout``).
        seq_len: the length ``S`` (a symbolic int under torch.export).

    Raises:
        ExportError: a config of more than one block (a pooled block's positions are not rewritten).
    """
    config = structure.config
    if config.attention_type != "relative_shift":
        return type(structure).get_position_embeds(structure, seq_len, dtype, device)
    if int(config.num_blocks) != 1:
        raise ExportError(
            f"posenc rewrites Funnel's relative positions for its first block only; this model has "
            f"{config.num_blocks} blocks (trace a layer of the first block, which the capture cuts the model to)."
        )
    d_model = config.d_model
    freq_seq = torch.arange(0, d_model // 2, 1.0, dtype=torch.int64, device=device).to(dtype)
    inv_freq = 1 / (10000 ** (freq_seq / (d_model // 2)))
    distance = torch.arange(seq_len, -seq_len, -1, dtype=torch.int64, device=device).to(dtype)  # S .. 1 - S
    sinusoid = distance[:, None] * inv_freq[None]
    sin_embed = structure.sin_dropout(torch.sin(sinusoid))
    cos_embed = structure.cos_dropout(torch.cos(sinusoid))
    return [[torch.cat([sin_embed, cos_embed], dim=-1), None]]


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """A tensor-wise rewrite of one method (``function(module, *args)``) and what it covers."""

    function: Callable[..., Any]
    covers: str


REWRITES: dict[str, Rewrite] = {
    "transformers.models.funnel.modeling_funnel.FunnelAttentionStructure.get_position_embeds": Rewrite(
        funnel_position_embeds,
        "Funnel's relative-shift position encodings of its first block (the model's list(range(seq_len)))",
    ),
}
"""``module.QualName.method`` -> its tensor-wise rewrite (see the module docstring)."""


def _class_path(klass: type) -> str:
    return f"{klass.__module__}.{klass.__qualname__}"


def rewrites_of(module: nn.Module | None) -> dict[str, Rewrite]:
    """The :data:`REWRITES` of ``module``'s class (or a base class): method name -> rewrite."""
    if module is None:
        return {}
    found: dict[str, Rewrite] = {}
    for klass in type(module).__mro__:
        for key, rewrite in REWRITES.items():
            owner, _, method = key.rpartition(".")
            if owner == _class_path(klass):
                found.setdefault(method, rewrite)
    return found


def covered(class_path: str) -> list[str]:
    """What the rewrites of the class at ``class_path`` cover (for the manifest's part), by its recorded path."""
    return [rewrite.covers for key, rewrite in REWRITES.items() if key.rpartition(".")[0] == class_path]


@contextlib.contextmanager
def rewritten(module: nn.Module | None) -> Iterator[None]:
    """While torch.export traces, ``module``'s methods with a rewrite run it instead (bound to the module); in any
    eager call, nothing changes."""
    found = rewrites_of(module) if torch.compiler.is_exporting() else {}
    if not found or module is None:
        yield
        return
    for method, rewrite in found.items():
        setattr(module, method, types.MethodType(rewrite.function, module))
    try:
        yield
    finally:
        for method in found:
            vars(module).pop(method, None)


__all__ = ["REWRITES", "Rewrite", "covered", "funnel_position_embeds", "rewrites_of", "rewritten"]
