"""What a traced export records about the layer it traced (the manifest's ``trace`` record).

A traced graph is a checkpoint's own attention module exported as the model calls it (:mod:`posenc.trace.capture`);
this record says how to build and call that module again (the float64 reference of ``posenc validate``), and which
positional parts of the graph posenc replaced with its own tables and which it kept as traced, and why. JSON::

    "trace": {"model_type": "phi", "layer": 0, "layer_type": null, "config": {...},
              "attention": {"path": "layers.0.self_attn", "cls": "transformers.models.phi.modeling_phi.PhiAttention"},
              "rotary": {"path": "rotary_emb", "cls": "..."}, "call": {...}, "mask": {...},
              "angles": {"layout": "half", "width": 8}, "parts": [{"part": "rotary angles", "status": "replaced",
              "detail": "..."}]}
"""

from __future__ import annotations

import dataclasses
from typing import Any

from posenc.records import field

ARGUMENT_KINDS: tuple[str, ...] = (
    "hidden",  # the layer's input hidden states [B, S, E]
    "position_embeddings",  # what the model's rotary module returns for the positions (cos, sin)
    "mask",  # the attention mask (additive float, or boolean: True = may attend)
    "cache",  # the KV cache (a transformers Cache holding the past at this layer)
    "cache_position",  # past + arange(S) (the new tokens' slots)
    "position_ids",  # the new tokens' position ids [B, S]
    "sections",  # the position ids repeated over a leading axis [A, B, S] (M-RoPE's rows of text tokens)
    "constant",  # a plain value the model passes (use_cache=True, a layer type, None)
    "ones",  # an all-ones padding mask [B, S] (OPT's position module reads it only without position ids)
    "zeros",  # all-zero integer ids [B, S, ...] (token type ids, boxes an encoder's model makes when given none)
    "kv_sharing",  # keys and values shared between layers (Gemma 4's shared_kv_states): a fresh dict the layer writes
    "entries",  # a dict: the entries the attention reads, each of a kind above (ZAYA's masks per use)
    "stream",  # a second input [B, S, W] the model computes from the token ids (a graph input of its name)
    "segments",  # a segment id per position, split at one position (CPM-Ant's prompt | text: trace.inputs.SEGMENTS)
    "padding",  # an additive padding mask [B, S] hiding no token (zeros); the unit hides the padding to whole blocks
    "every_key",  # every key's index 0 .. P + S - 1 for each query [B, S, P + S] (a top-k that keeps every key)
    "derived",  # a tensor the model's own code computes from the sequence before the layers (TraceRecord.derived)
    "shape",  # the hidden states' leading shape (an argument of the code that computes a derived tensor)
    "length",  # the sequence length S (an argument of the code that computes a derived tensor)
    "device",  # the hidden states' device (an argument of the code that computes a derived tensor)
    "stem",  # one of the outputs of the layer's stem module, called on the layer's input (posenc.trace.stems)
    "boxes",  # the tokens' boxes [B, S, 4], the unit's input bbox (constants: "given", or the model's "points")
)
"""How the wrapper fills each argument of the traced module's call (and of its rotary module's call)."""

ROTARY_PART = "rotary angles"
"""The positional part a rotary layer's graph holds (``position_ids -> ... -> Cos / Sin``): posenc's tables replace
it, or it stays as traced."""
PART_STATUSES: tuple[str, ...] = ("replaced", "kept", "absent")
"""``replaced``: posenc's tables compute it now; ``kept``: the traced computation stays (``detail`` says why);
``absent``: the traced graph has no such part (a layer that ignores positions)."""


@dataclasses.dataclass(frozen=True)
class ModuleRef:
    """A module of the model: its dotted path in the base model and its class (``module.QualName``)."""

    path: str
    cls: str


@dataclasses.dataclass(frozen=True)
class CallRecipe:
    """How the model calls a module: each argument's kind (:data:`ARGUMENT_KINDS`) and the constants it passes.

    Attributes:
        positional: kinds of the positional arguments, in order.
        keywords: keyword -> kind.
        constants: keyword (or ``"#i"`` for positional ``i``) -> the plain value of ``constant`` arguments.
        item: for a module of position encodings, the entry of the tuple it returns that the attention reads
            (FastSpeech2-Conformer's ``pos_enc`` returns the scaled hidden states and the encodings); None where the
            attention reads its whole output.
    """

    positional: tuple[str, ...]
    keywords: dict[str, str]
    constants: dict[str, Any] = field(optional=True, default_factory=dict)
    item: int | None = field(optional=True, default=None)


