"""The capture's self-checks: the probe call, the attention's settings, its head geometry without a cache.

:func:`_probe` calls the attention (with the checkpoint's weights) exactly as the model called it, on random hidden
states and a fresh cache: the reference the traced unit must reproduce; it also refuses an attention that mixes no
positions there (:func:`_check_mixing`). :func:`_check_settings` refuses a model that
changed its attention's settings during the capture forward. Used by :mod:`posenc.trace.capture`.
"""

from __future__ import annotations

import inspect
from collections import UserDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from posenc.errors import ConfigError, ExportError
from posenc.trace.arguments import attention_output
from posenc.trace.calls import CAPTURE_TOKENS, Call
from posenc.trace.embedding import EmbeddingStep, _step_args
from posenc.trace.orders import BATCH_MAJOR, from_model, to_model
from posenc.trace.stems import Stem


def _probe(
    attention: nn.Module,
    target: Call,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    cache_class: type,
    step: EmbeddingStep | None,
    calls: Mapping[str, Call],
    layer: int,
    fresh_cache: Any,
    hidden_key: str | None = None,
    order: str = BATCH_MAJOR,
    stem: Stem | None = None,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention (with the checkpoint's weights) called exactly as the model called it, on random hidden states
    and a fresh cache (``fresh_cache()`` in place of any ``cache_class``): ``(hidden, position_ids, out)``; with an
    embedding step, ``hidden`` are random token embeddings that the model's own position embeddings (as computed in
    the capture call) and norms turn into the attention's input. ``hidden`` is the states the model passed (under
    ``hidden_key``, else first), in its axis ``order``; ``hidden`` and ``out`` of the probe are ``[B, S, E]``. With
    a ``stem`` (:mod:`posenc.trace.stems`), ``hidden`` is the layer's input and every argument that was one of the
    stem's outputs gets the stem's output on the probe's states. ``width``: the unit's input width, where not the
    attention's (token embeddings narrower than the layers)."""
    generator = torch.Generator().manual_seed(1)
    shape = from_model(hidden, order).shape
    fresh = torch.randn(*shape[:-1], width or shape[-1], generator=generator, dtype=torch.float32)
    inputs = fresh
    if step is not None:
        call = calls[step.record.position.path]
        with torch.no_grad():  # the position module with the checkpoint's table, called as in the capture
            if step.record.tokens is None:
                inputs = fresh + step.position(*call.args, **call.kwargs)
            else:  # the embeddings module, with the random token embeddings as its inputs_embeds
                args, kwargs = _step_args(step.record.call, fresh, positions)
                inputs = step.position(*args, **kwargs)
            for norm in step.norms:
                inputs = norm(inputs)
    inputs = to_model(inputs, order)

    def fresh_state(value: Any) -> Any:  # the cache and the shared keys and values, as the unit passes them
        return fresh_cache() if isinstance(value, cache_class) else ({} if isinstance(value, UserDict) else value)

    def run(states: torch.Tensor) -> torch.Tensor:  # states [B, S, E] -> the attention's output [B, S, E]
        states = to_model(states, order)
        streams: tuple[Any, ...] = ()
        if stem is not None:
            with torch.no_grad():
                streams = tuple(stem.module(states))

        def fresh_arg(value: Any) -> Any:
            # every argument that is the layer's hidden states gets the probe's (CTRL passes them three times: v, k, q)
            index = stem.index_of(value) if stem is not None else None
            return streams[index] if index is not None else states if value is hidden else fresh_state(value)

        kwargs = {k: fresh_arg(v) for k, v in target.kwargs.items()}
        args = [fresh_arg(v) for v in target.args]
        if stem is None and hidden_key is not None:
            kwargs[hidden_key] = states
        elif stem is None:
            args[0] = states
        with torch.no_grad():
            try:
                output = attention(*args, **kwargs)
            except Exception as exc:
                raise _probe_error(exc, target, cache_class, layer) from None
        return from_model(attention_output(output), order).detach().clone()

    batch_major = from_model(inputs, order)
    out = run(batch_major)
    _check_mixing(attention, batch_major, out, run)
    return fresh, positions, out


