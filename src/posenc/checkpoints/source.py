"""Reading a Hugging Face checkpoint lazily: its ``config.json`` and, one tensor at a time, its weights.

A checkpoint is a local folder (``config.json`` beside ``model.safetensors``, or sharded ``*.safetensors``
with ``model.safetensors.index.json``, or a legacy ``pytorch_model.bin`` / sharded ``pytorch_model-*.bin``
with ``pytorch_model.bin.index.json``), or an in-memory ``transformers`` model. Tensors are read by name
through ``safetensors.safe_open`` (or a memory-mapped ``torch.load(weights_only=True)`` for ``.bin`` files),
so exporting one layer reads that layer's bytes and not the model's. Nothing is ever downloaded.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from posenc.artifacts.paths import member, resolve
from posenc.checkpoints.quantized import QuantizedReader
from posenc.config.hf_json import check_config, read_json_object
from posenc.errors import ConfigError, ModelFileError

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"


def tensor_sha256(tensor: torch.Tensor) -> str:
    """Hex sha256 of a tensor's raw bytes in its stored dtype (row-major), for provenance records."""
    data = tensor.detach().contiguous().cpu().reshape(-1)
    return hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()


class CheckpointSource:
    """One checkpoint's config and lazily read tensors.

    Build it with :meth:`from_folder` (a local checkpoint folder) or :meth:`from_model` (an in-memory
    ``transformers`` model). Use it as a context manager, or call :meth:`close`, to release open files.

    Attributes:
        config: the parsed ``config.json`` (a dict).
        location: the folder, or ``"<in-memory ClassName>"``.
    """

    def __init__(self, config: Mapping[str, Any], location: str) -> None:
        self.config = dict(config)
        self.location = location
        self._files: dict[str, Path] = {}  # tensor name -> file holding it (folders)
        self._memory: dict[str, torch.Tensor] = {}  # tensor name -> tensor (in-memory models)
        self._open: dict[Path, Any] = {}
        self._checked: set[Path] = set()  # files checked when their first tensor was read
        self._stack = ExitStack()
        self.hf_model: Any = None
        """The in-memory transformers model this source was made from, if any."""
        self.weights_file: str | None = None
        """The weights file read, relative to the folder (``model.safetensors``, an index, ...); None in memory."""
        self.ignored_files: tuple[str, ...] = ()
        """Other weight files in the folder that transformers' precedence leaves unread (and so does posenc)."""
        self.quantized = QuantizedReader(self.config, location, self.stored, self.has)
        """Reads tensors through the config's quantization_config (refuses methods posenc cannot dequantize)."""

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def from_folder(cls, folder: str | os.PathLike[str]) -> CheckpointSource:
        """A local checkpoint folder; refuses hub ids, missing folders, configs without weights (a missing shard: when
        a tensor it holds is read).

        Raises:
            ConfigError: ``folder`` is not a local folder (e.g. a hub id), or its config.json is unusable.
            ModelFileError: no weights, or an unreadable index (a missing shard is refused when a tensor it holds is
                read).
        """
        if not str(folder).strip():
            raise ConfigError("the checkpoint folder path is empty; pass a downloaded checkpoint folder.")
        path = Path(folder)
        if not path.exists():
            hint = (
                f"{str(folder)!r} looks like a Hugging Face hub id; posenc never downloads: run "
                f"`hf download {folder} --local-dir DIR` (or `huggingface-cli download`) and pass DIR."
                if _looks_like_hub_id(str(folder))
                else f"checkpoint folder {path} does not exist; pass a downloaded checkpoint folder "
                f"(config.json + *.safetensors)."
            )
            raise ConfigError(hint)
        if not path.is_dir():
            raise ConfigError(
                f"{path} is a file, not a checkpoint folder; pass the folder that holds config.json and the "
                f"weights (*.safetensors or pytorch_model.bin)."
            )
        config = _read_config(path / "config.json")
        source = cls(config, str(path))
        source._files, source.weights_file, source.ignored_files = _weight_files(path, config)
        return source

    @classmethod
    def from_model(cls, model: Any) -> CheckpointSource:
        """An in-memory ``transformers`` model (``PreTrainedModel``): its config and state_dict."""
        config = getattr(model, "config", None)
        if config is None or not hasattr(config, "to_dict") or not hasattr(model, "state_dict"):
            raise ConfigError(
                f"expected a transformers PreTrainedModel (with .config and .state_dict()), got "
                f"{type(model).__name__}; pass the model or a checkpoint folder."
            )
        source = cls(check_config(config.to_dict()), f"<in-memory {type(model).__name__}>")
        source._memory = dict(model.state_dict())
        source.hf_model = model
        return source

    @classmethod
    def open(cls, model_or_folder: Any) -> CheckpointSource:
        """:meth:`from_model` for a transformers model, :meth:`from_folder` for a path."""
        if isinstance(model_or_folder, CheckpointSource):
            return model_or_folder
        if isinstance(model_or_folder, (str, os.PathLike)):
            return cls.from_folder(model_or_folder)
        return cls.from_model(model_or_folder)

    # -- tensors ---------------------------------------------------------------------------------

    def names(self) -> list[str]:
        """Every tensor name of the checkpoint (read from the index or file headers, not the data)."""
        return sorted(self._memory) if self._memory else sorted(self._files)

    def has(self, name: str) -> bool:
        return name in self._memory or name in self._files

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor ``name`` (on CPU): as stored, or dequantized to float32 where a quantized checkpoint stores it
        quantized (:mod:`posenc.checkpoints.quantized`).

        Raises:
            ModelFileError: as :meth:`stored`, or a weight stored quantized in a way posenc cannot read exactly.
        """
        return self.quantized.read(name)

    def stored(self, name: str) -> torch.Tensor:
        """The tensor ``name`` as stored (its dtype, on CPU); only its bytes are read.

        Raises:
            ModelFileError: no such tensor, its shard is missing, or its file cannot be read.
        """
        if name in self._memory:
            return self._memory[name].detach()
        if name not in self._files:
            raise ModelFileError(f"checkpoint {self.location} has no tensor {name!r}; is it the model you meant?")
        path = self._files[name]
        if path not in self._checked:
            self._check_shard(name, path)
            self._checked.add(path)
        try:
            if path.suffix == ".safetensors":
                return self._handle(path).get_tensor(name)
            return self._bin(path)[name]
        except (OSError, RuntimeError, ValueError, KeyError) as exc:  # safetensors raises SafetensorError(Exception)
            raise ModelFileError(f"cannot read tensor {name!r} from {path} ({exc}); the file may be corrupt.") from None
        except Exception as exc:
            raise ModelFileError(f"cannot read tensor {name!r} from {path} ({exc}); the file may be corrupt.") from None

    def file_of(self, name: str) -> str:
        """Where tensor ``name`` is stored: its file relative to the checkpoint folder (``<in-memory ...>`` for models
        in memory)."""
        path = self._files.get(name)
        if path is None:
            return self.location
        folder = Path(self.location)
        return path.relative_to(folder).as_posix() if path.is_relative_to(folder) else str(path)

    def _check_shard(self, name: str, path: Path) -> None:
        """Check the file holding ``name`` by the safe-path rule; a shard the index names but the folder lacks is
        refused here, when one of its tensors is needed (other missing shards do not matter).

        Raises:
            ModelFileError: the shard is missing (names it and the tensor), or leads out of the folder.
        """
        folder = Path(self.location)
        relative = path.relative_to(folder).as_posix() if path.is_relative_to(folder) else str(path)
        if not path.exists() and not path.is_symlink():
            raise ModelFileError(
                f"checkpoint {self.location}: tensor {name!r} is in shard {relative}, which is missing; download "
                f"that shard into the folder (only the shards holding the requested layer's tensors are read)."
            )
        _safe(folder, relative, f"shard {relative!r} of checkpoint {self.location}")

    def _handle(self, path: Path) -> Any:
        from safetensors import safe_open

        if path not in self._open:
            try:
                self._open[path] = self._stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            except Exception as exc:
                raise ModelFileError(f"cannot open {path} ({exc}); the file may be truncated or corrupt.") from None
        return self._open[path]

    def _bin(self, path: Path) -> Mapping[str, torch.Tensor]:
        if path not in self._open:
            try:  # mmap: tensors are paged in when read, so memory follows what is used
                self._open[path] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:
                raise ModelFileError(
                    f"cannot read {path} as a weights-only PyTorch checkpoint ({type(exc).__name__}); posenc "
                    f"never unpickles code. Convert it to safetensors or re-save it with save_pretrained."
                ) from None
        return self._open[path]

    def close(self) -> None:
        self._stack.close()
        self._open.clear()

    def __enter__(self) -> CheckpointSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


# --------------------------------------------------------------------------------------------------
# Folder layout
# --------------------------------------------------------------------------------------------------


def _looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "/", "~"))


def _safe(folder: Path, name: str, what: str) -> Path:
    """``folder / name`` by the safe-path rule (:func:`posenc.artifacts.paths.member`): inside the checkpoint folder,
    a regular file, no symlink out, except the links of a Hugging Face cache snapshot into its repository's
    ``blobs``."""
    return member(folder, name, what, allowed_roots=_hub_cache_blobs(folder))


def _hub_cache_blobs(folder: Path) -> tuple[Path, ...]:
    """``.../models--ORG--NAME/blobs`` when ``folder`` is a snapshot of the Hugging Face cache (whose files are
    symlinks into it), else nothing. Only that repository's own blob store counts: a ``blobs`` that is itself a
    symlink (to another folder) is not one, so links into it are refused like any link out of the folder.

    Raises:
        ModelFileError: the cache's ``blobs`` is a symlink (names where it leads).
    """
    snapshots = resolve(folder, "the checkpoint folder").parent
    repo = snapshots.parent
    if snapshots.name == "snapshots" and repo.name.startswith(("models--", "datasets--")):
        blobs = repo / "blobs"
        if blobs.is_symlink():
            raise ModelFileError(
                f"{folder} is a Hugging Face cache snapshot whose blob store {blobs} is a symlink (to "
                f"{resolve(blobs, 'the blob store')}); posenc reads only the repository's own blobs folder. "
                f"Refusing to read it; download the checkpoint again (hf download ... --local-dir DIR)."
            )
        return (blobs,)
    return ()


def _read_config(path: Path) -> dict[str, Any]:
    """The checkpoint's ``config.json``, read within bounds and checked (:mod:`posenc.config.hf_json`)."""
    if not path.exists() and not path.is_symlink():
        raise ConfigError(
            f"{path.parent} has no config.json; a checkpoint folder holds config.json beside its weights "
            f"(save_pretrained writes both)."
        )
    path = _safe(path.parent, path.name, "the checkpoint's config.json")
    data = read_json_object(path, "the checkpoint's config.json")
    check_config(data)
    return data