@dataclasses.dataclass(frozen=True)
class MaskRecipe:
    """The mask the model gives the layer, as posenc rebuilds it from positions (checked equal at capture).

    Attributes:
        kind: ``additive`` (0 / the dtype's minimum), ``bool`` (True = may attend), ``keep`` (1 = may attend, 0 =
            hidden, in a number dtype: DeBERTa's) or ``none`` (no mask passed).
        causal: keys after the query are hidden.
        window: a sliding window of that many keys (``q - w < k``; ``|q - k| < w`` bidirectional), or None.
        chunk: attention by chunks of that many positions (:mod:`posenc.trace.masks`), or None.
        chunk_left: with chunks, the earlier chunks a query sees besides its own (``0 <= q // c - k // c <= L``;
            None: all of them).
        ahead: a bidirectional window that is not symmetric: keys ``q - window < k <= q + ahead`` (T5Gemma 2's
            encoder sees ``(w + 1) // 2`` keys up to its own position and ``w // 2`` after it); None: symmetric.
        joined: a second stream (keyword) whose keys follow the tokens' in the same softmax, every one visible to
            every query (T5Gemma 2's merged attention: its encoder states' columns after the decoder's mask); None.
    """

    kind: str
    causal: bool
    window: int | None = None
    chunk: int | None = field(optional=True, default=None)
    chunk_left: int | None = field(optional=True, default=None)
    ahead: int | None = field(optional=True, default=None)
    joined: str | None = field(optional=True, default=None)


@dataclasses.dataclass(frozen=True)
class AnglesRecord:
    """How the model's rotary output lays out posenc's ``cos``/``sin [B, S, r/2]`` (:mod:`posenc.trace.layouts`).

    Attributes:
        layout: ``half`` (``cat(c, c)``), ``interleaved`` (each value twice in a row) or ``narrow`` (``c`` itself).
        width: the last axis of the model's cos/sin.
    """

    layout: str
    width: int


@dataclasses.dataclass(frozen=True)
class DerivedRecipe:
    """How the unit computes an argument the model derives from the sequence before its layers
    (:mod:`posenc.trace.derived`: RoFormer's ``sinusoidal_pos``, MPNet's ``position_bias``).

    Attributes:
        source: the module whose code computes it (its path in the base model, ``""`` for the base model itself);
            None for a function of the model's modeling module.
        method: ``forward`` (a module call), the name of the source's method, or ``module:name`` of a function
            (Beam's ``compute_attention_scaling``).
        call: how the model calls it (kinds ``hidden``, ``shape``, ``length``, constants, ...).
        lead: leading unit axes the model puts before the output (RoFormer's ``[None, None]``).
        children: for a method, the source's submodules it reads (the rest of the source is left out of the unit);
            None for a module call (the whole module).
    """

    source: ModuleRef | None
    method: str
    call: CallRecipe
    lead: int = 0
    children: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class EmbeddingRecord:
    """The embedding step of a model whose positions enter at the embeddings: the first layer's unit is
    ``norms(hidden + position(position_ids))`` followed by the attention (GPT-2, GPT-Neo, OPT), or, where the model's
    embeddings module combines and normalises the embeddings itself (BERT-like encoders: token type, LayerNorm),
    ``norms(position(inputs_embeds=hidden, position_ids=...))``; ``hidden`` is the token embeddings.

    Attributes:
        position: the module that embeds the positions (a learned table), or the whole embeddings module;
            ``call``: how the unit calls it (``inputs_embeds`` filled with ``hidden`` for an embeddings module).
        norms: the layer's modules between the embedding step and the attention (its pre-attention norm), in order.
        tokens: for an embeddings module, its token table (read by the model from the token ids, not by the unit:
            left out of the unit and its weights), else None.
    """

    position: ModuleRef
    call: CallRecipe
    norms: tuple[ModuleRef, ...] = ()
    tokens: ModuleRef | None = field(optional=True, default=None)


@dataclasses.dataclass(frozen=True)
class BoxesRecord:
    """How the model takes its tokens' boxes, the unit's graph input ``bbox [B, S, 4]`` (:mod:`posenc.trace.boxes`).

    Attributes:
        dtype: ``int64`` (LayoutLM's 0 .. 1000 grid) or ``float32`` (normalised to 0 .. 1).
        top: the largest coordinate the model takes (1000, or fewer where its ``max_2d_position_embeddings`` table
            is shorter; 1.0 for normalised boxes).
        points: the corner indices of the model's own rearrangement of a box (BROS's eight coordinates), or empty.
        scale: what the model multiplies that rearrangement by (BROS's ``bbox_scale``).
    """

    dtype: str
    top: float
    points: tuple[int, ...] = ()
    scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class TracePart:
    """One positional part of the traced graph and what became of it (:data:`PART_STATUSES`)."""

    part: str
    status: str
    detail: str


