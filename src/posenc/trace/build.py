"""From a capture to the traced unit: the layer's geometry, posenc's scheme for its angles, the wrapper module.

:func:`plan_trace` reads what the captured layer is — its geometry from the capture (E from the hidden states,
``Hkv`` and ``D`` from the cache the module filled), its positional scheme and parameters as
:func:`posenc.config.from_hf_config` imports the config — and checks, on probe positions up to
:data:`~posenc.trace.layouts.PROBE_LIMIT`, whether the model's rotary module computes posenc's cos/sin in one of the
:data:`~posenc.trace.layouts.LAYOUTS` (then posenc can replace them, float64-exact). :func:`traced_module` builds
the :class:`~posenc.trace.module.TracedAttention`; :func:`rebuild` builds it again from a manifest's
:class:`~posenc.trace.record.TraceRecord` (the float64 reference of ``posenc validate``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from posenc.checkpoints.reference import hf_config, import_transformers
from posenc.config import AttentionConfig, from_hf_config
from posenc.errors import ConfigError, ExportError, PosencError
from posenc.schemes import build_scheme, get_spec
from posenc.schemes.base import Placement, PositionalScheme, TableMode
from posenc.trace.capture import Captured
from posenc.trace.counts import part_config, part_view
from posenc.trace.derived import source_module
from posenc.trace.embedding import drop_token_table
from posenc.trace.layouts import match_layout, probe_positions
from posenc.trace.model import build_base_model, quiet_transformers
from posenc.trace.module import TracedAttention, scheme_cos_sin
from posenc.trace.record import AnglesRecord, DerivedRecipe, MaskRecipe, ModuleRef, TracePart, TraceRecord
from posenc.trace.stacks import stack_context, stack_of, stack_view

NOPE = "nope"


@dataclasses.dataclass
class TracePlan:
    """What the traced layer is (see the module docstring).

    Attributes:
        captured: the capture.
        config: the geometry the manifest records (hidden size, heads, kv heads, head dim, causality, window).
        scheme: posenc's scheme name for the layer's positions (``nope`` when it has none posenc can name).
        params: the scheme's parameters (the layout found at capture wins over the config's).
        angles: how the rotary module lays out posenc's cos/sin, or None when its angles are not posenc's.
        note: why the angles are not posenc's (empty when they are, or when there is no rotary module).
    """

    captured: Captured
    config: AttentionConfig
    scheme: str
    params: dict[str, Any]
    angles: AnglesRecord | None
    note: str = ""

    def exact_scheme(
        self,
        table_mode: TableMode | str | None = None,
        max_positions: int | None = None,
        table_dtype: torch.dtype = torch.float32,
    ) -> PositionalScheme:
        """posenc's scheme of the layer's angles (raises when they are not posenc's)."""
        if self.angles is None:
            raise ConfigError(f"the traced layer's angles are not posenc's ({self.note}); there is no exact scheme.")
        return build_scheme(self.scheme, self.config, self.params, table_mode, max_positions, table_dtype)


def geometry(captured: Captured, imported: AttentionConfig | None) -> AttentionConfig:
    """The traced layer's geometry: what the capture saw, the heads and context length from the config."""
    hf = part_config(captured.hf)  # BLT's local encoder: its own heads and context
    heads = int(getattr(hf, "num_attention_heads", 0) or (imported.num_heads if imported else captured.kv_heads))
    context = (
        stack_context(hf, stack_of(hf, captured.layer_type))
        or _positive(getattr(hf, "max_position_embeddings", None))  # XLNet's -1: "no sequence length limit"
        or (imported.max_position_embeddings if imported else 2048)
    )
    if heads % captured.kv_heads:
        heads = captured.kv_heads * max(1, heads // captured.kv_heads)
    return AttentionConfig(
        hidden_size=captured.hidden_size,
        num_heads=heads,
        num_kv_heads=captured.kv_heads,
        head_dim=captured.head_dim,
        causal=captured.mask.causal,
        max_position_embeddings=int(context),
        sliding_window=_window(captured.mask),
    )


def _positive(value: Any) -> int | None:
    """``value`` where it is a positive int, else None (a config's ``-1`` for a context without limit)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _window(mask: MaskRecipe) -> int | None:
    """The geometry's sliding window: the mask's, or where it is a band ahead of the query too, the symmetric
    window that holds the band (the exact band is the trace record's)."""
    if mask.window is None or mask.ahead is None:
        return mask.window
    return max(mask.window, mask.ahead + 1)


def _imported(captured: Captured) -> tuple[Any, str]:
    """``(HFImport or None, why not)`` of the config's positional scheme for the layer's type."""
    data = part_view(stack_view(captured.hf.to_dict(), stack_of(captured.hf, captured.layer_type)))
    rope = data.get("rope_parameters") or {}
    nested = any(isinstance(value, Mapping) for value in rope.values())
    try:
        return from_hf_config(data, captured.layer_type if nested else None), ""
    except ConfigError as exc:
        return None, str(exc)


def _rotary_values(captured: Captured, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The model's rotary output (cos, sin) ``[N, W]`` at ``positions [B, S]``, or None without one."""
    if captured.rotary is None or captured.rotary_call is None:
        return None
    dummy = TracedAttention(
        captured.attention, captured.rotary, captured.layer, captured.call, captured.rotary_call, captured.mask
    )
    hidden = torch.zeros(*positions.shape, captured.hidden_size)
    with torch.no_grad():
        out = dummy.position_embeddings(hidden, positions)
    if torch.is_tensor(out) or len(out) != 2 or not all(torch.is_tensor(t) and t.dim() == 3 for t in out):
        return None
    return out[0].reshape(-1, out[0].shape[-1]), out[1].reshape(-1, out[1].shape[-1])


RELATIVE_PART = "relative position encodings"
"""One tensor of position encodings a module of the model computes from the sequence length and the attention
reads (a conformer's Transformer-XL relative encodings ``[B, 2S - 1, E]``: Parakeet, Nemotron ASR), kept as traced."""


def relative_parts(captured: Captured) -> tuple[TracePart, ...]:
    """The manifest's part for relative position encodings the model's module computes (one tensor, not cos/sin),
    kept as traced; none otherwise."""
    if captured.rotary is None or captured.rotary_call is None or captured.rotary_ref is None:
        return ()
    dummy = TracedAttention(
        captured.attention, captured.rotary, captured.layer, captured.call, captured.rotary_call, captured.mask
    )
    with torch.no_grad():
        out = dummy.position_embeddings(torch.zeros(1, 4, captured.hidden_size), torch.arange(4).unsqueeze(0))
    if not torch.is_tensor(out):
        return ()
    if captured.rotary_by_length:
        detail = (f"{captured.rotary_ref.path} ({captured.rotary_ref.cls.rsplit('.', 1)[-1]}) computes angles of "
                  f"positions 0 .. S - 1 from the sequence length and the attention reads them at the position ids; "
                  f"the unit calls it on the context's length (the model passes position ids 0 .. S - 1 only), as "
                  f"the model computes them in float32; posenc has no scheme for them")  # fmt: skip
        return (TracePart(RELATIVE_PART, "kept", detail),)
    detail = (f"{captured.rotary_ref.path} ({captured.rotary_ref.cls.rsplit('.', 1)[-1]}) computes them from the "
              f"sequence length ({list(out.shape)} for 4 tokens), as the model computes them in float32; posenc "
              f"has no scheme for them")  # fmt: skip
    return (TracePart(RELATIVE_PART, "kept", detail),)


LEARNED = "learned"
"""posenc's scheme of learned absolute position embeddings (the embedding step of GPT-2, GPT-Neo, OPT)."""
SELF_CHECK = 1e-5
"""Largest difference (relative to the output's magnitude) between the wrapper and the model's own call of the
attention, on the capture's positions, that the capture accepts."""


def check_wrapper(plan: TracePlan) -> None:
    """The wrapper, fed the capture's probe, must compute what the model's own call of the attention computed.

    Raises:
        ExportError: it does not (an argument rebuilt wrongly); the message gives the difference.
    """
    hidden, positions, want = plan.captured.probe
    module = traced_module(plan)
    with torch.no_grad():
        got = module(hidden, positions, *plan.captured.streams.values())[0]
    scale = max(1.0, float(want.abs().max()))
    moved = float((got - want).abs().max()) / scale
    if not moved <= SELF_CHECK:
        raise ExportError(
            f"posenc's call of layer {plan.captured.layer}'s attention differs from the model's own by {moved:.2e} "
            f"on the capture's tokens; it rebuilds an argument differently, so this model cannot be traced yet."
        )


def check_offsets(plan: TracePlan) -> None:
    """An attention fed a tensor the model computes from the sequence's length (a stack tensor,
    :mod:`posenc.trace.derived`, or a module called on the hidden states alone, without position ids) must also run
    on position ids that do not start at 0, as the unit is fed them (``validate``'s far positions, the rewrite's
    probe positions).

    Raises:
        ExportError: it fails there (an attention that gathers, at the position ids, values computed for positions
            ``0 .. S - 1``, where the model only ever passes ``0 .. S - 1``, and the unit does not call their code on
            the context's length as it does CLVP's rotary module, ``rotary_by_length``), naming the code.
    """
    captured = plan.captured
    codes = [f"argument {key!r} of {made.recipe.method}" for key, made in captured.derived.items()
             if made.needs_length()]  # fmt: skip
    kinds = (*captured.rotary_call.positional, *captured.rotary_call.keywords.values()) if captured.rotary_call else ()
    if captured.rotary_ref is not None and kinds and not set(kinds) & {"position_ids", "cache_position", "sections"}:
        codes.append(f"the output of {captured.rotary_ref.path} ({captured.rotary_ref.cls.rsplit('.', 1)[-1]})")
    if not codes:
        return
    hidden, positions, _ = captured.probe
    tokens = int(positions.shape[-1])
    try:
        with torch.no_grad():
            traced_module(plan)(hidden, positions + tokens, *captured.streams.values())
    except (IndexError, RuntimeError) as exc:
        raise ExportError(
            f"the attention reads {codes[0]}, which the model computes from the sequence's length for positions "
            f"0 .. S - 1, at the position ids: it fails on positions {tokens} .. {2 * tokens - 1} of {tokens} tokens "
            f"({type(exc).__name__}: {str(exc)[:100]}); the model only ever passes position ids 0 .. S - 1, while "
            f"posenc's unit takes position ids of any start, so this attention cannot be traced."
        ) from None


def plan_trace(captured: Captured) -> TracePlan:
    """The :class:`TracePlan` of a capture (see the module docstring), its wrapper checked against the model's call
    (:func:`check_wrapper`) and, where it reads a tensor computed from the length, on other positions
    (:func:`check_offsets`)."""
    plan = _plan(captured)
    check_wrapper(plan)
    check_offsets(plan)
    return plan


def _plan(captured: Captured) -> TracePlan:
    imported, why = _imported(captured)
    config = geometry(captured, imported.config if imported is not None else None)
    if captured.embedding is not None:
        return TracePlan(captured, config, LEARNED, {}, None, "the model's learned position table (kept)")
    if imported is None or get_spec(imported.scheme).placement is not Placement.QK:
        scheme = imported.scheme if imported is not None else NOPE
        params = dict(imported.params) if imported is not None else {}
        note = why or f"the config's scheme {scheme!r} is not a rotation posenc replaces in a traced graph"
        return TracePlan(captured, config, scheme, params, None, note if captured.rotary is not None else "")
    scheme, params = text_positions(imported.scheme, dict(imported.params))
    positions = torch.from_numpy(probe_positions(2, 7, None))
    values = _rotary_values(captured, positions)
    if values is None:
        return TracePlan(captured, config, scheme, params, None, "the layer takes no (cos, sin) from a rotary module")
    layout: str | None = None
    for candidate in _rotary_widths(params, config, imported.config, int(values[0].shape[-1])):
        try:
            exact = build_scheme(scheme, config, candidate, _exact_mode(scheme), config.max_position_embeddings,
                                 torch.float64)  # fmt: skip
            cos, sin = (t.reshape(-1, t.shape[-1]).numpy() for t in scheme_cos_sin(exact, positions))
        except PosencError as exc:
            return TracePlan(captured, config, scheme, params, None, f"posenc cannot build {scheme!r} for it: {exc}")
        cos_found, sin_found = (match_layout(v.double().numpy(), cos, sin) for v in values)
        if cos_found is not None and sin_found is not None and (cos_found[0], sin_found[0]) == ("cos", "sin") \
                and cos_found[1] == sin_found[1]:  # fmt: skip
            layout, params = cos_found[1], candidate
            break
    if layout is None:
        return TracePlan(
            captured,
            config,
            scheme,
            params,
            None,
            f"the rotary module's cos/sin are not {scheme!r}'s (from the config's rope parameters) in any layout",
        )
    if layout == "interleaved":
        params["layout"] = "interleaved"  # the config does not say; the module's cos/sin do
    return TracePlan(captured, config, scheme, params, AnglesRecord(layout, int(values[0].shape[-1])))


PARTIAL = "partial_rotary_factor"


def _rotary_widths(
    params: dict[str, Any], cached: AttentionConfig, config: AttentionConfig, width: int
) -> list[dict[str, Any]]:
    """The scheme parameters to try against the rotary module: the config's; then, where the cache's key width
    ``D`` is not the config's ``head_dim`` (a multi-head latent attention's cache holds the latent, of
    ``kv_lora_rank`` features, :mod:`posenc.trace.caches`), a rotary width as a share of ``D``: the config's
    (``head_dim`` times its partial factor), or the rotary module's output width ``width`` (``cat(c, c)``) or twice
    it (``c`` alone), which is what the module computes its angles over. Which one is right, the match on probe
    positions decides."""
    candidates = [params]
    if config.head_dim == cached.head_dim:
        return candidates
    for rotary in (config.head_dim * float(params.get(PARTIAL, 1.0)), width, 2 * width):
        share = {**params, PARTIAL: rotary / cached.head_dim}
        if 0 < rotary <= cached.head_dim and share not in candidates:
            candidates.append(share)
    return candidates


SINGLE_AXIS = "rope"
"""The scheme a multi-axis rotary scheme is on text tokens (:func:`text_positions`)."""


def text_positions(scheme: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(scheme, params)`` of the layer's angles at the traced unit's position ids ``[B, S]``.

    A multi-axis scheme (``position_axes`` > 1: M-RoPE's temporal, height and width rows) gives text tokens the same
    id on every axis, where its slots read one position each: plain RoPE of the same frequencies. The unit serves
    text (its rotary module is called with the position ids repeated per axis, :mod:`posenc.trace.arguments`), so
    its angles are that RoPE, without the parameters that only choose an axis per slot (M-RoPE's sections). Whether
    the model's module computes exactly those angles is checked on probe positions, as for any traced layer.
    """
    spec = get_spec(scheme)
    if spec.position_axes == 1:
        return scheme, params
    own = set(spec.param_names()) - set(get_spec(SINGLE_AXIS).param_names())
    return SINGLE_AXIS, {key: value for key, value in params.items() if key not in own}


def _exact_mode(scheme: str) -> TableMode:
    modes = get_spec(scheme).table_modes
    return TableMode.DYNAMIC if TableMode.DYNAMIC in modes else TableMode.PRECOMPUTED


def traced_module(
    plan: TracePlan,
    *,
    angles: str = "native",
    table_mode: TableMode | str | None = None,
    max_positions: int | None = None,
    table_dtype: torch.dtype = torch.float32,
    position_limit: int | None = None,
) -> TracedAttention:
    """The layer's :class:`TracedAttention` (float32).

    Args:
        plan: the plan of the capture.
        angles: ``native`` (the model's rotary module) or ``exact`` (posenc's scheme, built with ``table_mode``,
            ``max_positions``, ``table_dtype``).
        position_limit: the bound an exported graph guards (default: the exact scheme's, else None).
    """
    captured = plan.captured
    exact = None
    if angles == "exact":
        exact = plan.exact_scheme(table_mode, max_positions, table_dtype)
        if position_limit is None:
            position_limit = exact.position_limit
    elif angles != "native":
        raise ConfigError(f"angles must be 'native' or 'exact', got {angles!r}.")
    step = captured.embedding
    return TracedAttention(
        captured.attention,
        captured.rotary,
        captured.layer,
        captured.call,
        captured.rotary_call,
        captured.mask,
        exact=exact,
        angles_layout=plan.angles if exact is not None else None,
        position_limit=position_limit,
        embedding=step.position if step is not None else None,
        embedding_call=step.record.call if step is not None else None,
        norms=step.norms if step is not None else None,
        embeddings_module=step is not None and step.record.tokens is not None,
        cacheless=captured.cacheless,
        cache_kind=captured.cache_kind,
        derived={key: (found.recipe, found.module) for key, found in captured.derived.items()},
        order=captured.order,
        stem=captured.stem,
        rotary_rows=_rotary_rows(plan),
        boxes=captured.boxes,
        cache_layer=captured.cache_layer,
        states=tuple(state.name for state in captured.states),
    ).eval()


def trace_record(plan: TracePlan, parts: tuple[TracePart, ...]) -> TraceRecord:
    """The manifest's record of a traced layer, with the fate of its positional parts."""
    captured = plan.captured
    return TraceRecord(
        model_type=captured.model_type,
        layer=captured.layer,
        layer_type=captured.layer_type,
        config=captured.hf.to_dict(),
        attention=captured.attention_ref,
        rotary=captured.rotary_ref,
        call=captured.call,
        rotary_call=captured.rotary_call,
        mask=captured.mask,
        angles=plan.angles,
        parts=parts,
        embedding=captured.embedding.record if captured.embedding is not None else None,
        cacheless=captured.cacheless,
        tower=captured.tower,
        cache=captured.cache_kind,
        derived={key: found.recipe for key, found in captured.derived.items()},
        order=captured.order,
        stem=captured.stem_ref,
        rotary_rows=_rotary_rows(plan),
        boxes=captured.boxes,
        cache_layer=captured.cache_layer,
        states={state.name: state.shape for state in captured.states},
    )


def tower_class(ref: ModuleRef) -> type:
    """The transformers model class a record's ``tower`` names (``transformers.models.opt.modeling_opt.OPTModel``);
    only transformers' own model classes are taken from a manifest.

    Raises:
        ConfigError: the name is not a transformers model class here.
    """
    import importlib

    transformers = import_transformers()
    module_name, _, name = ref.cls.rpartition(".")
    found: Any = None
    if module_name == "transformers" or module_name.startswith("transformers."):
        with contextlib.suppress(ImportError):
            found = getattr(importlib.import_module(module_name), name, None)
    if not (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)):
        raise ConfigError(
            f"the traced record names the text tower class {ref.cls!r}, which is not a model class of the installed "
            f"transformers {transformers.__version__}; export the layer again with this transformers."
        )
    return found


def rebuild(
    record: TraceRecord,
    exact: PositionalScheme | None,
    position_limit: int | None,
    dtype: torch.dtype = torch.float64,
) -> TracedAttention:
    """The :class:`TracedAttention` a manifest's record describes, without the layer's weights (load them from the
    weights file), in ``dtype``: with posenc's ``exact`` scheme when its angles replaced the model's."""
    with quiet_transformers():
        hf = hf_config(record.config)
        model = build_base_model(
            hf, record.layer + 1, tower_class(record.tower) if record.tower else None, stack_of(hf, record.layer_type)
        )
    attention = model.get_submodule(record.attention.path)
    rotary = model.get_submodule(record.rotary.path) if record.rotary is not None else None
    step = record.embedding
    if step is not None:
        drop_token_table(model.get_submodule(step.position.path), step)
    module = TracedAttention(
        attention,
        rotary,
        record.layer,
        record.call,
        record.rotary_call,
        record.mask,
        exact=exact if record.angles is not None else None,
        angles_layout=record.angles if exact is not None else None,
        position_limit=position_limit,
        embedding=model.get_submodule(step.position.path) if step is not None else None,
        embedding_call=step.call if step is not None else None,
        norms=[model.get_submodule(ref.path) for ref in step.norms] if step is not None else None,
        embeddings_module=step is not None and step.tokens is not None,
        cacheless=record.cacheless,
        cache_kind=record.cache,
        derived={key: (recipe, _derived_source(model, recipe)) for key, recipe in record.derived.items()},
        order=record.order,
        stem=model.get_submodule(record.stem.path) if record.stem is not None else None,
        rotary_rows=record.rotary_rows,
        boxes=record.boxes,
        cache_layer=record.cache_layer,
        states=tuple(record.states),
    )
    return module.to(dtype).eval()


def _rotary_rows(plan: TracePlan) -> int | None:
    """The length a rotary module that sizes its output by its input's is called with: the context's (every position
    the unit serves is then in its output); None for any other."""
    return plan.config.max_position_embeddings if plan.captured.rotary_by_length else None


def _derived_source(model: torch.nn.Module, recipe: DerivedRecipe) -> torch.nn.Module | None:
    """The module that computes a derived argument in the rebuilt base model (pruned as at capture); None for a
    function."""
    if recipe.source is None:
        return None
    owner = model.get_submodule(recipe.source.path) if recipe.source.path else model
    return source_module(owner, recipe.children)


__all__ = [
    "RELATIVE_PART",
    "TracePlan",
    "geometry",
    "plan_trace",
    "rebuild",
    "relative_parts",
    "text_positions",
    "trace_record",
    "traced_module",
]
