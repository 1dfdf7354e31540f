"""How a checkpoint's config counts its layers, and the config of the model a capture builds.

:func:`layer_count` reads the number of layers (a stack's own count, per-stage and per-block counts, several
attentions per layer entry: :data:`NESTED_ATTENTIONS`); :func:`reduced_config` cuts a config to layers ``0 .. N``
(per-layer lists, trailing counts, other stages at their minimum, a block's layers) with the attention
implementation that computes the model (:func:`attention_implementation`); :func:`layer_config` is the config one
layer is built from. Used by :mod:`posenc.trace.model`, which builds the model from it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

from posenc.errors import ConfigError
from posenc.trace.masks import with_sub_configs
from posenc.trace.stacks import cut_stack

TRAILING_COUNTS = ("num_kv_shared_layers",)
"""Config fields counting the model's *last* layers (Gemma 3n: the last ``num_kv_shared_layers`` reuse an earlier
layer's cache): cut with the layers so that each of layers ``0 .. N`` keeps its role."""
LAST_LAYER_DIFFERS = frozenset({"gpt_neox_japanese"})
"""Model types whose last layer is built unlike the others (GPT-NeoX-Japanese: only the last attention has its
``dense_bias``): the capture builds one layer past layer N where the checkpoint has one, so that layer N is built as
the checkpoint's layer N."""
TIED_KINDS: dict[str, str] = {
    # Zamba ties every hybrid layer's shared transformer to the first one's and its tie check refuses a model with
    # one hybrid layer (transformers 5.23: "an issue with your definition of `tie_weights_keys`").
    "zamba": "hybrid",
}
"""Model types that tie the modules of one layer kind (``layer_types`` entry) across layers and cannot be built with
a single layer of it: the capture builds through the second such layer."""
STACK_COUNTS: dict[str, str] = {
    # HRM runs two stacks of num_layers_per_stack layers (L_module, H_module) in cycles; num_hidden_layers counts
    # its cache slots (layers x cycles). Layer N is layer N of the first stack, called first at cycle offset 0.
    "hrm_text": "num_layers_per_stack",
    # LXMERT's language encoder (l_layers; its config's num_hidden_layers is a dict of the three stages' counts).
    "lxmert": "l_layers",
    # BLT's local encoder over the bytes (its own config's count): the text attention whose positions are the bytes'.
    "blt": "encoder_config.num_hidden_layers",
}
"""Model types whose layer list counts by another field than ``num_hidden_layers``: the field (dotted: in a
sub-config)."""


def part_view(data: dict[str, Any]) -> dict[str, Any]:
    """A config dict as the traced layer list's part sees it: where :data:`STACK_COUNTS` names a count in a
    sub-config (BLT's ``encoder_config``), that sub-config's fields over the top-level ones (its geometry and
    ``rope_parameters`` are the layer's); else ``data``."""
    field = STACK_COUNTS.get(str(data.get("model_type", "")), "")
    part = data.get(field.split(".")[0]) if "." in field else None
    return {**data, **part} if isinstance(part, dict) else data


def part_config(hf: Any) -> Any:
    """The config the traced layer list's part is built from: the sub-config :data:`STACK_COUNTS` names a count in
    (BLT's ``encoder_config``: its window, heads and context are the local encoder's), else ``hf``."""
    field = STACK_COUNTS.get(str(getattr(hf, "model_type", "")), "")
    return getattr(hf, field.split(".")[0]) if "." in field else hf


def _get(config: Any, field: str) -> Any:
    for name in field.split("."):
        config = getattr(config, name, None)
    return config


def _set(config: Any, field: str, value: Any) -> None:
    *path, name = field.split(".")
    for part in path:
        config = getattr(config, part)
    setattr(config, name, value)


