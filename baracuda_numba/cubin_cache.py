"""The on-disk cubin cache: one file per kernel signature, safe to share between processes.

Host code only (no Numba, no CUDA): :mod:`baracuda_numba.launch` decides *what* goes in
(the linked cubin of a kernel and its entry name) and *under which key*; this module
decides how it is stored, found, validated and filled.

* **Where**: ``$BARACUDA_CACHE_DIR``, else ``$XDG_CACHE_HOME/baracuda_numba``, else
  ``~/.cache/baracuda_numba`` (:func:`cache_dir`).
* **Key** (:func:`entry_key`): everything that changes the binary or its validity: the
  kernel's source digest, name, signature and register cap, the compute capability, the
  package version, the numba-cuda version and the CUDA driver version. A change to any of
  them is a different file, never a stale load.
* **File** (:func:`encode` / :func:`decode`): a header (magic, entry-name length, payload
  length, SHA-256 of both) then the entry name and the cubin. A truncated or corrupt
  file fails the check and reads as missing; the entry is then compiled again and the file
  replaced.
* **Filling** (:func:`lookup_or_fill`): read without a lock; on a miss take the entry's
  ``fcntl.flock`` lock, read again (another process may have filled it meanwhile), and
  only then compile and write (a temporary file renamed into place, so a reader sees all or
  nothing). Eight ranks of one ``torchrun`` on an empty cache compile each kernel once.
* **Read-only** directory: entries are still read; a compile that cannot be written stays
  in memory for this process, with one ``RuntimeWarning`` per process.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import struct
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator

try:
    import fcntl
except ImportError:  # not POSIX: the atomic rename alone (a kernel may compile twice)
    fcntl = None  # type: ignore[assignment]

__all__ = ["cache_dir", "decode", "encode", "entry_key", "lookup_or_fill", "read_entry",
           "reset_warnings", "write_entry"]

#: First bytes of every entry; bump the digit when the layout below changes.
MAGIC = b"BARACUDA-CUBIN-1\n"
_HEADER = struct.Struct("<QQ32s")  # entry-name length, payload length, SHA-256
SUFFIX = ".cubin"

_warned: set[str] = set()
_warn_lock = threading.Lock()


def cache_dir() -> pathlib.Path | None:
    """The cache folder (created if it can be); None if it neither exists nor can be made
    (then every compile stays in memory)."""
    root = os.environ.get("BARACUDA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "baracuda_numba")
    path = pathlib.Path(root)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        if not path.is_dir():
            warn_once("unwritable", f"baracuda_numba: the kernel cache {path} cannot be "
                      f"created ({error}); kernels compile in memory for this process "
                      "only (set BARACUDA_CACHE_DIR to a writable folder)")
            return None
    return path


def entry_key(*, source_digest: str, name: str, signature: str, max_registers: int | None,
              cc: tuple[int, int], package_version: str, numba_cuda_version: str,
              driver_version: int) -> str:
    """The file stem of one kernel signature's entry (32 hex digits)."""
    text = "|".join([source_digest, name, signature, str(max_registers),
                     f"sm_{cc[0]}{cc[1]}", package_version, numba_cuda_version,
                     str(driver_version)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def encode(entry_name: bytes, payload: bytes) -> bytes:
    """The file contents for ``entry_name`` (the kernel's symbol) and its cubin."""
    digest = hashlib.sha256(entry_name + b"\0" + payload).digest()
    return MAGIC + _HEADER.pack(len(entry_name), len(payload), digest) + entry_name + payload


def decode(data: bytes) -> tuple[bytes, bytes] | None:
    """``(entry_name, payload)``, or None for anything but a complete, intact entry."""
    start = len(MAGIC) + _HEADER.size
    if len(data) < start or not data.startswith(MAGIC):
        return None
    name_length, payload_length, digest = _HEADER.unpack_from(data, len(MAGIC))
    if len(data) != start + name_length + payload_length or not name_length:
        return None
    name = data[start:start + name_length]
    payload = data[start + name_length:]
    if hashlib.sha256(name + b"\0" + payload).digest() != digest:
        return None
    return name, payload


def read_entry(path: pathlib.Path) -> tuple[bytes, bytes] | None:
    """The intact entry at ``path``, or None (missing, truncated, corrupt, unreadable)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return decode(data)


def write_entry(path: pathlib.Path, entry_name: bytes, payload: bytes) -> bool:
    """Write atomically (a temporary file in the same folder, renamed over ``path``).
    False, with one warning per process, where the folder cannot be written."""
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp",
                                             dir=path.parent)
        with os.fdopen(handle, "wb") as file:
            file.write(encode(entry_name, payload))
        os.replace(temporary, path)
        return True
    except OSError as error:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        warn_once("unwritable", f"baracuda_numba: cannot write to the kernel cache "
                  f"{path.parent} ({error}); new kernels compile in memory for this "
                  "process only (set BARACUDA_CACHE_DIR to a writable folder to keep them)")
        return False


@contextlib.contextmanager
def entry_lock(path: pathlib.Path) -> Iterator[None]:
    """Hold the entry's exclusive lock (``<key>.lock`` beside it) while filling it; no lock
    where none can be taken (read-only folder, no ``fcntl``): the rename still keeps every
    reader safe, and a kernel may then compile in two processes at once."""
    if fcntl is None:
        yield
        return
    try:
        handle = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock


def lookup_or_fill(path: pathlib.Path | None,
                   build: Callable[[], tuple[bytes, bytes] | None]
                   ) -> tuple[tuple[bytes, bytes] | None, bool]:
    """``(entry, built)``: the intact entry at ``path`` if there is one, else ``build()``'s
    ``(entry_name, payload)`` (None: nothing to store), written to ``path``. ``build``
    runs at most once per key across the processes sharing the folder (the re-check under
    the entry's lock). ``path`` None: just ``build()``."""
    if path is None:
        return build(), True
    found = read_entry(path)
    if found is not None:
        return found, False
    with entry_lock(path):
        found = read_entry(path)
        if found is not None:
            return found, False
        built = build()
        if built is not None:
            write_entry(path, *built)
        return built, True


def warn_once(topic: str, message: str) -> None:
    """``message`` as a ``RuntimeWarning`` the first time ``topic`` comes up in this
    process (a read-only cache warns once, not once per kernel)."""
    with _warn_lock:
        if topic in _warned:
            return
        _warned.add(topic)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def reset_warnings() -> None:
    """Forget which topics :func:`warn_once` warned about, so each warns again once (a
    test that expects a warning sees it whatever ran before)."""
    with _warn_lock:
        _warned.clear()
