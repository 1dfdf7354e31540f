"""The ``rope_type`` registry: each RoPE frequency rule is ONE function, registered with everything posenc derives
from it (in the manner of transformers' ``ROPE_INIT_FUNCTIONS``, with the metadata beside the function).

A :class:`RopeType` entry holds the function ``(rotary_dim, base, params, seq_len) -> (inv_freq float64 [r//2],
attention_factor)``, its parameters (:class:`posenc.params.Param`: name, kind, default, doc, bounds), whether its
frequencies depend on the current length (continuously, or switching at :attr:`RopeType.switch_points`), its table
modes, citation, the posenc scheme it becomes, transformers aliases (and configs it claims under another
label), how it treats partial rotary and multi-axis positions, and an optional per-position q/k scale (xPos).
Derived from the registry:

- :func:`posenc.functional.rope_inv_freq` (the public contract) validates the common keys and calls the function;
  :func:`posenc.functional.rope_frequency_sets` lists the frequency sets of static and switching types;
- ``posenc.schemes.rope``: one scheme per type (params = the RoPE family's + the type's; cases, citation, table
  modes, length dependence), built by the one ``Rotary`` class; length-dependent cos/sin sources evaluate the
  type's function in the graph (continuous) or switch between its frequency sets (:func:`switch_at`);
- ``posenc.config.from_hf_config``: ``rope_type`` (and aliases) -> scheme, for the types transformers defines, and
  which keys a config's top level may fill;
- ``posenc.plugins.rope``: the kernel's frequency inputs (:func:`posenc.functional.rope_frequency_sets`), its
  dynamic-NTK constants (:func:`ntk_exponent`) and the ONNX Runtime twin's NTK formula (:func:`dynamic_ntk_base`,
  evaluated on ONNX symbols).

Adding a ``rope_type``:

1. Write its function beside the others (``posenc/rope_types/extension.py``, ``per_frequency.py`` or ``axes.py``;
   or in your own module, imported before use): read its keys with :func:`require`, :func:`positive`,
   :func:`positive_int`, :func:`finite` so bad values raise :class:`~posenc.errors.ConfigError`, and check
   cross-parameter constraints there too. A length-dependent type takes ``seq_len`` as ``None``, an int or a 0-d
   tensor: write it with :func:`at_least` and :func:`switch_at` (or plain arithmetic) so the same definition runs
   eagerly and in exported graphs.
2. :func:`register` a :class:`RopeType` with its name, scheme name, title, summary, :class:`Citation` and
   params (plus ``length_dependent``/``switch_points``/``table_modes``/``aliases``/``in_transformers``, and
   ``partial_rotary``/``claims``/``scale_rate`` as ``proportional``, ``ntk_alpha`` and ``xpos`` use them, where they
   apply). The scheme (``posenc list``), the parity/export matrices and the ``config.json`` import follow.
3. Test it against the paper's formula or transformers (``tests/test_functional.py``) and give its scheme a
   ``@covers`` property test (``tests/schemes/test_rope.py``); ``tests/test_rope_types.py`` shows a toy type
   picked up end to end via :func:`registered`.
"""

from __future__ import annotations

from posenc.citations import Citation
from posenc.rope_types.common import (
    at_least,
    default_inv_freq,
    finite,
    ntk_exponent,
    positive,
    positive_int,
    require,
    switch_at,
)
from posenc.rope_types.registry import (
    COMMON_KEYS,
    PARTIAL_ROTARY_MODES,
    TABLE_MODES,
    InvFreq,
    RopeType,
    ScaleRate,
    SlotAxes,
    get,
    names,
    parameter_keys,
    register,
    registered,
    rope_type_name,
    transformers_schemes,
    unregister,
    watch,
)

__all__ = [
    "COMMON_KEYS",
    "PARTIAL_ROTARY_MODES",
    "ROFORMER",
    "TABLE_MODES",
    "Citation",
    "InvFreq",
    "RopeType",
    "ScaleRate",
    "SlotAxes",
    "at_least",
    "default_inv_freq",
    "dynamic_ntk_base",
    "finite",
    "get",
    "names",
    "ntk_exponent",
    "parameter_keys",
    "positive",
    "positive_int",
    "register",
    "registered",
    "require",
    "rope_type_name",
    "switch_at",
    "transformers_schemes",
    "unregister",
    "watch",
    "yarn_get_mscale",
]

# The built-in types register themselves on import, in this order (the registry's); keep these imports last.
# isort: off
from posenc.rope_types.extension import ROFORMER, dynamic_ntk_base, yarn_get_mscale
from posenc.rope_types import per_frequency as _per_frequency  # noqa: F401  (registers longrope ... xpos)
from posenc.rope_types.axes import AXIAL_COLUMNS, axial_slot_axes, mrope_slot_axes  # noqa: F401
# isort: on
