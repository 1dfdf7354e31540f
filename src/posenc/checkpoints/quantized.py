"""Quantized checkpoints: a layer's tensors dequantized exactly as transformers does, or refused with the reason.

A checkpoint whose ``config.json`` has a ``quantization_config`` stores some weights as integers plus scales; read
as they are, those integers are not the weights. :class:`QuantizedReader` sits where
:class:`~posenc.checkpoints.source.CheckpointSource` reads a tensor:

- ``quant_method: "fp8"`` (DeepSeek-V3, Qwen3-FP8: ``weight`` in ``float8_e4m3fn`` beside a ``weight_scale_inv``,
  one float32 scale per ``weight_block_size`` block, or one per tensor): the weight is dequantized to float32,
  ``float32(w) * scale`` with each block's scale — transformers' own dequantization
  (``integrations/finegrained_fp8.py``: ``Fp8Dequantize``, which ``from_pretrained`` runs on a machine without a
  GPU, and ``_dequantize_fp8_weight`` for blocks that do not divide the weight), tested against both. Scales stored
  as E8M0 exponents (``uint8`` or ``float8_e8m0fnu``) are ``2 ** (byte - 127)``, as transformers reads them. A
  ``static`` activation scheme (activations quantized with stored scales at run time) is refused: a dequantized
  export would not reproduce it.
- ``quant_method: "mxfp4"`` (gpt-oss): transformers' MXFP4 quantizes only the MoE experts
  (``integrations/mxfp4.py`` ``replace_with_mxfp4_linear`` replaces ``GptOssMLP`` experts alone), so the attention
  tensors are stored unquantized and read as stored; an attention tensor stored as MXFP4 ``_blocks`` / ``_scales``
  is refused (transformers would not load it either).
- every other method (bitsandbytes int8 / nf4, GPTQ, AWQ, compressed-tensors, HQQ, ...) is refused when the
  checkpoint is opened, naming the method and how to get a dequantized copy.

Without a ``quantization_config``, a weight stored as integers or fp8 is refused too (a quantized checkpoint whose
config lost its quantization section). What was dequantized is recorded in the manifest
(:class:`posenc.provenance.Quantization`); the float32 values are what both posenc's block and the transformers
reference of ``validate --against-hf`` are built from, so no reference ever reads the raw integers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from posenc.errors import ConfigError, ModelFileError
from posenc.provenance import Quantization

DEQUANTIZED = ("fp8", "mxfp4")
"""The ``quant_method`` values posenc reads."""
SCALE_SUFFIX = "_scale_inv"
FP8_WEIGHTS = (torch.float8_e4m3fn, torch.float8_e5m2)

_HOW = (
    "Dequantize it first: load it with transformers and save a full-precision copy "
    "(model = AutoModelForCausalLM.from_pretrained(DIR); model.dequantize(); model.save_pretrained(OUT), or export "
    "the original bf16 checkpoint the quantized one was made from) and pass that folder."
)


def _method_name(config: Mapping[str, Any]) -> str:
    """A readable name of a quantization config's method (``bitsandbytes int8``, ``bitsandbytes nf4``, ``gptq``)."""
    method = str(config.get("quant_method", "unknown"))
    if method == "bitsandbytes":
        if config.get("load_in_8bit"):
            return "bitsandbytes int8"
        if config.get("load_in_4bit"):
            return f"bitsandbytes {config.get('bnb_4bit_quant_type', '4-bit')}"
    bits = config.get("bits")
    return f"{method} {bits}-bit" if isinstance(bits, int) and not isinstance(bits, bool) else method


def _block_size(config: Mapping[str, Any], location: str) -> list[int] | None:
    block = config.get("weight_block_size")
    if block is None:
        return None
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise ConfigError(
            f"checkpoint {location}: quantization_config.weight_block_size is {block!r}; expected two positive "
            f"integers [rows, columns] (DeepSeek-V3 and Qwen3-FP8 use [128, 128]) or null for one scale per tensor."
        )
    return [int(b) for b in block]


def quantization_of(config: Mapping[str, Any], location: str) -> tuple[str, list[int] | None] | None:
    """``(method, block size)`` of a checkpoint's ``quantization_config`` (None without one).

    Raises:
        ConfigError: a method posenc does not dequantize (named, with what to do), an fp8 config with a static
            activation scheme or a malformed block size, or a ``quantization_config`` that is not an object.
    """
    section = config.get("quantization_config")
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"checkpoint {location}: quantization_config is a {type(section).__name__}, not an object; posenc cannot "
            f"tell how its weights are stored. {_HOW}"
        )
    method = section.get("quant_method")
    if method not in DEQUANTIZED:
        raise ConfigError(
            f"checkpoint {location} is quantized with {_method_name(section)} (quantization_config.quant_method "
            f"{method!r}); posenc exports only weights it can read exactly — fp8 with block scales and MXFP4 "
            f"checkpoints are dequantized as transformers does, no other method is: its stored integers are not the "
            f"weights. {_HOW}"
        )
    if method == "fp8":
        scheme = section.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise ConfigError(
                f"checkpoint {location} is fp8 with activation_scheme {scheme!r}: its activations are quantized with "
                f"stored scales at run time, which a dequantized export does not reproduce. {_HOW}"
            )
        return "fp8", _block_size(section, location)
    return "mxfp4", None


