"""Every attention layer of a checkpoint, and a user's selection of them (``posenc export --layers all|0-3|0,2,5``).

Read from ``config.json`` alone (no tensor is read): the layer count of each stack (``num_hidden_layers``; an
encoder-decoder's ``encoder``/``decoder`` stacks, each numbered from 0), and each layer's kind as its family plans it
(``sliding_attention`` / ``full_attention`` for Gemma 2 and 3, ``chunked_attention`` for Llama 4, ...). Layers that
are not softmax attention (Qwen3-Next's linear-attention layers) are listed with the reason posenc skips them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from posenc.checkpoints.load import _family_of
from posenc.checkpoints.reference import hf_config
from posenc.checkpoints.source import CheckpointSource
from posenc.errors import ConfigError, PosencError

STACKS = ("encoder", "decoder")
"""Layer types that are stacks of their own (each numbered from 0), not kinds of one stack's layers."""
COUNT_FIELDS = {
    "encoder": ("encoder_layers", "num_layers", "num_hidden_layers"),
    "decoder": ("decoder_layers", "num_decoder_layers", "num_hidden_layers"),
    None: ("num_hidden_layers",),
}
"""Config fields holding a stack's layer count, first found wins (BART: ``encoder_layers``; T5: ``num_layers``)."""


@dataclasses.dataclass(frozen=True)
class LayerEntry:
    """One layer of a checkpoint.

    Attributes:
        layer: its index within its stack.
        stack: ``encoder`` / ``decoder`` for encoder-decoder models, else None.
        kind: the layer's type as its family plans it (the stack, ``sliding_attention``, ...), or None.
        skipped: why posenc does not export it (not softmax attention), else empty.
    """

    layer: int
    stack: str | None
    kind: str | None
    skipped: str = ""

    @property
    def name(self) -> str:
        """The artifact's stem: ``layer3``, or ``decoder.layer3`` in an encoder-decoder model."""
        return f"{self.stack}.layer{self.layer}" if self.stack else f"layer{self.layer}"


def _count(text: Any, stack: str | None) -> int:
    for name in COUNT_FIELDS[stack]:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise ConfigError(f"the config has no layer count ({' / '.join(COUNT_FIELDS[stack])}); pass --layer N instead.")


def checkpoint_layers(model_or_folder: Any, layer_type: str | None = None) -> list[LayerEntry]:
    """Every layer of the checkpoint (of the stack ``layer_type`` names, where the model has stacks), in order.

    Raises:
        ConfigError: an unsupported model type, an unknown stack, a config without a layer count.
    """
    if isinstance(model_or_folder, (str, os.PathLike)):  # the config alone: the weights are read layer by layer
        path = Path(model_or_folder) / "config.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot read {path} ({exc}); give a checkpoint folder (config.json + weights)."
            ) from None
        model_type, hf = str(data.get("model_type") or ""), hf_config(data)
    else:
        with CheckpointSource.open(model_or_folder) as source:
            model_type = str(source.config.get("model_type") or "")
            hf = source.hf_model.config if source.hf_model is not None else hf_config(source.config)
    family, text = _family_of(model_type, hf)
    stacked = set(family.layer_types) == set(STACKS)
    if stacked:
        if layer_type is not None and layer_type not in STACKS:
            raise ConfigError(f"{model_type} has stacks {list(STACKS)}, not {layer_type!r}; pass one of them.")
        stacks: list[str | None] = [layer_type] if layer_type else list(STACKS)
    else:
        stacks = [None]
    entries = []
    for stack in stacks:
        for layer in range(_count(text, stack)):
            try:
                plan = family.geometry(text, layer, stack)
            except PosencError as exc:
                entries.append(LayerEntry(layer, stack, stack, skipped=str(exc)))
                continue
            if layer_type is not None and not stacked and plan.layer_type != layer_type:
                continue  # --layer-type KIND: the layers of that kind
            entries.append(LayerEntry(layer, stack, plan.layer_type))
    return entries


_PART = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_layers(spec: str) -> list[int] | None:
    """``all`` -> None (every layer); ``0-3`` -> [0, 1, 2, 3]; ``0,2,5`` -> [0, 2, 5]; parts combine (``0-2,7``).

    Raises:
        ConfigError: an empty selection, a malformed part, or a range that runs backwards.
    """
    if spec.strip().lower() == "all":
        return None
    chosen: list[int] = []
    for part in spec.split(","):
        match = _PART.match(part)
        if match is None:
            raise ConfigError(
                f"--layers {spec!r}: {part.strip()!r} is not a layer or range; write all, 0-3, 0,2,5 or 0-2,7."
            )
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if last < first:
            raise ConfigError(
                f"--layers {spec!r}: the range {first}-{last} is empty; write it low-high ({last}-{first})."
            )
        chosen.extend(i for i in range(first, last + 1) if i not in chosen)
    return chosen


def select_layers(entries: list[LayerEntry], spec: str) -> tuple[list[LayerEntry], list[LayerEntry]]:
    """``(to export, skipped)``: the entries ``spec`` (:func:`parse_layers`) names, per stack; ``all`` leaves out the
    layers posenc skips (returned second), a selection naming one is refused.

    Raises:
        ConfigError: a malformed selection, a layer out of range (the message gives the range), a skipped layer.
    """
    wanted = parse_layers(spec)
    if wanted is None:
        return [e for e in entries if not e.skipped], [e for e in entries if e.skipped]
    by_stack: dict[str | None, dict[int, LayerEntry]] = {}
    for entry in entries:
        by_stack.setdefault(entry.stack, {})[entry.layer] = entry
    chosen = []
    for stack, layers in by_stack.items():
        top = max(layers) if layers else -1
        where = f"the {stack} stack" if stack else "the checkpoint"
        for index in wanted:
            if index not in layers:
                raise ConfigError(
                    f"--layers {spec!r}: layer {index} is out of range: {where} has layers 0 .. {top} of this kind."
                    if index > top
                    else f"--layers {spec!r}: layer {index} is not of the --layer-type asked for."
                )
            entry = layers[index]
            if entry.skipped:
                raise ConfigError(f"--layers {spec!r}: {entry.skipped}")
            chosen.append(entry)
    return chosen, []


__all__ = ["LayerEntry", "checkpoint_layers", "parse_layers", "select_layers"]