OTHER_STAGES: dict[str, dict[str, int]] = {
    # LXMERT runs its language layers first, then the vision (r_layers) and cross-modality (x_layers) stages: the
    # capture stops at a language layer's attention, so the other stages are built at their minimum, no layers.
    "lxmert": {"r_layers": 0, "x_layers": 0},
    # Funnel's decoder (num_decoder_layers) runs after the encoder's blocks.
    "funnel": {"num_decoder_layers": 0},
}
"""Per-stage layer counts of the stages a capture never reaches (they run after the traced layer list): set to their
minimum in the capture's model (each stage's own field)."""
BLOCKS: dict[str, tuple[str, str]] = {
    # Funnel Transformer counts its layers per block (num_hidden_layers is their sum and cannot be set) and pools
    # the sequence between blocks: the first block's layers attend over the tokens themselves.
    "funnel": ("block_sizes", "block_repeats"),
}
"""Model types whose layers are counted per block (the fields of the block sizes and of their repeats): layers are
numbered across the blocks; the traced ones are the first block's, cut to that block alone."""


NOT_ONE_STACK: dict[str, str] = {
    # Perceiver IO (Jaegle et al., 2021, https://arxiv.org/abs/2107.14795).
    "perceiver": "Perceiver IO's self-attention layers attend over its learned latent array (no positions); the "
    "tokens and their learned position embeddings reach it only through a cross-attention from the latents, and "
    "posenc's unit is a self-attention over the tokens",
    # pi0 (Black et al., 2024, https://arxiv.org/abs/2410.24164).
    "pi0": "pi0 is two models: PaliGemma (vlm_config) fills a cache from an image and a prompt (one bidirectional "
    "prefix), a Gemma action expert (dit_config) attends over it and the actions; it runs on images, state and "
    "actions, and its text config is itself. Export a PaliGemma or Gemma checkpoint instead",
}
"""Model types whose attention is not in one layer list posenc can cut and capture on token ids: why, each said in
the refusal (:func:`layer_count`)."""


ATTENTION_IMPLEMENTATIONS: dict[str, str] = {
    # Nemotron ASR streaming's encoder attention reads its mask as boolean (masked_fill(mask.logical_not(), -inf)):
    # sdpa's mask is; eager's additive 0/min mask gets inverted by it (every visible score -inf, rows of NaN) in
    # transformers 5.23. sdpa, the implementation the model runs by default, is the one that computes the model.
    "nemotron_asr_streaming_encoder": "sdpa",
}
"""Config ``model_type`` (the model's, or a sub-config's) -> the attention implementation the capture builds it
with, where transformers' ``eager`` (the default here: plain tensor code) does not compute the model."""


def attention_implementation(hf: Any) -> str:
    """The attention implementation the capture builds ``hf``'s model with: ``eager``, or the entry of
    :data:`ATTENTION_IMPLEMENTATIONS` for its type or a sub-config's (``encoder_config``)."""
    found = (ATTENTION_IMPLEMENTATIONS.get(str(getattr(config, "model_type", ""))) for config in with_sub_configs(hf))
    return next((name for name in found if name is not None), "eager")


@dataclasses.dataclass(frozen=True)
class NestedAttentions:
    """Where a model type keeps several attentions in each entry of its layer list (one level down, in a
    ``ModuleList``), each an attention of its own in the model's numbering: posenc's layer ``K`` is attention
    ``K % per`` of entry ``K // per``.

    Attributes:
        path: the entry's child that lists them (the attentions themselves, or sublayers holding one).
        per: how many per entry: an int, or the config field that says.
        count: config fields whose product is the number of attentions (posenc's layer count).
        cut: whether the capture builds only the entries it needs (False: the model as configured, every entry).
        why: what the model does (the reason for the entry).
    """

    path: str
    per: int | str
    count: tuple[str, ...]
    cut: bool
    why: str

    def per_entry(self, hf: Any) -> int:
        return self.per if isinstance(self.per, int) else int(getattr(hf, self.per))