def scale_values(scale: torch.Tensor) -> torch.Tensor:
    """float32 values of stored scales: E8M0 exponents (``uint8`` / ``float8_e8m0fnu``) as ``2 ** (byte - 127)``,
    floats as they are."""
    if scale.dtype == torch.uint8:
        return (scale.to(torch.float32) - 127.0).exp2()
    return scale.to(torch.float32)


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block: list[int] | None, name: str) -> torch.Tensor:
    """float32 weight ``[..., N, K]`` of an fp8 ``weight`` and its ``scale [..., ceil(N / bn), ceil(K / bk)]``
    (``block = [bn, bk]``; None: one scale), each element ``float32(w) * scale of its block``.

    Raises:
        ModelFileError: a weight that is not fp8, or a scale grid that does not fit the weight and block size.
    """
    if weight.dtype not in FP8_WEIGHTS:
        raise ModelFileError(
            f"tensor {name!r} has a {name}{SCALE_SUFFIX} beside it but is stored as {weight.dtype}, not float8 "
            f"(e4m3 / e5m2); posenc dequantizes fp8 weights only. {_HOW}"
        )
    values, scales = weight.to(torch.float32), scale_values(scale)
    if block is None or (scales.numel() == 1 and scales.dim() < 2):  # one scale for the whole tensor
        if scales.numel() != 1:
            raise ModelFileError(
                f"tensor {name!r}: quantization_config gives no weight_block_size (one scale per tensor), but "
                f"{name}{SCALE_SUFFIX} holds {scales.numel()} scales {list(scale.shape)}; the config does not match "
                f"the weights."
            )
        return values * scales.reshape(())
    rows, cols = weight.shape[-2:] if weight.dim() >= 2 else (0, 0)
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    if weight.dim() < 2 or tuple(scales.shape[-2:]) != grid or scales.shape[:-2] != weight.shape[:-2]:
        raise ModelFileError(
            f"tensor {name!r} of shape {list(weight.shape)} with blocks {block} needs scales of shape "
            f"{[*weight.shape[:-2], *grid]}, but {name}{SCALE_SUFFIX} has {list(scale.shape)}; the checkpoint's "
            f"scales do not belong to this weight."
        )
    expanded = scales.repeat_interleave(block[0], dim=-2)[..., :rows, :].repeat_interleave(block[1], dim=-1)
    return values * expanded[..., :cols]


class QuantizedReader:
    """Reads a checkpoint's tensors through its ``quantization_config`` (see the module docstring).

    Args:
        config: the checkpoint's ``config.json``.
        location: the checkpoint (for messages).
        stored: tensor name -> the tensor as stored.
        has: whether the checkpoint holds a tensor name.

    Raises:
        ConfigError: (on construction) a quantization method posenc does not dequantize.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        location: str,
        stored: Callable[[str], torch.Tensor],
        has: Callable[[str], bool],
    ) -> None:
        self.location = location
        self.scheme = quantization_of(config, location)
        self._stored, self._has = stored, has
        self.dequantized: set[str] = set()
        """Full names of the tensors read dequantized."""

    def read(self, name: str) -> torch.Tensor:
        """The tensor ``name``: dequantized to float32 where the checkpoint stores it quantized, else as stored.

        Raises:
            ModelFileError: a weight stored quantized in a way posenc cannot dequantize exactly (names the tensor and
                what to do), a scale that does not fit, or the tensor cannot be read.
        """
        method, block = self.scheme or (None, None)
        if not self._has(name) and self._has(f"{name}_blocks"):
            raise ModelFileError(
                f"checkpoint {self.location} stores {name!r} as MXFP4 blocks ({name}_blocks / {name}_scales); "
                f"transformers' MXFP4 quantizes only MoE experts and would not load this attention tensor. {_HOW}"
            )
        tensor = self._stored(name)
        if method == "fp8" and self._has(name + SCALE_SUFFIX):
            self.dequantized.add(name)
            return dequantize_fp8(tensor, self._stored(name + SCALE_SUFFIX), block, name)
        if name.endswith("weight") and (tensor.dtype in FP8_WEIGHTS or not (tensor.is_floating_point() or
                                                                            tensor.dtype == torch.bool)):  # fmt: skip
            why = (
                f"with no {name}{SCALE_SUFFIX} beside it"
                if method == "fp8"
                else f"while config.json says {f'{method}-quantized' if method else 'nothing about quantization'}"
            )
            raise ModelFileError(
                f"checkpoint {self.location} stores {name!r} as {tensor.dtype} {why}: raw quantized values, not "
                f"weights posenc can read exactly. {_HOW}"
            )
        return tensor

    def record(self, names: Iterable[str]) -> Quantization | None:
        """The manifest's record of how the tensors ``names`` were read (None: the checkpoint is not quantized)."""
        if self.scheme is None:
            return None
        method, block = self.scheme
        return Quantization(method, block, sorted(n for n in set(names) if n in self.dequantized))


__all__ = ["DEQUANTIZED", "QuantizedReader", "dequantize_fp8", "quantization_of", "scale_values"]
