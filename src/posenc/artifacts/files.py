"""File plumbing of exported artifacts: side-car names, hashes and atomic writes.

An artifact (a model with its manifest and weights, an engine with its manifest, a report) lands as a unit
through :func:`atomic_outputs`:

1. the writer takes an exclusive lock on each target folder (``flock`` on the folder itself: no lock file is
   left behind), so two writers of the same folder take turns instead of interleaving;
2. every file is written under a hidden staging name in its target's folder (``.NAME.posenc~TOKEN.tmp``);
3. for more than one file, a hidden journal (``.posenc~commit-TOKEN.json``) listing the renames lands in one
   atomic rename, then each staged file is renamed into place (side files first, the main file last), then the
   journal goes.

A process killed at any instant leaves the old complete artifact (killed before the journal landed) or a
journal from which the new complete artifact is finished (:func:`settle`, run by the next writer of the folder
and by every posenc reader before it reads). Staging and journals of dead writers are removed by the next run
(:func:`settle`): while a writer holds a folder's lock nobody else stages there, so what it finds is stale.
Files get ``0666 & ~umask`` (:func:`posenc.artifacts.paths.file_mode`), like files the shell creates. This protects against
killed processes and concurrent posenc writers, not against power loss (nothing is fsynced). A journal is signed
(HMAC with this user's key, :func:`_journal_key`) over its moves and each staged file's identity: one that
posenc did not write, or for other files, is never replayed.

:func:`check_apart` refuses, before any work, an output that would overwrite a command's input or its companions.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc.errors import ConfigError, ModelFileError
from posenc.artifacts.paths import file_mode, output_path, sha256_file

try:  # POSIX advisory locks; elsewhere writers are not serialized
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # no fcntl on this platform: locks are no-ops

MANIFEST_SUFFIX = ".manifest.json"
WEIGHTS_SUFFIX = ".weights.safetensors"
STAGING_MARK = ".posenc~"
"""In the name of every staged file (``.NAME.posenc~TOKEN.tmp``) and journal (``.posenc~commit-TOKEN.json``)."""
SCRATCH_PREFIX = "posenc-scratch-"
"""Scratch folders in the system temp folder: ``posenc-scratch-KIND-PID-TOKEN`` (see :func:`scratch_folder`)."""

__all__ = [
    "MANIFEST_SUFFIX",
    "WEIGHTS_SUFFIX",
    "artifact_files",
    "atomic_outputs",
    "check_apart",
    "json_text",
    "manifest_path_for",
    "new_scratch",
    "reading",
    "scratch_folder",
    "settle",
    "sha256_file",
    "weights_path_for",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]


def _stem(onnx_path: str | os.PathLike[str]) -> Path:
    path = Path(onnx_path)
    return path.with_suffix("") if path.suffix == ".onnx" else path


def manifest_path_for(onnx_path: str | os.PathLike[str]) -> Path:
    """``model.onnx`` -> ``model.manifest.json`` (same directory)."""
    stem = _stem(onnx_path)
    return stem.with_name(stem.name + MANIFEST_SUFFIX)


def weights_path_for(onnx_path: str | os.PathLike[str]) -> Path:
    """``model.onnx`` -> ``model.weights.safetensors`` (same directory)."""
    stem = _stem(onnx_path)
    return stem.with_name(stem.name + WEIGHTS_SUFFIX)


ENGINE_MANIFEST_SUFFIX = ".engine" + MANIFEST_SUFFIX
ArtifactKind = str
"""``"model"`` (an ONNX file with its manifest and weights), ``"engine"`` (an engine and its manifest) or ``"file"``
(a report, a JSON file: itself alone)."""


def artifact_files(path: str | os.PathLike[str], kind: ArtifactKind = "model") -> set[Path]:
    """Every file the artifact at ``path`` consists of, as absolute paths: a model's ONNX file, manifest and weights;
    an engine and its manifest; a ``"file"`` itself. A manifest or weights file given as a model (or an engine
    manifest as an engine) stands for its whole artifact."""
    path = Path(os.path.abspath(path))
    name = path.name
    if kind == "file":
        return {path}
    if kind == "engine" or name.endswith(ENGINE_MANIFEST_SUFFIX):
        engine = path.with_name(name.removesuffix(MANIFEST_SUFFIX)) if name.endswith(ENGINE_MANIFEST_SUFFIX) else path
        return {engine, engine.with_name(engine.name + MANIFEST_SUFFIX)}
    for suffix in (MANIFEST_SUFFIX, WEIGHTS_SUFFIX):
        if name.endswith(suffix):
            path = path.with_name(name.removesuffix(suffix) + ".onnx")
    return {path, manifest_path_for(path), weights_path_for(path)}


def check_apart(
    outputs: Sequence[tuple[str | os.PathLike[str] | None, ArtifactKind]],
    inputs: Sequence[tuple[str | os.PathLike[str] | None, ArtifactKind]],
) -> None:
    """Refuse, before any work, outputs that would overwrite an input or its companions (``build m.onnx -o
    m.onnx``, ``validate m.onnx --json-out m.manifest.json``), two outputs that share a file, and a model output
    whose manifest and weights would overwrite another model's (``export -o out/a`` beside ``out/a.onnx``).
    ``None`` entries (options not given) are skipped.

    Raises:
        ConfigError: naming the output, the file and whose it is.
    """
    owners: dict[Path, str] = {}
    for path, kind in inputs:
        if path is not None:
            for file in artifact_files(path, kind):
                owners.setdefault(file, f"the input {path}")
    for path, kind in outputs:
        if path is None:
            continue
        files = artifact_files(path, kind)
        for file in sorted(files):
            if file in owners:
                raise ConfigError(
                    f"output {path} would overwrite {file.name}, part of {owners[file]}; choose another output path."
                )
        for file in files:
            owners[file] = f"the output {path}"
        stem = Path(path)
        if kind == "model" and stem.suffix != ".onnx" and stem.with_name(stem.name + ".onnx").exists():
            raise ConfigError(
                f"output {path} would share its manifest and weights with {stem.name}.onnx beside it; name the "
                f"output {stem.name}.onnx to replace that model, or choose another name."
            )


# --------------------------------------------------------------------------------------------------
# Folder locks, staging, journals
# --------------------------------------------------------------------------------------------------

_HELD: dict[tuple[int, Path], list[Any]] = {}  # (thread, folder) -> [fd, depth, shared]: locks held (re-entrant)
_HELD_GUARD = threading.Lock()


@contextlib.contextmanager
def _folder_lock(folder: Path, *, shared: bool = False) -> Iterator[bool]:
    """Hold a ``flock`` on ``folder``: exclusive for writers, ``shared`` for readers (re-entrant in one thread; a
    shared hold is upgraded when the same thread writes). Yields whether this is the outermost hold."""
    key = (threading.get_ident(), folder.resolve())
    with _HELD_GUARD:
        held = _HELD.get(key)
    if held is not None:
        if held[2] and not shared and fcntl is not None:
            fcntl.flock(held[0], fcntl.LOCK_EX)
            held[2] = False
        held[1] += 1
        try:
            yield False
        finally:
            held[1] -= 1
        return
    fd = os.open(key[1], os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        with _HELD_GUARD:
            _HELD[key] = [fd, 1, shared]
        try:
            yield True
        finally:
            with _HELD_GUARD:
                del _HELD[key]
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _is_staging(name: str) -> bool:
    return STAGING_MARK in name and (name.endswith(".tmp") or name.endswith(".json")) and name.startswith(".")


_PROCESS_KEY = secrets.token_bytes(32)


def _journal_key() -> bytes:
    """This user's secret for journals (``$POSENC_STATE_DIR``, else ``$XDG_STATE_HOME/posenc``, else
    ``~/.local/state/posenc``: ``journal.key``, 0600, made on first use). Where none can be kept, a key of this
    process: its journals are then finished by no other process (the old files stay, the staging is removed)."""
    base = os.environ.get("POSENC_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state"), "posenc"
    )
    path = Path(base) / "journal.key"
    try:
        with contextlib.suppress(FileExistsError):
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(secrets.token_bytes(32))
        key = path.read_bytes()
        if len(key) == 32 and path.stat().st_uid == os.getuid():
            return key
    except OSError:
        pass
    return _PROCESS_KEY


def _signature(folder: Path, moves: list[list[Any]]) -> str:
    """HMAC-SHA256, with this user's key, of the folder and the moves (each staged file's name and identity)."""
    payload = json.dumps([str(folder.resolve()), moves], sort_keys=True).encode("utf-8")
    return hmac.new(_journal_key(), payload, hashlib.sha256).hexdigest()


def _staged_identity(path: Path) -> list[int]:
    """Inode, size and change time of a staged file: another file put under its name (even on a reused inode, with
    the same size) has another change time, which no user can set."""
    stat = path.stat()
    return [stat.st_ino, stat.st_size, stat.st_ctime_ns]


def _finish_journals_and_clear_staging(folder: Path) -> None:
    """With ``folder``'s lock held: finish every journal left by a killed writer, then remove stale staging.

    A journal is replayed only if this user's posenc wrote it (its HMAC verifies with this user's key) and only for
    the staged files it was signed for (same inode, size and change time): a journal planted in a folder the user
    reads cannot move anything onto the user's files."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return
    for name in names:
        if not (name.startswith(f"{STAGING_MARK}commit-") and name.endswith(".json")):
            continue
        journal = folder / name
        try:
            record = json.loads(journal.read_text(encoding="utf-8"))
            moves = record["moves"]
            if not hmac.compare_digest(str(record["mac"]), _signature(folder, moves)):
                raise ValueError("a journal posenc did not write")
            for temp, final, *identity in moves:
                # only staged files of this folder onto plain names of this folder: a journal found in an
                # untrusted model's folder must not move anything else
                if not (_plain_name(temp) and _is_staging(temp) and _plain_name(final) and not _is_staging(final)):
                    continue
                if (folder / temp).exists() and _staged_identity(folder / temp) == identity:
                    os.replace(folder / temp, folder / final)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a journal that cannot be finished: its staging is removed below, the old files stay
        with contextlib.suppress(OSError):
            journal.unlink()
    for name in names:
        if _is_staging(name):
            with contextlib.suppress(OSError):
                (folder / name).unlink()


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and os.sep not in name


