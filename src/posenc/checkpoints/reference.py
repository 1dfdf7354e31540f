"""The checkpoint's own transformers attention module, run the way its model runs it: the reference of real models.

A :class:`TransformersReference` wraps the transformers attention module of one layer (built from the checkpoint's
config, loaded with that layer's tensors, eager attention) and calls it with the same inputs as posenc's block:
``hidden [B, S, E]``, ``position_ids [B, S]``, ``past_key`` / ``past_value [B, Hkv, P, D]``, returning
``(out [B, S, E], present_key, present_value [B, Hkv, P + S, D])``. Cached keys sit at positions ``0 .. P - 1``
(transformers' ``cache_position``) and the new tokens at ``position_ids``; the additive mask follows that
(causal, sliding window) exactly as transformers' ``masking_utils`` defines it.

Angles (rotary families): ``"native"`` uses the model's own rotary module (float32 angles, as the model computes
them); ``"float64"`` feeds the same attention module cos/sin computed with float64 angles by posenc's scheme (whose
frequencies are tested against transformers' ``ROPE_INIT_FUNCTIONS``). transformers computes each angle as
``fp32(fp32(inv_freq) * position)``: its angle error grows like ``position * 2**-23`` rad (about 1.6e-2 rad at
position 131072), so far from the start only the float64 rendering can tell a correct deployment from a wrong one.

transformers is an optional dependency (``pip install 'posenc[hf]'``); without it these raise
:class:`~posenc.errors.BackendUnavailable`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from posenc.blocks import default_positions
from posenc.checkpoints.plan import LayerPlan
from posenc.errors import BackendUnavailable, ConfigError

ANGLES = ("native", "float64")
HFModule = Any
"""A transformers module (``LlamaAttention``, ``T5Attention``, ...): its attributes and call are the model's own,
outside posenc's types."""


def import_transformers() -> Any:
    """The transformers package, or :class:`BackendUnavailable` with the install command."""
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise BackendUnavailable(
            "loading and checking Hugging Face checkpoints needs transformers: pip install 'posenc[hf]' "
            "(or pip install transformers)."
        ) from None


def hf_class(path: str) -> Any:
    """A transformers class by dotted path, e.g. ``models.llama.modeling_llama.LlamaAttention``."""
    import_transformers()
    module_name, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(f"transformers.{module_name}"), name)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailable(
            f"this transformers version has no {path} ({exc}); posenc's checkpoint families are tested with "
            f"transformers 5.23: pip install 'transformers>=5.23'."
        ) from None


def hf_config(config: Mapping[str, Any] | Any) -> Any:
    """The transformers config object of a ``config.json`` dict (or the object itself), set to eager attention."""
    transformers = import_transformers()
    if isinstance(config, Mapping):
        model_type = config.get("model_type")
        try:
            config_class = transformers.CONFIG_MAPPING[model_type]
        except KeyError:
            raise ConfigError(
                f"transformers {transformers.__version__} does not know model_type {model_type!r}; upgrade "
                f"transformers or pass a checkpoint of a supported family."
            ) from None
        # As transformers reads a config.json (``_dict_from_json_file``): its own tags for the floats JSON lacks
        # (Falcon-H1's ``time_step_limit: [0.0, {"__float__": "Infinity"}]``) decoded before the strict fields see them.
        config = config_class.from_dict(config_class._decode_special_floats(dict(config)))
    config._attn_implementation = "eager"
    return config


def load_module(module: HFModule, tensors: Mapping[str, torch.Tensor], prefix: str, dtype: torch.dtype) -> HFModule:
    """Load ``tensors`` whose names start with ``prefix`` into ``module`` (strictly), cast to ``dtype``, eval mode.

    Raises:
        ConfigError: the checkpoint's tensors do not fit the module its config describes.
    """
    state = {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}
    expected = module.state_dict()
    state = {k: v for k, v in state.items() if k in expected}
    try:
        module.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise ConfigError(f"the checkpoint's tensors do not fit its transformers module: {exc}") from None
    missing = [k for k in expected if k not in state and k in dict(module.named_parameters())]
    if missing:
        raise ConfigError(f"the checkpoint lacks {sorted(missing)[:4]} for its transformers module under {prefix!r}.")
    return module.to(dtype).eval()


