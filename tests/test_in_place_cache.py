"""The in-place KV cache in eager mode: ``AttentionBlock.forward_in_place`` and ``functional.write_cache``.

Reference: the same block's ``forward`` with the concatenated cache (``past_key``/``past_value`` grown by
``torch.cat`` every step), float64, over a prefill, 64 single-token steps and a jump to the last position.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posenc.blocks import AttentionBlock
from posenc.config import AttentionConfig
from posenc.errors import ConfigError, ExportError
from posenc.export.units import RING_STEP, ring_capacity
from posenc.functional import write_cache
from posenc.schemes import get_spec, scheme_names
from posenc.schemes.base import Placement

CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=96)
PREFILL, STEPS = 5, 64
CONTIGUOUS = {"transformer_xl"}
"""Schemes whose keys must sit at contiguous positions (rel_shift): their jump is a chunk up to the last slot."""


def _block(scheme: str) -> AttentionBlock:
    torch.manual_seed(0)
    return AttentionBlock(CONFIG, scheme).double().eval()


@pytest.mark.parametrize("scheme", scheme_names())
def test_in_place_steps_match_the_concatenated_cache(scheme: str) -> None:
    block = _block(scheme)
    batch, slots = 2, CONFIG.max_position_embeddings
    # (new tokens, first position): a prefill, single steps, then a jump to the last position (or, for schemes
    # that need contiguous positions, a chunk filling the cache but one slot, then one token in the last)
    steps = [(PREFILL, 0)] + [(1, PREFILL + i) for i in range(STEPS)]
    past = PREFILL + STEPS
    jump = [(slots - 1 - past, past), (1, slots - 1)] if scheme in CONTIGUOUS else [(1, slots - 1)]
    steps += jump
    generator = torch.Generator().manual_seed(1)
    key_cache = torch.randn(batch, 2, slots, CONFIG.head_dim, dtype=torch.float64, generator=generator)
    value_cache = torch.randn(batch, 2, slots, CONFIG.head_dim, dtype=torch.float64, generator=generator)
    past_key = past_value = None
    filled = 0
    with torch.no_grad():
        for seq, first in steps:
            hidden = torch.randn(batch, seq, CONFIG.hidden_size, dtype=torch.float64, generator=generator)
            positions = (first + torch.arange(seq)).expand(batch, seq)
            expected, past_key, past_value = block(hidden, positions, past_key, past_value)
            past_length = torch.full((batch,), filled, dtype=torch.int64)
            out, key_cache, value_cache = block.forward_in_place(hidden, positions, key_cache, value_cache, past_length)
            filled += seq
            torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(key_cache[:, :, :filled], past_key, rtol=0, atol=0)
            torch.testing.assert_close(value_cache[:, :, :filled], past_value, rtol=0, atol=0)


def test_rows_of_different_lengths_each_match_their_own_cache() -> None:
    block = _block("rope")
    generator = torch.Generator().manual_seed(2)
    lengths = [3, 7]
    caches = [torch.randn(2, 2, 16, CONFIG.head_dim, dtype=torch.float64, generator=generator) for _ in range(2)]
    hidden = torch.randn(2, 2, CONFIG.hidden_size, dtype=torch.float64, generator=generator)
    past_length = torch.tensor(lengths)
    with torch.no_grad():
        out, keys, values = block.forward_in_place(hidden, None, caches[0], caches[1], past_length)
        for row, past in enumerate(lengths):
            past_kv = [c[row : row + 1, :, :past] for c in caches]
            expected, key, value = block(hidden[row : row + 1], None, *past_kv)
            torch.testing.assert_close(out[row : row + 1], expected, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(keys[row : row + 1, :, : past + 2], key, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(values[row : row + 1, :, : past + 2], value, rtol=1e-12, atol=1e-12)
            # slots after the new tokens are left as they were
            torch.testing.assert_close(keys[row, :, past + 2 :], caches[0][row, :, past + 2 :], rtol=0, atol=0)


def test_write_cache_writes_only_the_new_slots_and_refuses_overflow() -> None:
    cache = torch.zeros(2, 1, 4, 3)
    new = torch.ones(2, 1, 2, 3)
    written = write_cache(cache, new, torch.tensor([0, 2]))
    assert written[0, 0, :, 0].tolist() == [1, 1, 0, 0]
    assert written[1, 0, :, 0].tolist() == [0, 0, 1, 1]
    assert cache.abs().sum() == 0  # eager mode returns a new tensor
    with pytest.raises(ConfigError, match="past_length \\+ S <= C"):
        write_cache(cache, new, torch.tensor([0, 3]))
    with pytest.raises(ConfigError, match="integer"):
        write_cache(cache, new, torch.tensor([0.0, 1.0]))


def test_attention_schemes_refuse_rows_of_different_lengths() -> None:
    scheme = next(n for n in scheme_names() if get_spec(n).placement is Placement.ATTENTION)
    block = _block(scheme)
    caches = [torch.zeros(2, 2, 16, CONFIG.head_dim, dtype=torch.float64) for _ in range(2)]
    hidden = torch.zeros(2, 1, CONFIG.hidden_size, dtype=torch.float64)
    with pytest.raises(ConfigError, match="share past_length"):
        block.forward_in_place(hidden, None, *caches, torch.tensor([1, 2]))


WINDOW = 6


def _ring_steps(ring: int) -> list[tuple[int, int]]:
    """(new tokens, first position): a prefill of the whole ring, single steps across the wrap, chunks of the most
    the ring serves once the window is full (C - W + 1), rows of different lengths aside, a jump to the end."""
    steps = [(ring, 0)] + [(1, ring + i) for i in range(2 * ring)]
    past = 3 * ring
    chunk = ring - WINDOW + 1
    steps += [(chunk, past), (chunk, past + chunk)]
    past += 2 * chunk
    return [*steps, (1, CONFIG.max_position_embeddings - 1)]


@pytest.mark.parametrize(("scheme", "ring"), [("rope", WINDOW), ("rope", WINDOW + 3), ("alibi", WINDOW + 1)])
def test_ring_cache_steps_match_the_concatenated_cache_across_the_wrap(scheme: str, ring: int) -> None:
    """A sliding-window block's ring of C >= W slots: every step (the ring wrapped several times, chunks of
    C - W + 1) equals the block over its whole concatenated cache; the ring holds the last C tokens' keys."""
    config = dataclasses.replace(CONFIG, sliding_window=WINDOW)
    torch.manual_seed(0)
    block = AttentionBlock(config, scheme).double().eval()
    batch = 2
    generator = torch.Generator().manual_seed(3)
    caches = [torch.randn(batch, 2, ring, CONFIG.head_dim, dtype=torch.float64, generator=generator) for _ in "kv"]
    past_key = past_value = None
    filled = 0
    with torch.no_grad():
        for seq, first in _ring_steps(ring):
            hidden = torch.randn(batch, seq, CONFIG.hidden_size, dtype=torch.float64, generator=generator)
            positions = (first + torch.arange(seq)).expand(batch, seq)
            expected, past_key, past_value = block(hidden, positions, past_key, past_value)
            past_length = torch.full((batch,), filled, dtype=torch.int64)
            out, *caches = block.forward_in_place(hidden, positions, *caches, past_length, ring=True)
            filled += seq
            torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
            tokens = torch.arange(max(0, filled - ring), filled)
            torch.testing.assert_close(caches[0][:, :, tokens % ring], past_key[:, :, tokens], rtol=0, atol=0)
            torch.testing.assert_close(caches[1][:, :, tokens % ring], past_value[:, :, tokens], rtol=0, atol=0)