NESTED_ATTENTIONS: dict[str, NestedAttentions] = {
    "longcat_flash": NestedAttentions(
        "self_attn", 2, ("num_hidden_layers",), cut=True,
        why="each LongCat-Flash decoder layer calls two MLA attentions (self_attn[0], self_attn[1]), each after its "
        "own norm and with its own weights and cache slot (layer_idx 2N and 2N + 1); the config counts them as "
        "num_hidden_layers = 2 * num_layers",
    ),
    "albert": NestedAttentions(
        "albert_layers", "inner_group_num", ("num_hidden_groups", "inner_group_num"), cut=False,
        why="ALBERT shares its layers across depths: num_hidden_groups groups of inner_group_num layers "
        "(encoder.albert_layer_groups.G.albert_layers.J), group G run at every depth i with "
        "int(i * groups / num_hidden_layers) == G; its attentions are these G * inner_group_num shared modules, "
        "captured at their first depth",
    ),
}  # fmt: skip
"""Model types whose layer entries hold several attentions (:class:`NestedAttentions`)."""


def nested_attentions(hf: Any) -> NestedAttentions | None:
    """The :data:`NESTED_ATTENTIONS` entry of ``hf``'s model type, or None."""
    return NESTED_ATTENTIONS.get(str(getattr(hf, "model_type", "")))


def layer_count(hf: Any) -> int:
    """The number of layers of ``hf``'s layer list (:data:`STACK_COUNTS`, else ``num_hidden_layers`` / ``n_layer`` /
    ``num_layers``).

    Raises:
        ConfigError: a :data:`NOT_ONE_STACK` type (with its reason), or a config naming no count.
    """
    reason = NOT_ONE_STACK.get(str(getattr(hf, "model_type", "")))
    if reason is not None:
        raise ConfigError(f"{reason}.")
    nested = nested_attentions(hf)
    if nested is not None:
        return int(math.prod(int(getattr(hf, field)) for field in nested.count))
    field = STACK_COUNTS.get(str(getattr(hf, "model_type", "")))
    count = _get(hf, field) if field else None
    count = count or getattr(hf, "num_hidden_layers", None) or getattr(hf, "n_layer", None)
    count = count or getattr(hf, "num_layers", None)
    if not isinstance(count, int) or count < 1:
        raise ConfigError(
            f"the {hf.model_type} config names no layer count (num_hidden_layers); posenc traces decoder layers."
        )
    return count


def layer_config(hf: Any, layer: int) -> Any:
    """The config layer ``layer`` is built from: a heterogeneous config's per-layer view (EmbeddingGemma 2's and
    NeoMME's ``per_layer_config``, whose per-layer fields the global config refuses to give), the part's config
    (:func:`part_config`), else ``hf``."""
    if getattr(hf, "is_heterogeneous", False):
        return hf.per_layer_config[layer]
    return part_config(hf)


