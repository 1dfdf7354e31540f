"""The ONNX graphs and engines a benchmark run needs, made once per workload and kept in one folder."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from posenc.artifacts.files import new_scratch
from posenc.bench.workloads import Workload
from posenc.errors import PosencError
from posenc.export.manifest import OptimizedRecord

SESSION_CACHE_SIZE = 4
"""Sessions kept alive at once (each holds its graph's weights and a thread pool)."""


class SkipCase(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """This backend cannot run this workload; the message is the reason shown in the report."""


class ModelStore:
    """Exports, optimizes and builds on demand; each artifact once per workload key.

    Args:
        folder: where files go; ``None`` makes a scratch folder removed by :meth:`close` (and by the next run
            when this one is killed, :func:`posenc.artifacts.files.new_scratch`).
        position_guard: export graphs with the position guard (the default of ``posenc export``).
    """

    def __init__(self, folder: Path | None = None, *, position_guard: bool = True) -> None:
        self._temporary = folder is None
        self.position_guard = position_guard
        self.folder = new_scratch("bench") if folder is None else Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._exported: dict[str, Path] = {}
        self._graph_inputs: dict[str, list[str]] = {}
        self._optimized: dict[tuple[str, str], Path] = {}
        self._failures: dict[tuple[str, str], str] = {}
        self.graph_notes: dict[tuple[str, str], OptimizedRecord] = {}
        self._closers: list[Callable[[], Any]] = []
        self._cache: dict[tuple[Any, ...], Any] = {}

    def adopt(
        self,
        key: str,
        exported: Path,
        optimized: Mapping[str, Path] | None = None,
        notes: Mapping[str, OptimizedRecord] | None = None,
    ) -> None:
        """Use graphs made elsewhere (e.g. by ``posenc demo``) for the workloads with this key.

        Args:
            key: :func:`posenc.bench.workloads.workload_key` of the workloads.
            exported: the exported ONNX file.
            optimized: target -> optimized ONNX file (e.g. ``{"ort-cpu": path}``).
            notes: target -> what the optimization reported (its manifest's ``optimized`` record).
        """
        self._exported[key] = Path(exported)
        self._graph_inputs[key] = _graph_input_names(Path(exported))
        for target, path in (optimized or {}).items():
            self._optimized[(key, target)] = Path(path)
        for target, record in (notes or {}).items():
            self.graph_notes[(key, target)] = record

    def exported(self, workload: Workload) -> Path:
        """The decomposed ONNX graph of ``workload`` (exported on first use)."""
        key = workload.key
        if key not in self._exported:
            failure = self._failures.get((key, "export"))
            if failure:
                raise SkipCase(failure)
            try:
                name = key if self.position_guard else f"{key}-unguarded"
                self._exported[key] = workload.export(self.folder / f"{name}.onnx", self.position_guard)
            except PosencError as exc:
                self._failures[(key, "export")] = f"export failed: {exc}"
                raise SkipCase(self._failures[(key, "export")]) from None
            self._graph_inputs[key] = _graph_input_names(self._exported[key])
        workload.mark_read_inputs(self._graph_inputs[key])
        return self._exported[key]

    def optimized(self, workload: Workload, target: str) -> Path:
        """The graph optimized by :mod:`posenc.graphs` for ``target`` (e.g. ``ort-cpu``)."""
        key = (workload.key, target)
        if key in self._failures:
            raise SkipCase(self._failures[key])
        if key not in self._optimized:
            source = self.exported(workload)
            from posenc.graphs import optimize_file
            from posenc.validate import check_ort_parity

            destination = self.folder / f"{workload.key}.{target}.onnx"
            try:
                result = optimize_file(source, destination, target, check=check_ort_parity)
            except PosencError as exc:
                self._failures[key] = f"optimization for {target} failed: {exc}"
                raise SkipCase(self._failures[key]) from None
            self.graph_notes[key] = result.record()
            self._optimized[key] = destination
        return self._optimized[key]

    def engine(self, workload: Workload) -> Path:
        """A TensorRT engine built by :mod:`posenc.engine` from the graph optimized for ``trt``
        (the exported graph when that optimization fails)."""
        key = (workload.key, "engine")
        if key in self._failures:
            raise SkipCase(self._failures[key])
        if key in self._optimized:
            return self._optimized[key]
        try:
            source = self.optimized(workload, "trt")
        except SkipCase:
            source = self.exported(workload)
        from posenc import engine

        destination = self.folder / f"{workload.key}.engine"
        try:
            engine.build_engine(source, destination)
        except PosencError as exc:  # BuildError, BackendUnavailable, ConfigError (targets)
            self._failures[key] = f"engine build failed: {exc}"
            raise SkipCase(self._failures[key]) from None
        self._optimized[key] = destination
        return destination

    def cached(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """``make()`` once per ``key`` among the last :data:`SESSION_CACHE_SIZE` keys (e.g. ORT sessions).

        Consecutive shapes of one graph reuse its session; older ones are released.
        """
        if key in self._cache:
            self._cache[key] = self._cache.pop(key)  # most recently used last
            return self._cache[key]
        while len(self._cache) >= SESSION_CACHE_SIZE:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = make()
        return self._cache[key]

    def on_close(self, callback: Callable[[], Any]) -> None:
        """Run ``callback`` when the store closes (e.g. release a GPU runner)."""
        self._closers.append(callback)

    def close(self) -> None:
        """Release runners and remove the folder if it is temporary."""
        for callback in reversed(self._closers):
            with contextlib.suppress(Exception):  # cleanup must not hide the run's own outcome
                callback()
        self._closers.clear()
        self._cache.clear()
        if self._temporary:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ModelStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _graph_input_names(path: Path) -> list[str]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return [value.name for value in model.graph.input]