WEIGHT_FILES = ("model.safetensors", SAFETENSORS_INDEX, "pytorch_model.bin", BIN_INDEX)
"""A folder's weights, in the order transformers' ``from_pretrained`` takes them (``modeling_utils.
_get_resolved_checkpoint_files`` for a local folder: the config's ``transformers_weights`` if set, else the first of
these that is a file); the others beside it are not read."""


def _weight_files(folder: Path, config: Mapping[str, Any]) -> tuple[dict[str, Path], str, tuple[str, ...]]:
    """``(tensor name -> file, the weights file read, the other weight files present and not read)``, by
    transformers' precedence (:data:`WEIGHT_FILES`)."""
    explicit = config.get("transformers_weights")
    present = [name for name in WEIGHT_FILES if _is_file(folder / name)]
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit.endswith((".safetensors", ".safetensors.index.json")):
            raise ConfigError(
                f"config.json field transformers_weights is {explicit!r}; expected a .safetensors file or a "
                f".safetensors.index.json inside the folder (as transformers requires). Fix the config.json."
            )
        chosen = explicit
    elif present:
        chosen = present[0]
    else:
        raise ModelFileError(
            f"{folder} has config.json but no weights (model.safetensors, sharded *.safetensors with "
            f"{SAFETENSORS_INDEX}, or pytorch_model.bin); download the weights into the same folder."
        )
    others = tuple(name for name in present if name != chosen)
    path = _safe(folder, chosen, "the checkpoint's weights" if not chosen.endswith(".json") else "its shard index")
    if chosen.endswith(".json"):
        return _from_index(folder, path), chosen, others
    if chosen.endswith(".safetensors"):
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                return dict.fromkeys(handle.keys(), path), chosen, others
        except Exception as exc:
            raise ModelFileError(f"cannot open {path} ({exc}); the file may be truncated or corrupt.") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise ModelFileError(
            f"cannot read {path} as a weights-only PyTorch checkpoint ({type(exc).__name__}); posenc never "
            f"unpickles code. Convert it to safetensors or re-save it with save_pretrained."
        ) from None
    return dict.fromkeys(state, path), chosen, others