def attention_mask(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    causal: bool,
    window: int | None,
    dtype: torch.dtype,
    chunk: int | None = None,
) -> torch.Tensor:
    """Additive mask ``[B, 1, Sq, Sk]``: 0 where query i may see key j, the dtype's minimum elsewhere.

    Visible: ``k <= q`` when causal; and ``q - k < window`` (causal) or ``|q - k| < window`` (bidirectional)
    with a sliding window; and ``k // chunk == q // chunk`` with chunks — transformers' ``causal_mask_function``,
    ``sliding_window_overlay`` and ``chunked_overlay``.
    """
    q, k = q_pos.unsqueeze(-1), k_pos.unsqueeze(-2)
    visible = torch.ones(q.shape[0], q.shape[1], k.shape[2], dtype=torch.bool)
    if causal:
        visible &= k <= q
    if window is not None:
        visible &= ((q - k) < window) if causal else ((q - k).abs() < window)
    if chunk is not None:
        visible &= torch.div(k, chunk, rounding_mode="floor") == torch.div(q, chunk, rounding_mode="floor")
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    return mask.unsqueeze(1)


def token_positions(hidden: torch.Tensor, past: int) -> torch.Tensor:
    """``past + arange(S)`` per row ``[B, S]``: the new tokens' places in the sequence (transformers'
    ``cache_position``), which masks follow when the position ids are multi-axis (M-RoPE's ``[3, B, S]``)."""
    b, s = hidden.shape[0], hidden.shape[1]
    return (torch.arange(s) + past).unsqueeze(0).expand(b, s)


def key_positions(position_ids: torch.Tensor, past: int) -> torch.Tensor:
    """Positions of all keys ``[B, P + S]``: the cache at ``0 .. P - 1``, then the new tokens."""
    b = position_ids.shape[0]
    cached = torch.arange(past, dtype=position_ids.dtype).unsqueeze(0).expand(b, past)
    return torch.cat((cached, position_ids), dim=1)


def prefilled_cache(layer: int, past_key: torch.Tensor | None, past_value: torch.Tensor | None) -> Any:
    """A transformers ``DynamicCache`` whose layer ``layer`` holds the given past keys and values."""
    cache = import_transformers().DynamicCache()
    if past_key is not None and past_key.shape[2] > 0:
        cache.update(past_key, past_value, layer)
    return cache


