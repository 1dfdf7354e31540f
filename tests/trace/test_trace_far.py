"""The rewrite of traced angles far out (slow): positions up to 131071, every angle rule and layout.

Reference: the checkpoint's own attention module fed float64 angles from posenc's scheme (posenc's frequencies are
tested against transformers' ``ROPE_INIT_FUNCTIONS`` in tests/test_rope_types.py). The traced graph before posenc's
rewrite (transformers' float32 angles, ~1e-2 rad off at 131071) is measured too: the test fails if the rewrite left
those angles in place.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.export.feeds import make_feed
from posenc.export.runtime import ort_session
from posenc.export.shapes import FeedShape
from posenc.export.trace import RewriteRequest, export_traced
from posenc.graphs.trace_rewrite import replace_positions
from posenc.trace.reference import load_traced
from tests.trace.samples import FAR, LONG, build

pytestmark = pytest.mark.slow

MODES = [(name, "precomputed") for name in FAR] + [(name, "dynamic") for name in ("half", "yarn", "longrope")]


@pytest.mark.parametrize(("name", "mode"), MODES)
def test_the_graph_s_angles_are_posenc_s_at_the_context_s_end(
    name: str, mode: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp(f"{name}-{mode}")
    sample = FAR[name]
    folder = build(sample, root)
    requests: list[RewriteRequest] = []

    def spy(request: RewriteRequest):
        requests.append(request)
        return replace_positions(request)

    result = export_traced(root / "far.onnx", folder, layer=sample.layer, table_mode=mode, rewrite=spy)
    assert result.manifest.trace.replaced()
    exact = load_traced(folder, sample.layer).reference("float64", torch.float64)
    for shape in (FeedShape(1, 4, 0, start=LONG - 4), FeedShape(2, 1, 5, start=LONG - 1)):
        feed = make_feed(result.manifest, shape, seed=7)
        keys = ("hidden", "position_ids", "past_key", "past_value")
        want = [t.numpy() for t in exact(*(torch.from_numpy(feed[k]) for k in keys))]
        got = ort_session(result.path).run(None, feed)
        traced = ort_session(requests[0].model.SerializeToString()).run(None, feed)
        errors = [float(np.abs(a - b).max()) for a, b in zip(got, want, strict=True)]
        traced_errors = [float(np.abs(a - b).max()) for a, b in zip(traced, want, strict=True)]
        assert max(errors) <= 1e-5, (shape, errors)
        assert max(traced_errors) > 10 * max(errors), (shape, traced_errors, errors)
