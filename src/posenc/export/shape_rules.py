"""Shapes a graph serves beyond its dynamic dims: rules a fused kernel imposes on a call's (batch, seq, past).

A manifest's ``dynamic_dims`` bound each dimension alone. Some fused kernels also tie them together: ONNX Runtime's
contrib ``GroupQueryAttention`` over a cache it shares with its output (the in-place layout ``posenc optimize
--target ort-cuda`` gives an in-place block) refuses a call that brings several new tokens over a filled cache unless
the batch is one row ("batch_size must be 1 when sequence_length > 1 and past context is given",
``group_query_attention_helper.h``). The graph pass that emits such a kernel records the rule's name in the
optimized manifest (:attr:`posenc.export.manifest.OptimizedRecord.shape_rules`); validation reads it here, fits its
default shapes to it and refuses a requested shape outside it before running anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from posenc.errors import ConfigError, ModelFileError
from posenc.export.shapes import Shape


@dataclasses.dataclass(frozen=True)
class ShapeRule:
    """A constraint on one call's sizes.

    Attributes:
        name: the name the manifest records.
        constraint: the rule in words (said in every refusal).
        allows: whether a call of this shape is served.
        fit: the nearest shape that is served (used for default feeds).
    """

    name: str
    constraint: str
    allows: Callable[[Shape], bool]
    fit: Callable[[Shape], Shape]


CHUNK_OVER_CACHE_ONE_ROW = "chunk-over-cache-one-row"

RULES: dict[str, ShapeRule] = {
    rule.name: rule
    for rule in (
        ShapeRule(
            CHUNK_OVER_CACHE_ONE_ROW,
            "a call bringing S > 1 new tokens over a filled cache (P > 0) takes batch 1 (ONNX Runtime's "
            "GroupQueryAttention over the shared in-place cache); single tokens (S = 1) and first prompts (P = 0) "
            "take any batch",
            lambda s: s.seq == 1 or s.past == 0 or s.batch == 1,
            lambda s: dataclasses.replace(s, batch=1),
        ),
    )
}


def rules_of(manifest: Any) -> list[ShapeRule]:
    """The rules a model's graph imposes: those its ``optimized`` records (this one and every previous one) name.

    Raises:
        ModelFileError: a rule name this posenc does not know (a manifest from a newer posenc).
    """
    names: list[str] = []
    record = getattr(manifest, "optimized", None)
    while record is not None:
        names.extend(name for name in record.shape_rules if name not in names)
        record = record.previous
    unknown = [name for name in names if name not in RULES]
    if unknown:
        raise ModelFileError(
            f"the manifest names shape rules {unknown} this posenc does not know; validate it with the posenc that "
            f"optimized it, or optimize the export again."
        )
    return [RULES[name] for name in names]


def fit_shapes(manifest: Any, shapes: Sequence[Shape]) -> list[Shape]:
    """``shapes`` moved to the nearest shape each rule of the graph serves (duplicates dropped)."""
    fitted: list[Shape] = []
    rules = rules_of(manifest)
    for shape in shapes:
        for rule in rules:
            if not rule.allows(shape):
                shape = rule.fit(shape)
        if shape not in fitted:
            fitted.append(shape)
    return fitted


def check_shapes(manifest: Any, shapes: Sequence[Shape], where: str = "the model") -> None:
    """Refuse shapes a rule of the graph does not serve, naming the rule.

    Raises:
        ConfigError: the first shape outside a rule, the rule in words and a shape it serves.
    """
    for rule in rules_of(manifest):
        for shape in shapes:
            if not rule.allows(shape):
                served = rule.fit(shape)
                raise ConfigError(
                    f"{where} does not serve shape (B, S, P) = ({shape.batch}, {shape.seq}, {shape.past}): "
                    f"{rule.constraint} (its manifest's shape rule {rule.name!r}). Ask for "
                    f"({served.batch}, {served.seq}, {served.past}) instead, e.g. --shape "
                    f"{served.batch},{served.seq},{served.past}."
                )


__all__ = ["CHUNK_OVER_CACHE_ONE_ROW", "RULES", "ShapeRule", "check_shapes", "fit_shapes", "rules_of"]
