"""Tiny checkpoints for the loader tests (the family samples themselves live in posenc.checkpoints.samples)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from posenc.checkpoints.samples import TINY, get_sample


def llama(folder: Path, **overrides: Any) -> Path:
    """A sharded 3-layer Llama checkpoint (``overrides`` go to ``LlamaConfig``)."""
    sample = get_sample("llama")
    return dataclasses.replace(sample, settings={**sample.settings, **overrides}).build(folder)


__all__ = ["TINY", "llama"]
