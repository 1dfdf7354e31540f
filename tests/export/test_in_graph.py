"""Data-dependent schemes computed inside the exported graph: dynamic NTK and LongRoPE's factor switch.

The ONNX graphs are run by ONNX Runtime at lengths on both sides of the switch point and compared with
an independent reference built from posenc.functional (Hugging Face semantics: frequencies for the
current length L = max(position) + 1), and with the eager module at each length.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc import functional
from posenc.export import FeedShape, export_scheme, load_eager, make_feed, reference_inputs, run_onnx
from tests.conftest import SMALL
from tests.matrix import MatrixCase, exported_result

ROTARY = SMALL.head_dim  # 16


def _functional_rotation(feed: dict[str, np.ndarray], hf_params: dict, length: int) -> list[np.ndarray]:
    inv_freq, attention_factor = functional.rope_inv_freq(ROTARY, hf_params, seq_len=length)
    positions = torch.from_numpy(feed["position_ids"])
    cos, sin = functional.rope_cos_sin(positions, inv_freq, attention_factor, dtype=torch.float64)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return [
        functional.apply_rope(torch.from_numpy(feed[name]).double(), cos, sin, "half").numpy() for name in ("q", "k")
    ]


def _check_lengths(path, hf_params: dict, shapes: list[FeedShape]) -> dict[int, list[np.ndarray]]:
    eager, manifest = load_eager(path)
    produced = {}
    for shape in shapes:
        length = shape.past + shape.seq
        feed = make_feed(manifest, shape, seed=length)
        got = run_onnx(path, feed, manifest=manifest)
        expected = _functional_rotation(feed, hf_params, length)
        with torch.no_grad():
            from_eager = [t.numpy() for t in eager(*reference_inputs(manifest, feed, torch.float64))]
        for name, want, mirror in zip(("q_rot", "k_rot"), expected, from_eager, strict=True):
            np.testing.assert_allclose(got[name], want, atol=3e-5, rtol=1e-4, err_msg=f"{name} at L={length}")
            np.testing.assert_allclose(mirror, want, atol=1e-12, rtol=1e-12, err_msg=f"eager {name} at L={length}")
        produced[length] = [got["q_rot"], feed["q"], feed["position_ids"]]
    return produced


def test_dynamic_ntk_recomputes_its_base_inside_the_graph(export_cache) -> None:
    result = exported_result(MatrixCase("rope_dynamic", "dynamic", "float32", "op"), export_cache, SMALL)
    hf = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0, "max_position_embeddings": 64}
    # L = 10 and 64 (at the limit): plain RoPE frequencies; L = 107 and 1001: the base grows with L
    # ... and at L = 131072 the float64 constants of the in-graph math must stay exact (2π, factor)
    shapes = [FeedShape(2, 10, 0), FeedShape(1, 4, 60), FeedShape(2, 7, 100), FeedShape(1, 1, 1000)]
    shapes.append(FeedShape(1, 2, 131070))
    produced = _check_lengths(result.path, hf, shapes)
    plain = {"rope_type": "default", "rope_theta": 10000.0}
    for length, (q_rot, q, positions) in produced.items():
        unscaled = _functional_rotation({"q": q, "k": q, "position_ids": positions}, plain, length)[0]
        differs = np.abs(q_rot - unscaled).max() > 1e-2
        assert differs == (length > 64), f"L={length}: scaling {'missing' if length > 64 else 'applied early'}"


@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_longrope_switches_factor_sets_inside_the_graph(mode: str, tmp_path) -> None:
    short = [1.0 + 0.05 * i for i in range(ROTARY // 2)]
    long = [1.5 + 0.5 * i for i in range(ROTARY // 2)]
    params = {"original_max_position_embeddings": 16, "factor": 4.0, "short_factor": short, "long_factor": long}
    result = export_scheme(
        "rope_longrope", tmp_path / "longrope.onnx", unit="op", params=params, config=SMALL, table_mode=mode
    )
    hf = {"rope_type": "longrope", "rope_theta": 10000.0, "max_position_embeddings": 64, **params}
    # L = 8 and 16 (at the switch): short factors; L = 17 and 40: long factors
    shapes = [FeedShape(2, 8, 0), FeedShape(1, 3, 13), FeedShape(2, 1, 16), FeedShape(1, 5, 35)]
    produced = _check_lengths(result.path, hf, shapes)
    short_hf = {**hf, "long_factor": short}
    for length, (q_rot, q, positions) in produced.items():
        with_short = _functional_rotation({"q": q, "k": q, "position_ids": positions}, short_hf, length)[0]
        uses_long = np.abs(q_rot - with_short).max() > 1e-2
        assert uses_long == (length > 16), f"L={length}: wrong factor set"
