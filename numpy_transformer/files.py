"""Writing a file so that a crash or a kill at any moment leaves the old file or the new one,
never half of one: checkpoints, the run folder's config, log, plots and sample.

The data goes to a temporary name in the same folder, is flushed and fsync'ed, renamed over the
old file with ``os.replace`` (atomic on POSIX and Windows), and the folder is fsync'ed so the
rename itself survives a power loss.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TMP_SUFFIX = ".tmp"  # of the temporary files of atomic writes



def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX: the directory entry lives in the folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open a directory; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def temporary_names(path: str | Path) -> str:
    """The glob pattern of the temporary files :func:`atomic_write` makes beside ``path``:
    one a kill left behind can be removed once no process writes the folder."""
    return f".{Path(path).name}.*{TMP_SUFFIX}"


def _naming(path: Path, e: OSError) -> OSError:
    """``e`` as the same kind of error about ``path``."""
    return OSError(e.errno, e.strerror, str(path)) if e.errno else e


def atomic_write(path: Path, write) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it over ``path``.

    Raises
    ------
    OSError
        If the folder cannot be written (read-only, disk full, a file-size limit); its
        ``filename`` is ``path`` (not the temporary file's) and ``path`` is left as it was.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    except OSError as e:
        raise _naming(path, e) from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give it an ordinary file's mode
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):  # a write error has no file name; the temporary one is noise
            raise _naming(path, e) from None
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, whole."""
    atomic_write(Path(path), lambda f: f.write(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))