def cached(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values layer ``layer`` of ``cache`` holds after a step."""
    entry = cache.layers[layer]
    return entry.keys, entry.values


def reference_name(dtype: torch.dtype, exact_angles: bool) -> str:
    """The short name of a transformers reference in report rows: ``hf-fp32``, ``hf-fp64, fp64 angles``, ..."""
    names = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}
    return f"hf-{names.get(dtype, str(dtype))}" + (", fp64 angles" if exact_angles else "")


class TransformersReference(nn.Module):
    """Base of the per-family references: one layer's transformers attention, called like posenc's block.

    Subclasses implement :meth:`step`. Attributes ``name`` (short, for report columns) and ``description``
    (what exactly runs) name the reference in every report row.

    Args:
        plan: the layer as posenc loads it (geometry, scheme, layer index).
        angles: ``"native"`` or ``"float64"`` (see the module docstring).
        dtype: dtype of the transformers module's weights and inputs.
    """

    module_name = "attention"

    def __init__(self, plan: LayerPlan, angles: str, dtype: torch.dtype) -> None:
        super().__init__()
        if angles not in ANGLES:
            raise ConfigError(f"angles must be one of {list(ANGLES)}, got {angles!r}.")
        self.plan = plan
        self.angles = angles
        self.dtype = dtype

    @property
    def name(self) -> str:
        return reference_name(self.dtype, exact_angles=self.angles != "native")

    @property
    def description(self) -> str:
        angles = "its own angles" if self.angles == "native" else "float64 angles"
        return f"transformers {self.module_name} (checkpoint weights, layer {self.plan.layer}, {self.dtype}, {angles})"

    def forward(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_key: torch.Tensor | None = None,
        past_value: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(out [B, S, E], present_key, present_value [B, Hkv, P + S, D])`` of the transformers module.

        ``position_ids`` default to ``P + arange(S)``, as the block's do.
        """
        if position_ids is None:
            past = 0 if past_key is None else past_key.shape[2]
            position_ids = default_positions(hidden.shape[0], hidden.shape[1], past)
        hidden = hidden.to(self.dtype)
        past_key = None if past_key is None else past_key.to(self.dtype)
        past_value = None if past_value is None else past_value.to(self.dtype)
        with torch.no_grad():
            return self.step(hidden, position_ids.to(torch.int64), past_key, past_value)

    def step(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        past_key: torch.Tensor | None,
        past_value: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError


Past = torch.Tensor | None
"""``past_key`` / ``past_value [B, Hkv, P, D]``, or None without a cache."""
Step = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``(out [B, S, E], present_key, present_value [B, Hkv, P + S, D])``."""


class ModuleReference(TransformersReference):
    """One transformers attention module, called with a cache prefilled with the past and an additive mask.

    :meth:`step` builds what most modules take — a ``DynamicCache`` holding the past at the plan's layer, the key
    positions ``[B, P + S]`` (cache at ``0 .. P - 1``, new tokens at ``position_ids``) and the additive mask
    ``[B, 1, S, P + S]`` (the plan's causality and sliding window) in the reference's dtype — hands them to
    :meth:`call` (how the family's model calls its module) and reads the presents back from the cache.

    ``cached_copies``: how many copies of each kv head the module's cache holds (Falcon's new decoder architecture
    caches every kv head once per query head of its group); the past is repeated into that layout and the presents
    are returned with one copy, ``[B, Hkv, P + S, D]``.
    """

    cached_copies = 1

    def __init__(self, attention: HFModule, plan: LayerPlan, angles: str, dtype: torch.dtype) -> None:
        super().__init__(plan, angles, dtype)
        self.attention = attention
        self.module_name = type(attention).__name__

    @classmethod
    def builder(cls, path: str) -> Callable[[Any, LayerPlan, Mapping[str, torch.Tensor], str, torch.dtype], Any]:
        """A family's ``reference`` function: transformers' attention class ``path`` (e.g.
        ``models.bloom.modeling_bloom.BloomAttention``) for the plan's layer, loaded with its tensors, in ``cls``."""

        def build(
            hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
        ) -> ModuleReference:
            attention = hf_class(path)(hf, layer_idx=plan.layer)
            return cls(load_module(attention, tensors, "", dtype), plan, angles, dtype)

        return build

    def step(self, hidden: torch.Tensor, position_ids: torch.Tensor, past_key: Past, past_value: Past) -> Step:
        copies = self.cached_copies
        past_key, past_value = (None if t is None else t.repeat_interleave(copies, 1) for t in (past_key, past_value))
        past = 0 if past_key is None else past_key.shape[2]
        order = position_ids if position_ids.dim() == 2 else token_positions(hidden, past)
        keys = key_positions(order, past)
        config = self.plan.config
        window, chunk = config.sliding_window, config.attention_chunk_size
        mask = attention_mask(order, keys, config.causal, window, self.dtype, chunk)
        cache = prefilled_cache(self.plan.layer, past_key, past_value)
        out = self.call(hidden, position_ids, keys, mask, cache)
        key, value = cached(cache, self.plan.layer)
        return out, key[:, ::copies], value[:, ::copies]

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """The module's output ``[B, S, E]`` for ``hidden`` at ``position_ids`` (``[B, S]``, or ``[A, B, S]`` for
        multi-axis schemes, whose mask and ``keys [B, P + S]`` follow token order); the module updates ``cache``."""
        raise NotImplementedError


__all__ = [
    "ANGLES",
    "ModuleReference",
    "Past",
    "Step",
    "TransformersReference",
    "attention_mask",
    "cached",
    "hf_class",
    "hf_config",
    "import_transformers",
    "key_positions",
    "load_module",
    "prefilled_cache",
    "token_positions",
]