def built_layers(hf: Any, layers: int) -> int:
    """How many layers :func:`build_base_model` builds to reach layers ``0 .. layers - 1``: one more where the last
    layer differs (:data:`LAST_LAYER_DIFFERS`) and the checkpoint has one; through the second layer of a kind whose
    modules the model ties (:data:`TIED_KINDS`) where the first layers hold one."""
    if getattr(hf, "model_type", None) in LAST_LAYER_DIFFERS:
        return min(layers + 1, layer_count(hf))
    nested = nested_attentions(hf)
    if nested is not None and nested.cut:  # whole entries: attentions 0 .. layers - 1 end in entry ceil(layers/per)
        per = nested.per_entry(hf)
        return -(-layers // per) * per
    tied = TIED_KINDS.get(str(getattr(hf, "model_type", "")))
    kinds = list(getattr(hf, "layer_types", None) or []) if tied else []
    of_kind = [i for i, kind in enumerate(kinds) if kind == tied]
    if len(of_kind) > 1 and sum(i < layers for i in of_kind) == 1:
        return max(layers, of_kind[1] + 1)
    return layers


def reduced_config(hf: Any, layers: int, stack: str | None = None, *, lists: bool = True) -> Any:
    """A copy of ``hf`` with only the first ``layers`` layers (per-layer lists cut to match, unless ``lists`` is
    False), eager attention; of an encoder-decoder's ``stack``, the first ``layers`` of that stack
    (:func:`posenc.trace.stacks.cut_stack`).

    The capture runs layers ``0 .. N``; a model's later layers are never built.
    """
    reduced = copy.deepcopy(hf)
    nested = nested_attentions(hf)
    if stack is not None or (nested is not None and not nested.cut):  # shared layers (ALBERT's): built whole
        if stack is not None:
            cut_stack(reduced, stack, layers)
        reduced._attn_implementation = attention_implementation(hf)
        return reduced
    total = layer_count(hf)
    field = STACK_COUNTS.get(str(getattr(hf, "model_type", "")))
    for name, minimum in OTHER_STAGES.get(str(getattr(hf, "model_type", "")), {}).items():
        setattr(reduced, name, minimum)
    if str(getattr(hf, "model_type", "")) in BLOCKS:
        _first_block(reduced, layers)
        reduced._attn_implementation = attention_implementation(hf)
        return reduced
    if field and layers < total:  # the per-stack count alone: the cache keeps its slots for every cycle
        _set(reduced, field, layers)
    elif layers < total:
        names = nested.count if nested is not None else ("num_hidden_layers", "n_layer", "num_layers")
        for name in names:  # LongCat-Flash's num_hidden_layers sets num_layers (entries) to half of it
            if isinstance(getattr(reduced, name, None), int):
                try:
                    setattr(reduced, name, layers)
                except NotImplementedError as exc:  # a count computed from per-stage sizes (Funnel's block_sizes)
                    raise ConfigError(
                        f"the {hf.model_type} config computes {name} from per-stage sizes and cannot be cut to "
                        f"layers 0 .. {layers - 1} ({exc}); posenc does not trace models with per-stage layer lists."
                    ) from None
        for name in TRAILING_COUNTS:
            value = getattr(reduced, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(reduced, name, max(0, layers - (total - value)))
        for name, value in list(vars(reduced).items()):
            if lists and isinstance(value, list) and len(value) == total and not name.startswith("_"):
                setattr(reduced, name, value[:layers])
    reduced._attn_implementation = attention_implementation(hf)
    return reduced


def _first_block(config: Any, layers: int) -> None:
    """Cut a :data:`BLOCKS` config to its first block's first ``layers`` layers.

    Raises:
        ConfigError: layer ``layers - 1`` lies in a later block (after the sequence is pooled).
    """
    sizes_field, repeats_field = BLOCKS[config.model_type]
    sizes, repeats = list(getattr(config, sizes_field)), list(getattr(config, repeats_field))
    if layers > sizes[0]:
        block = next(i for i in range(len(sizes)) if sum(sizes[: i + 1]) >= layers)
        raise ConfigError(
            f"layer {layers - 1} of this {config.model_type} model is in block {block} ({sizes_field} {sizes}), "
            f"whose attention reads a pooled sequence; posenc traces the first block's layers 0 .. {sizes[0] - 1}, "
            f"which attend over the tokens themselves."
        )
    setattr(config, sizes_field, [layers])
    setattr(config, repeats_field, repeats[:1])


__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "BLOCKS",
    "LAST_LAYER_DIFFERS",
    "NESTED_ATTENTIONS",
    "NOT_ONE_STACK",
    "OTHER_STAGES",
    "STACK_COUNTS",
    "TIED_KINDS",
    "TRAILING_COUNTS",
    "NestedAttentions",
    "attention_implementation",
    "built_layers",
    "layer_config",
    "layer_count",
    "nested_attentions",
    "part_config",
    "part_view",
    "reduced_config",
]
