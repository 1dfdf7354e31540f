"""NoPE: no positional encoding at all (the baseline every scheme is compared with)."""

from __future__ import annotations

from posenc.schemes.base import BOTH_TABLE_MODES, Placement, PositionalScheme, SchemeSpec
from posenc.schemes.registry import register


class NoPE(PositionalScheme):
    """No positional information; a causal mask alone orders tokens (Kazemnejad et al., 2023)."""


NoPE.spec = SchemeSpec(
    name="nope",
    title="NoPE (no positional encoding)",
    family="nope",
    placement=Placement.NONE,
    params=(),
    table_modes=BOTH_TABLE_MODES,
    citation="Kazemnejad et al., The Impact of Positional Encoding on Length Generalization in Transformers, "
    "NeurIPS 2023",
    summary="Baseline without positional encoding; attention is permutation-equivariant except for the mask.",
    exports=frozenset({"block"}),
    verified_against="plain scaled dot-product attention (torch.nn.functional.scaled_dot_product_attention)",
)
register(NoPE.spec, NoPE)
