"""Non-default scheme cases (layouts, partial rotary, other bucket and bias variants) and encoder geometry.

The registry matrix covers every scheme's ``default`` case; these are the variants whose exported
graphs differ in structure (strided pairs, a pass-through tail, causal buckets, absolute distances,
a gather instead of rel-shift, concatenated sinusoids, the bidirectional ReRoPE score matrix).
"""

from __future__ import annotations

import pytest

from posenc import AttentionConfig, get_spec
from posenc.export import export_scheme, load_manifest
from posenc.validate import validate_onnx
from tests.conftest import SMALL
from tests.matrix import MatrixCase, exported

ENCODER = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=64, causal=False)

CASES = [
    ("rope", "interleaved_partial", "op", "dynamic", "fp16", SMALL),
    ("rope", "partial", "op", "precomputed", "fp32", SMALL),
    ("rope", "interleaved", "block", "precomputed", "fp16", SMALL),
    ("rope_yarn", "deepseek_mscale", "op", "dynamic", "fp32", SMALL),
    ("alibi", "symmetric", "op", "precomputed", "fp16", ENCODER),
    ("t5", "causal", "op", "dynamic", "fp32", SMALL),
    ("transformer_xl", "gather", "op", "precomputed", "fp32", SMALL),
    ("sinusoidal", "concat", "op", "dynamic", "fp16", SMALL),
    ("leaky_rerope", "interleaved", "op", "precomputed", "fp32", ENCODER),
]


@pytest.mark.parametrize(
    ("scheme", "case", "unit", "mode", "dtype", "config"),
    [pytest.param(*c, id=f"{c[0]}-{c[1]}-{c[2]}-{c[3]}-{c[4]}{'-encoder' if not c[5].causal else ''}") for c in CASES],
)
def test_case_matches_eager_reference(scheme, case, unit, mode, dtype, config, tmp_path, export_cache) -> None:
    params = get_spec(scheme).cases[case]
    if config is SMALL:  # the session's shared export (the fusion tests read some of the same graphs)
        full = {"fp32": "float32", "fp16": "float16"}[dtype]
        path = exported(MatrixCase(scheme, mode, full, unit, case=case), export_cache, SMALL)
    else:
        path = export_scheme(
            scheme, tmp_path / "m.onnx", unit=unit, params=params, config=config, table_mode=mode, dtype=dtype
        ).path
    assert load_manifest(path).params == get_spec(scheme).resolve(params, config)
    report = validate_onnx(path)
    assert report.passed, report.to_markdown()
