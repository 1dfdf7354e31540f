"""T5 bucketed relative bias: the published bucket table, Hugging Face's buckets, the bias per (i, j).

The table: Su Jianlin 2021, https://kexue.fm/archives/8130, section T5式.
"""

from __future__ import annotations

import pytest
import torch

from posenc import AttentionConfig, ConfigError, build_scheme
from tests.conftest import covers

CONFIG = AttentionConfig(hidden_size=32, num_heads=2, max_position_embeddings=64)
BUCKET_SETTINGS = [(True, 32, 128), (False, 32, 128), (True, 8, 20), (False, 16, 32), (True, 64, 1000), (True, 5, 7)]


def _with_bucket_ids_as_weights(scheme):
    """Make ``bias[b, h, i, j]`` read out the bucket id (head 0) and minus it (head 1)."""
    ids = torch.arange(scheme.relative_bias.weight.shape[0], dtype=torch.float64)
    with torch.no_grad():
        scheme.relative_bias.weight.copy_(torch.stack((ids, -ids), dim=1))
    return scheme


@covers("t5")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_buckets_reproduce_the_published_table(mode: str) -> None:
    # Su Jianlin 2021 (kexue.fm/archives/8130, section T5式): f(i - j) for i - j = 0..30 (T5 defaults:
    # bidirectional, 32 buckets, max_distance 128).
    seed_table = list(range(8)) + [8] * 4 + [9] * 4 + [10] * 7 + [11] * 8
    scheme = _with_bucket_ids_as_weights(build_scheme("t5", CONFIG, {}, mode, max_positions=64).double())
    q_pos, k_pos = torch.tensor([[30]]), torch.arange(31).unsqueeze(0)  # i - j = 30 .. 0
    bias = scheme.bias(None, None, q_pos, k_pos)
    assert bias[0, 0, 0].flip(0).long().tolist() == seed_table
    torch.testing.assert_close(bias[0, 1], -bias[0, 0])


@covers("t5")
@pytest.mark.parametrize(("bidirectional", "num_buckets", "max_distance"), BUCKET_SETTINGS)
def test_buckets_match_hugging_face_over_a_wide_range(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    transformers = pytest.importorskip("transformers")
    hf_bucket = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
    params = {"bidirectional": bidirectional, "num_buckets": num_buckets, "max_distance": max_distance}
    distance = torch.arange(-5000, 5001)
    expected = hf_bucket(distance, bidirectional, num_buckets, max_distance)
    dynamic = build_scheme("t5", CONFIG, params, "dynamic").relative_bias
    assert torch.equal(dynamic.graph_bucket(distance), expected)
    precomputed = build_scheme("t5", CONFIG, params, "precomputed", max_positions=5001).relative_bias
    assert torch.equal(precomputed.bucket_table, expected)
    far = torch.tensor([-(2**24) + 1, -123457, 99999, 2**24 - 1])
    assert torch.equal(dynamic.graph_bucket(far), hf_bucket(far, bidirectional, num_buckets, max_distance))


@covers("t5")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
@pytest.mark.parametrize("params", [{}, {"bidirectional": False, "num_buckets": 16, "max_distance": 32}])
def test_bias_is_the_learned_entry_of_each_bucket(mode: str, params: dict) -> None:
    transformers = pytest.importorskip("transformers")
    hf_bucket = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
    resolved = {"bidirectional": True, "num_buckets": 32, "max_distance": 128, **params}
    scheme = build_scheme("t5", CONFIG, params, mode).double()
    weight = scheme.relative_bias.weight.detach()
    q_pos, k_pos = torch.tensor([[40, 41, 42], [0, 1, 2]]), torch.arange(63).expand(2, 63)
    got = scheme.bias(None, None, q_pos, k_pos)
    for b in range(2):
        for i in range(3):
            for j in range(63):
                bucket = int(hf_bucket(k_pos[b, j] - q_pos[b, i], *resolved.values()))
                torch.testing.assert_close(got[b, :, i, j], weight[bucket], atol=0, rtol=0)
    assert scheme.score_scale() == 1.0


@covers("t5")
def test_precomputed_equals_dynamic_in_range() -> None:
    dynamic = build_scheme("t5", CONFIG, {}, "dynamic")
    precomputed = build_scheme("t5", CONFIG, {}, "precomputed")
    precomputed.load_state_dict(dynamic.state_dict(), strict=False)
    q_pos, k_pos = torch.arange(60, 64).expand(2, 4), torch.arange(64).expand(2, 64)
    torch.testing.assert_close(precomputed.bias(None, None, q_pos, k_pos), dynamic.bias(None, None, q_pos, k_pos))


@covers("t5", "tupe")
@pytest.mark.parametrize("name", ["t5", "tupe"])
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"num_buckets": 1}, "num_buckets.*>= 2"),
        ({"num_buckets": 3}, "use num_buckets >= 4 when bidirectional"),
        ({"num_buckets": 16, "max_distance": 4}, "raise max_distance or lower num_buckets"),
        ({"bidirectional": False, "num_buckets": 32, "max_distance": 16}, "raise max_distance"),
        ({"max_distance": 0}, "max_distance.*>= 1"),
    ],
)
def test_bad_bucket_parameters_raise(name: str, params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_scheme(name, CONFIG, params)
