"""The census: every text model type of the installed transformers, tried through posenc's own command line.

``posenc models --census`` (:mod:`posenc.census.cli`) runs it and writes ``docs/models.md``. The parts:

- :mod:`~posenc.census.types`: which ``model_type`` s are text model types, derived from transformers;
- :mod:`~posenc.census.tiny`: a tiny config of any type, shrunk generically from its default config;
- :mod:`~posenc.census.anatomy`: the positional scheme and layer kinds read from the model transformers builds;
- :mod:`~posenc.census.worker`: one type in its own process (tiny checkpoint, ``posenc export`` and
  ``posenc validate --against-hf`` per layer kind);
- :mod:`~posenc.census.route`: which path (family, alias, tower, trace) an export took, from its manifest;
- :mod:`~posenc.census.run`: the processes, limits and cache; :mod:`~posenc.census.report`: the page.

Public API::

    from posenc.census import run_census, render, tiny_config, text_model_types
"""

from posenc._lazy import lazy_exports

_EXPORTS = {
    "Limits": "posenc.census.run",
    "ModelType": "posenc.census.types",
    "TinyConfig": "posenc.census.tiny",
    "classify": "posenc.census.route",
    "read_anatomy": "posenc.census.anatomy",
    "render": "posenc.census.report",
    "run_census": "posenc.census.run",
    "text_model_types": "posenc.census.types",
    "tiny_config": "posenc.census.tiny",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
