"""RoPE's long-range decay curve against its formula evaluated with explicit loops.

Source: Su Jianlin 2021, https://kexue.fm/archives/8265, section 远程衰减; RoFormer, arXiv:2104.09864.
"""

from __future__ import annotations

import cmath

import pytest

from posenc.errors import ConfigError
from posenc.report import plot_rope_decay, rope_long_range_decay


def _naive(m: int, d: int, base: float) -> float:
    theta = [base ** (-2 * i / d) for i in range(d // 2)]
    total = 0.0
    for j in range(d // 2):
        total += abs(sum(cmath.exp(1j * m * theta[i]) for i in range(j + 1)))
    return total / (d // 2)


def test_matches_the_seed_formula() -> None:
    m, f = rope_long_range_decay(head_dim=16, base=10000.0, max_distance=40)
    assert m.tolist() == list(range(41))
    for distance in (0, 1, 7, 40):
        assert f[distance].item() == pytest.approx(_naive(distance, 16, 10000.0), rel=1e-12)


def test_starts_at_its_maximum_and_decays() -> None:
    _, f = rope_long_range_decay()
    assert f[0].item() == pytest.approx((128 / 2 + 1) / 2)  # every |S_j| = j + 1 at m = 0
    assert f.max().item() == f[0].item()
    assert f[200:].max() < 0.4 * f[0]


def test_bad_arguments_and_plot(tmp_path) -> None:
    with pytest.raises(ConfigError):
        rope_long_range_decay(head_dim=127)
    with pytest.raises(ConfigError, match="max_distance"):
        rope_long_range_decay(max_distance=-1)
    assert plot_rope_decay(tmp_path / "decay.png").read_bytes()[:4] == b"\x89PNG"