def _check_mixing(
    attention: nn.Module, inputs: torch.Tensor, out: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """Refuse an attention whose output at each token depends on that token alone: the first token's input changed,
    no later token's output moves. The module as transformers runs it here attends to nothing (MRA's attention
    without its CUDA kernel returns zeros), so a graph of it would not be the model's attention.

    Raises:
        ExportError: naming a custom kernel its modeling module left unloaded, where one is.
    """
    if not torch.is_tensor(out) or out.dim() != 3 or inputs.dim() != 3 or inputs.shape[1] < 2:
        return
    changed = inputs.clone()
    changed[:, 0] += torch.randn(changed[:, 0].shape, generator=torch.Generator().manual_seed(2))
    moved = (run(changed)[:, 1:] - out[:, 1:]).abs().max()
    if float(moved) > 1e-6 * max(float(out.abs().max()), 1.0):
        return
    module = inspect.getmodule(type(attention))
    kernels = [n for n, v in vars(module).items() if v is None and n.endswith("_kernel")] if module else []
    why = (f": its modeling module's custom kernel {kernels[0]} is not loaded (transformers loads it on a CUDA machine "
           f"only), and without it the module skips the attention") if kernels else ""  # fmt: skip
    raise ExportError(
        f"the {type(attention).__name__} attention mixes no positions here: changing the first token's input moves no "
        f"other token's output{why}. A graph of it would not be the model's attention, so posenc does not trace it."
    )


def _probe_error(exc: Exception, target: Call, cache_class: type, layer: int) -> Exception:
    """Why the attention fails when called with the fresh state the unit gives it (else ``exc`` itself): it reads keys
    and values another layer stored, or its cache layer carries a convolution or recurrent state (a hybrid model's
    layer that keeps one beside its keys and values, Inkling 2's)."""
    values = [*enumerate(target.args), *target.kwargs.items()]
    shared = [k for k, v in values if isinstance(v, UserDict)]
    if isinstance(exc, KeyError) and shared:
        return ExportError(
            f"the attention reads keys and values another layer stored ({shared[0]!r}, entry {exc}): its cache is "
            f"that layer's, so it cannot be traced alone; export a layer that computes its own keys and values."
        )
    caches: list[Any] = [v for _, v in values if isinstance(v, cache_class)]
    entries = [cache.layers[layer] for cache in caches if layer < len(getattr(cache, "layers", []))]
    stateful = [type(e).__name__ for e in entries if hasattr(e, "conv_states") or hasattr(e, "recurrent_states")]
    if stateful:
        return ExportError(
            f"the attention reads a convolution or recurrent state from its cache ({stateful[0]}; "
            f"{type(exc).__name__}: {str(exc)[:120]} with a cache of keys and values alone); the traced path exports "
            f"caches of keys and values [B, Hkv, P, D] only."
        )
    return exc


def _settings(attention: nn.Module) -> dict[tuple[str, str], Any]:
    """The plain settings (str, int, float, bool attributes) of the attention and its submodules."""
    return {(name, key): value for name, module in attention.named_modules() for key, value in vars(module).items()
            if isinstance(value, (str, int, float, bool)) and not key.startswith("_")}  # fmt: skip


def _check_settings(before: dict[tuple[str, str], Any], attention: nn.Module, model_type: Any) -> None:
    """Refuse an attention whose model changed its settings during the capture forward: the captured call would be
    another computation than the module built from the config (BigBird's block-sparse attention turns to full
    attention on short inputs)."""
    after = _settings(attention)
    changed = [(key, value, after.get(key)) for key, value in before.items() if after.get(key) != value]
    if changed:
        (name, attribute), old, new = changed[0]
        where = f"{name}.{attribute}" if name else attribute
        raise ExportError(
            f"the {model_type} model changed its attention's setting {where} from {old!r} to {new!r} while posenc "
            f"captured the call (on {CAPTURE_TOKENS}-token inputs); the module it runs then is not the one its config "
            f"builds, so it cannot be traced. Choose the setting in config.json (e.g. {attribute}={new!r})."
        )


def _module_causal(attention: nn.Module) -> bool:
    """Whether an attention module called without a mask hides later keys itself (its ``is_causal``)."""
    return any(getattr(module, "is_causal", False) is True for module in attention.modules())


def cacheless_heads(hf: Any, attention: nn.Module, hidden_size: int) -> tuple[int, int]:
    """``(kv heads, head width)`` of an attention called without a cache: the module's own counts (BERT's
    ``num_attention_heads`` and ``attention_head_size``, ``head_dim``, ``num_key_value_heads``), else its own config's
    (a stack's sub-config), else the model config's.

    Raises:
        ConfigError: neither names the heads.
    """
    own = getattr(attention, "config", None)  # the module's own config: a stack's sub-config (Parakeet's encoder's)
    sources = [*attention.modules(), *([own] if own is not None and own is not hf else []), hf]

    def first(*names: str) -> int | None:
        for source in sources:
            for name in names:
                try:
                    value = getattr(source, name, None)
                except Exception:  # a heterogeneous config's per-layer field read globally (EmbeddingGemma 2): not here
                    continue
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        return None

    heads = first("num_attention_heads", "num_heads", "n_head", "n_heads", "encoder_attention_heads")
    if heads is None:
        raise ConfigError(
            f"the {hf.model_type} attention called without a cache names no head count (num_attention_heads); "
            f"posenc cannot describe its geometry."
        )
    head_dim = first("attention_head_size", "head_dim", "head_size") or hidden_size // heads
    kv_heads = first("num_key_value_heads", "num_kv_heads") or heads
    return kv_heads, head_dim


__all__ = ["cacheless_heads"]