def test_ring_cache_refuses_calls_that_overwrite_needed_keys() -> None:
    config = dataclasses.replace(CONFIG, sliding_window=WINDOW)
    block = AttentionBlock(config, "rope").double().eval()
    caches = [torch.zeros(1, 2, WINDOW + 2, CONFIG.head_dim, dtype=torch.float64) for _ in "kv"]
    hidden = torch.zeros(1, 4, CONFIG.hidden_size, dtype=torch.float64)
    with pytest.raises(ConfigError, match=r"feed at most 3 tokens per call"):
        block.forward_in_place(hidden, None, *caches, torch.tensor([20]), ring=True)
    with pytest.raises(ConfigError, match="causal sliding-window block"):
        _block("rope").forward_in_place(hidden, None, *caches, torch.tensor([0]), ring=True)


def test_ring_capacity_of_a_sliding_block_and_when_the_cache_stays_linear() -> None:
    """The in-place unit's cache: a causal sliding block's ring of W + 15 slots (or --cache-capacity N >= W); a
    capacity covering the positions, a block without a window and a bidirectional window keep the linear cache."""
    sliding = AttentionBlock(dataclasses.replace(CONFIG, sliding_window=WINDOW), "rope")
    assert ring_capacity(sliding, None) == WINDOW + RING_STEP - 1
    assert ring_capacity(sliding, 32) == 32
    assert ring_capacity(sliding, CONFIG.max_position_embeddings) is None
    assert ring_capacity(_block("rope"), 32) is None
    assert ring_capacity(AttentionBlock(dataclasses.replace(CONFIG, sliding_window=4, causal=False), "rope"), 8) is None
    with pytest.raises(ExportError, match="shorter than the block's sliding window"):
        ring_capacity(sliding, WINDOW - 1)
