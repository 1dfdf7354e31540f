"""What posenc accepts as a path: the checks every subcommand runs before it opens or writes anything.

Three rules, one function each:

- :func:`input_file`: a file posenc reads must exist and be a regular file (not a folder, a device, a FIFO that
  would block the read, or a socket), and not empty.
- :func:`output_path`: a file posenc writes must be a non-empty path that is not a folder, a device or a FIFO
  (``os.replace`` would put a regular file in place of a device), inside a folder that is a folder.
- :func:`member`: a file a model or manifest *names* (weights beside a manifest, ONNX external data, a
  checkpoint's shards) must stay inside that model's folder: a relative name without ``..`` escapes, no symlink
  that leads out of the folder, a regular file, and, when a sha256 was recorded, bytes that hash to it before
  they are read or copied.

Every refusal is a :class:`~posenc.errors.PosencError` whose message names the path, what is wrong and what to do.
Files posenc writes get ``0666 & ~umask`` (:func:`file_mode`), read from the process when written.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from posenc.errors import ConfigError, ModelFileError

__all__ = [
    "file_kind",
    "file_mode",
    "input_file",
    "input_folder",
    "member",
    "output_path",
    "resolve",
    "sha256_file",
    "umask",
]


def file_kind(mode: int) -> str:
    """``regular file``, ``folder``, ``FIFO``, ``character device``, ... for an ``st_mode``."""
    kinds = (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISDIR, "folder"),
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")


def _text(path: str | os.PathLike[str] | None, what: str, error: type[Exception]) -> Path:
    if path is None or not str(path).strip():
        raise error(f"{what}: the path is empty; give a file path.")
    if "\x00" in str(path):
        raise error(f"{what}: the path {str(path)!r} holds a NUL byte; give a plain file path.")
    return Path(path)


def _stat(path: Path, what: str, error: type[Exception], missing: str = "check the path") -> os.stat_result:
    try:
        return path.stat()
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist; {missing}.") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.strerror}); check the path and its permissions.") from None


def input_file(
    path: str | os.PathLike[str] | None,
    what: str = "input file",
    *,
    error: type[Exception] = ModelFileError,
    allow_empty: bool = False,
    missing: str = "check the path",
) -> Path:
    """``path`` as a :class:`Path` when it is an existing, non-empty regular file (symlinks followed).

    Checked with ``stat`` only: nothing is opened, so a FIFO does not block. ``missing`` is the remedy named when
    the file does not exist.

    Raises:
        ModelFileError (or ``error``): empty path, missing, a folder, a device, a FIFO, a socket, or an empty file.
    """
    checked = _text(path, what, error)
    info = _stat(checked, what, error, missing)
    if not stat.S_ISREG(info.st_mode):
        kind = file_kind(info.st_mode)
        hint = "give the file inside it" if kind == "folder" else "posenc reads regular files only"
        raise error(f"{what} {checked} is a {kind}, not a regular file; {hint}.")
    if info.st_size == 0 and not allow_empty:
        raise error(f"{what} {checked} is empty (0 bytes); it was truncated or never written. Re-create it.")
    return checked


def input_folder(
    path: str | os.PathLike[str] | None, what: str = "folder", *, error: type[Exception] = ConfigError
) -> Path:
    """``path`` when it is an existing folder.

    Raises:
        ConfigError (or ``error``): empty path, missing, or not a folder.
    """
    checked = _text(path, what, error)
    info = _stat(checked, what, error)
    if not stat.S_ISDIR(info.st_mode):
        raise error(f"{what} {checked} is a {file_kind(info.st_mode)}, not a folder; give a folder.")
    return checked


def output_path(path: str | os.PathLike[str] | None, what: str = "output", *, folder: bool = False) -> Path:
    """``path`` when posenc may write there: a new or regular file (``folder=True``: a new or existing folder).

    Nothing is created. The nearest existing ancestor must be a folder (``out/x.onnx`` under a file ``out`` is
    refused here rather than after the work).

    Raises:
        ConfigError: empty path; an existing folder where a file goes (or a file where a folder goes); a device,
            FIFO or socket; a parent that is not a folder.
    """
    checked = _text(path, what, ConfigError)
    try:
        info = checked.lstat() if not folder else checked.stat()
    except (FileNotFoundError, NotADirectoryError):  # a parent that is not a folder is reported below
        info = None
    except OSError as exc:
        raise ConfigError(f"{what} {checked} cannot be used ({exc.strerror}); choose another path.") from None
    if info is not None and stat.S_ISLNK(info.st_mode):
        try:
            info = checked.stat()
        except OSError:
            info = None  # a dangling link: replacing the link itself is what a write does
    if info is not None:
        if folder and not stat.S_ISDIR(info.st_mode):
            raise ConfigError(f"{what} {checked} is a {file_kind(info.st_mode)}; give a folder (new or existing).")
        if not folder and not stat.S_ISREG(info.st_mode):
            kind = file_kind(info.st_mode)
            hint = "give a file path inside it" if kind == "folder" else "posenc replaces regular files only"
            raise ConfigError(f"{what} {checked} is a {kind}; {hint}.")
    parent = checked.parent
    while True:
        try:
            parent_info = parent.stat()
        except (FileNotFoundError, NotADirectoryError):
            if parent == parent.parent:
                break
            parent = parent.parent
            continue
        except OSError as exc:
            raise ConfigError(f"{what} {checked}: its folder {parent} cannot be used ({exc.strerror}).") from None
        if not stat.S_ISDIR(parent_info.st_mode):
            raise ConfigError(
                f"{what} {checked}: {parent} is a {file_kind(parent_info.st_mode)}, not a folder; choose another path."
            )
        break
    return checked


def member(
    folder: str | os.PathLike[str],
    name: str,
    what: str,
    *,
    sha256: str | None = None,
    allowed_roots: tuple[Path, ...] = (),
) -> Path:
    """The file ``name`` inside ``folder``, checked by the safe-path rule (see the module docstring).

    Args:
        folder: the model's (or checkpoint's) folder.
        name: the relative name the model or manifest records.
        what: what the file is, for messages (e.g. ``"weights named by model.manifest.json"``).
        sha256: the recorded hex digest; the file's bytes must hash to it.
        allowed_roots: other folders symlinks may lead into (a Hugging Face cache snapshot links into its
            repository's ``blobs`` folder).

    Raises:
        ModelFileError: an absolute name or one that leads out of ``folder`` (``..``, a symlink), a missing or
            non-regular file, or bytes that do not hash to ``sha256``.
    """
    if not isinstance(name, str) or not name.strip() or "\x00" in name:
        raise ModelFileError(f"{what}: the name {name!r} is not a file name; re-create the model.")
    if os.path.isabs(name) or Path(name).drive:
        raise ModelFileError(
            f"{what} is the absolute path {name!r}; a model may only name files inside its own folder "
            f"{folder}. Refusing to read it; re-create the model."
        )
    root = resolve(folder, f"the folder of {what}")
    candidate = Path(folder) / name
    resolved = resolve(candidate, f"{what} {name!r}")
    roots = (root, *(resolve(r, f"the folder {r} that {what} may lead into") for r in allowed_roots))
    if not any(resolved == r or r in resolved.parents for r in roots):
        how = "through a symlink" if candidate.is_symlink() or resolved != candidate.absolute() else "with '..'"
        raise ModelFileError(
            f"{what} {name!r} leads out of the model's folder {folder} {how} (to {resolved}); a model may only "
            f"name files inside its folder. Refusing to read it; keep the file beside the model."
        )
    checked = input_file(candidate, what, allow_empty=True, missing="it is missing: keep it beside the model")
    if sha256 is not None:
        actual = sha256_file(checked)
        if actual != sha256:
            raise ModelFileError(
                f"{what} {checked} does not match the sha256 recorded for it ({actual[:12]}... != {sha256[:12]}...); "
                f"it was modified or replaced. Re-create the model, or restore the file."
            )
    return checked


def resolve(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` with every symlink followed (missing parts kept as named), refusing a symlink loop.

    Raises:
        ModelFileError: a symlink loop (or a chain too long to follow) on the way.
    """
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as exc:  # Python 3.11 raises RuntimeError("Symlink loop ..."), 3.13 OSError
        raise ModelFileError(
            f"{what} ({path}) is a symlink loop or leads through one ({exc}); replace the link with the file it "
            f"should name."
        ) from None


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def _umask_from_proc() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        return None
    return None


def umask() -> int:
    """The process's umask now (read without changing it where ``/proc`` tells it)."""
    found = _umask_from_proc()
    if found is not None:
        return found
    current = os.umask(0o022)
    os.umask(current)
    return current


def file_mode() -> int:
    """Permissions of a file posenc writes: ``0666 & ~umask`` (what ``open(..., "w")`` would give)."""
    return 0o666 & ~umask()