def settle(path: str | os.PathLike[str]) -> None:
    """Finish an interrupted write in ``path``'s folder (or in ``path`` itself, a folder) and remove stale staging.

    Readers call it (through :func:`reading`) before reading, so that a model whose writer was killed between its
    renames reads as the new complete artifact. Nothing happens when the folder has no journal or staging, or cannot
    be written.
    """
    folder = Path(path)
    if not folder.is_dir():
        folder = folder.parent
    try:
        if not any(_is_staging(name) for name in os.listdir(folder)):
            return
        with _folder_lock(folder) as outermost:
            if outermost:
                _finish_journals_and_clear_staging(folder)
    except OSError:
        return


@contextlib.contextmanager
def reading(path: str | os.PathLike[str]) -> Iterator[None]:
    """Read the artifact at ``path`` (a file, or a folder) consistently: an interrupted write in its folder is
    finished first (:func:`settle`), then a shared lock of the folder keeps writers out while the block reads
    (they hold an exclusive one from staging to the last rename). Folders that cannot be locked are read as is."""
    folder = Path(path)
    if not folder.is_dir():
        folder = folder.parent
    settle(folder)
    try:
        lock = _folder_lock(folder, shared=True)
        lock.__enter__()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def _token() -> str:
    return f"{os.getpid()}-{secrets.token_hex(4)}"