@dataclasses.dataclass(frozen=True)
class TraceRecord:
    """The manifest's ``trace`` record (see the module docstring).

    Attributes:
        model_type: ``config.json``'s ``model_type``.
        layer: the traced layer.
        layer_type: its ``layer_types`` entry, or None.
        config: the transformers config as a dict (``to_dict()``), from which the module is built again.
        attention: the attention module of the layer.
        rotary: the module that computes the position embeddings the attention takes, or None.
        call: how the model calls the attention module.
        rotary_call: how the model calls the rotary module (None without one).
        mask: the mask the model gives the layer.
        angles: how the rotary output lays out posenc's cos/sin (None: not recognised, or no rotary module).
        embedding: the embedding step the unit starts with (GPT-2's ``wpe``), else None.
        cacheless: the attention is called without a KV cache (the unit has no past and no presents).
        tower: for a wrapper checkpoint, its text tower's base model (path in the wrapper, class): ``config`` and
            the module paths are then the tower's. None otherwise.
        parts: the positional parts of the graph: replaced, kept (why) or absent.
    """

    model_type: str
    layer: int
    layer_type: str | None
    config: dict[str, Any]
    attention: ModuleRef
    rotary: ModuleRef | None
    call: CallRecipe
    rotary_call: CallRecipe | None
    mask: MaskRecipe
    angles: AnglesRecord | None
    parts: tuple[TracePart, ...] = ()
    embedding: EmbeddingRecord | None = field(optional=True, default=None)
    """The embedding step the unit starts with (positions that enter at the embeddings), else None."""
    cacheless: bool = field(optional=True, default=False)
    """The model calls the attention without a KV cache (an encoder's, or a decoder run without one): the unit takes
    ``hidden`` and ``position_ids`` and returns ``out`` alone."""
    tower: ModuleRef | None = field(optional=True, default=None)
    """A wrapper's text tower (its base model's path in the wrapper and class) whose layer was traced, else None."""
    cache: str = field(optional=True, default="dynamic")
    """The cache the model calls the attention with: ``dynamic`` (``DynamicCache``) or ``encoder-decoder`` (an
    encoder-decoder's decoder: ``EncoderDecoderCache``, the past in its self-attention part)."""
    derived: dict[str, DerivedRecipe] = field(optional=True, default_factory=dict)
    """Arguments of kind ``derived`` (keyword, or ``"#i"``) -> how the unit computes them
    (:mod:`posenc.trace.derived`)."""
    rotary_rows: int | None = field(optional=True, default=None)
    """Where the rotary module sizes its output by the hidden states' length and the attention reads it at the
    position ids (CLVP's): the length the unit calls it with (the context's), else None."""
    stem: ModuleRef | None = field(optional=True, default=None)
    """The layer's module the unit calls on the layer's input before the attention, whose outputs are the
    attention's inputs (MobileBERT's ``bottleneck``: :mod:`posenc.trace.stems`), else None."""
    cache_layer: str | None = field(optional=True, default=None)
    """A ``linear`` cache's layer class in ``transformers.cache_utils`` (:data:`posenc.trace.caches.LINEAR_LAYERS`),
    else None."""
    states: dict[str, tuple[int, ...]] = field(optional=True, default_factory=dict)
    """The fixed-size states that cache layer holds beside keys and values: name (``conv_state_0``) -> shape after
    the batch axis; the graph's ``past_<name>`` / ``present_<name>`` (:mod:`posenc.trace.caches`)."""
    order: str = field(optional=True, default="batch-major")
    """The axis order the model hands its attention the hidden states in (:mod:`posenc.trace.orders`:
    ``batch-major`` [B, S, E], ``channels-first`` [B, E, S], ``time-major`` [S, B, E]); the unit transposes into it
    and back."""
    boxes: BoxesRecord | None = field(optional=True, default=None)
    """How the model takes its tokens' boxes, where the unit takes them as its input ``bbox`` (document models:
    :mod:`posenc.trace.boxes`), else None."""

    def replaced(self) -> bool:
        """Whether posenc's tables compute the graph's angles (its rotary part was replaced)."""
        return angles_replaced(self.parts)

    def summary(self) -> list[str]:
        """One line per part: ``replaced: rotary angles (...)`` / ``kept: ... (why)``."""
        return [f"{part.status}: {part.part} ({part.detail})" for part in self.parts]


def tower_note(model_type: str, tower: ModuleRef | None) -> str:
    """`` of the blip-2 model's text tower language_model.model (OPTModel)`` for a wrapper's traced tower, else ``""``
    (what report lines and reference descriptions append)."""
    if tower is None:
        return ""
    return f" of the {model_type} model's text tower {tower.path} ({tower.cls.rsplit('.', 1)[-1]})"


def angles_replaced(parts: tuple[TracePart, ...]) -> bool:
    """Whether ``parts`` say posenc's tables replaced the traced angles."""
    return any(part.part == ROTARY_PART and part.status == "replaced" for part in parts)


__all__ = [
    "ARGUMENT_KINDS",
    "PART_STATUSES",
    "ROTARY_PART",
    "AnglesRecord",
    "BoxesRecord",
    "CallRecipe",
    "DerivedRecipe",
    "EmbeddingRecord",
    "MaskRecipe",
    "ModuleRef",
    "TracePart",
    "TraceRecord",
    "angles_replaced",
    "tower_note",
]