def _is_file(path: Path) -> bool:
    """``os.path.isfile`` as transformers asks it (a symlink loop or dangling link: a file here, so the safe-path
    check names it rather than transformers' precedence skipping it)."""
    return path.is_file() or path.is_symlink()


def _from_index(folder: Path, index: Path) -> dict[str, Path]:
    data = read_json_object(index, "the shard index", error=ModelFileError)
    try:
        weight_map = data["weight_map"]
        names = {str(name): str(file) for name, file in weight_map.items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ModelFileError(f"{index} is not a valid shard index ({exc!r}); re-download the checkpoint.") from None
    root = resolve(folder, "the checkpoint folder")
    for file in sorted(set(names.values())):
        target = resolve(folder / file, f"shard {file!r} named by {index.name}")
        outside = os.path.isabs(file) or not (target == root or root in target.parents)
        if outside and not any(r in target.parents for r in _hub_cache_blobs(folder)):
            raise ModelFileError(f"{index} names {file!r}, outside {folder}; refusing to read it.")
    # A missing shard is refused only when a tensor it holds is read (CheckpointSource.tensor): one layer needs
    # only the shards that hold that layer's tensors.
    shards = {
        file: _safe(folder, file, f"shard {file!r} named by {index.name}")
        if (folder / file).exists() or (folder / file).is_symlink()
        else folder / file
        for file in sorted(set(names.values()))
    }
    return {name: shards[file] for name, file in names.items()}


__all__ = ["CheckpointSource", "tensor_sha256"]