@contextlib.contextmanager
def atomic_outputs(*targets: str | os.PathLike[str]) -> Iterator[list[Path]]:
    """Give staging paths for ``targets``; move them all into place, as a unit, only if the block succeeds.

    See the module docstring for the protocol (folder lock, staging names, journal). If the block raises, every
    staged file is removed and no target is touched. Targets land last to first: list the main artifact first,
    so it appears only after its side files. Staged files may be replaced by the block (a writer that creates
    its own file); permissions are set after the block.

    Example::

        with atomic_outputs("model.onnx", "model.manifest.json") as (tmp_model, tmp_manifest):
            tmp_model.write_bytes(data)
            tmp_manifest.write_text(text)

    Raises:
        ConfigError: a target is an empty path, a folder, a device, a FIFO, or lies under a file.
        ModelFileError: a target's folder cannot be created or written.
    """
    finals = [output_path(t, "output") for t in targets]
    folders: list[Path] = []
    for final in finals:
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ModelFileError(f"cannot write {final} ({exc}); choose a writable output path.") from None
        if final.parent.resolve() not in [f.resolve() for f in folders]:
            folders.append(final.parent)
    with contextlib.ExitStack() as locks:
        try:
            for folder in sorted(folders, key=lambda f: str(f.resolve())):  # one order: no deadlock between writers
                if locks.enter_context(_folder_lock(folder)):
                    _finish_journals_and_clear_staging(folder)
        except OSError as exc:
            raise ModelFileError(f"cannot write in {folders[0]} ({exc}); choose a writable output path.") from None
        token = _token()
        temps = [final.parent / _staging_name(final.name, token) for final in finals]
        try:
            for temp in temps:
                try:
                    temp.touch(mode=0o600, exist_ok=False)
                except OSError as exc:
                    raise ModelFileError(
                        f"cannot write {temp.parent} ({exc}); choose a writable output path."
                    ) from None
            yield list(temps)
            mode = file_mode()
            for temp in temps:
                os.chmod(temp, mode)  # a writer may have re-created the file (safetensors writes 0600)
            _land(list(zip(temps, finals, strict=True)), token)
        finally:
            for temp in temps:
                with contextlib.suppress(FileNotFoundError):
                    temp.unlink()


NAME_MAX = 255
"""Bytes of one file name on Linux and macOS file systems."""


def _staging_name(final: str, token: str) -> str:
    """``.NAME.posenc~TOKEN.tmp``, with NAME shortened (and a hash of it kept) when the whole would pass the file
    system's name limit: a final name that fits must not fail for its staging name."""
    tail = f"{STAGING_MARK}{token}.tmp"
    name = f".{final}{tail}"
    if len(name.encode("utf-8")) <= NAME_MAX:
        return name
    digest = hashlib.sha256(final.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    keep = final.encode("utf-8", "surrogateescape")[: NAME_MAX - len(tail) - len(digest) - 3]
    return f".{keep.decode('utf-8', 'ignore')}~{digest}{tail}"


def _land(pairs: list[tuple[Path, Path]], token: str) -> None:
    """Rename staged files into place, side files first and the main file (first pair) last, through a journal."""
    order = list(reversed(pairs))
    journal = None
    if len(order) > 1:
        journal = order[-1][1].parent / f"{STAGING_MARK}commit-{token}.json"
        staged = journal.with_name(f"{journal.name}{STAGING_MARK}{token}.tmp")
        here = journal.parent.resolve()  # the journal names the moves within its folder
        moves = [
            [temp.name, final.name, *_staged_identity(temp)] for temp, final in order if final.parent.resolve() == here
        ]
        try:
            staged.write_text(json.dumps({"moves": moves, "mac": _signature(here, moves)}), encoding="utf-8")
            os.replace(staged, journal)
        except OSError as exc:
            with contextlib.suppress(OSError):
                staged.unlink()
            raise ModelFileError(f"cannot write in {journal.parent} ({exc}); choose a writable output path.") from None
    landed: list[Path] = []
    try:
        for temp, final in order:
            try:
                os.replace(temp, final)
            except OSError as exc:
                for side in landed:  # side files of a main file that did not land would describe another file
                    side.unlink(missing_ok=True)
                raise ModelFileError(f"cannot write {final} ({exc}); choose a writable file path.") from None
            landed.append(final)
    finally:
        if journal is not None:
            with contextlib.suppress(OSError):
                journal.unlink()


def new_scratch(kind: str) -> Path:
    """A new folder ``posenc-scratch-KIND-PID-TOKEN`` in the system temp folder (the caller removes it).

    Scratch folders of processes that no longer run (killed before they could clean up) are removed first.
    """
    base = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            if entry.name.startswith(SCRATCH_PREFIX) and not _alive(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{kind}-{os.getpid()}-", dir=base))


@contextlib.contextmanager
def scratch_folder(kind: str) -> Iterator[Path]:
    """:func:`new_scratch`, removed when the block ends."""
    folder = new_scratch(kind)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _alive(name: str) -> bool:
    """Whether the process whose id is in a scratch folder's name still runs (unknown: assume it does)."""
    try:
        pid = int(name.removeprefix(SCRATCH_PREFIX).split("-")[1])
    except (IndexError, ValueError):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    with atomic_outputs(path) as (temp,):
        temp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file and a rename."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def json_text(payload: Any) -> str:
    """The JSON form posenc writes: indented, keys sorted, newline-terminated."""
    return json.dumps(payload, indent=2, sort_keys=True) + "\n"


def write_json_atomic(path: str | os.PathLike[str], payload: Any) -> Path:
    """Write ``payload`` as JSON (:func:`json_text`) to ``path`` atomically."""
    return write_text_atomic(path, json_text(payload))
