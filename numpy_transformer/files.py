"""Reading and writing the files the commands are given and the files a run writes.

Reading: :func:`read_file` is the one reader of a file a command is given (``--text``,
``--config``, a run's log) and :func:`check_file` the one check of every other (a checkpoint,
a safetensors file), with one rule for what goes wrong:

* the wrong kind of thing -- missing, a folder, a named pipe, a device or a socket where a
  file belongs (refused from its metadata, never opened: a FIFO would block), larger than
  the reader takes, binary or not UTF-8 where text belongs -- is a ``ValueError`` naming the
  file and what it is (the command line's exit 2);
* a file that cannot be read or written (permission denied, an I/O error, a read-only
  folder, a full disk) is the ``OSError`` naming the file and the system's reason (exit 74).

Writing: a crash or a kill at any moment leaves the old file or the new one, never half of
one (checkpoints, the run folder's config, log, plots and sample). The data goes to a
temporary name in the same folder, is flushed and fsync'ed, renamed over the old file with
``os.replace`` (atomic on POSIX and Windows), and the folder is fsync'ed so the rename itself
survives a power loss.

The standard library only: the command line reads its ``--config`` file before NumPy loads.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

TMP_SUFFIX = ".tmp"  # of the temporary files of atomic writes

# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------

FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
              (stat.S_ISSOCK, "a socket"))


def kind_of(mode: int) -> str:
    """What an ``os.stat`` mode that is not a regular file's is, in words: "a folder"..."""
    return next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")


def check_file(path: str | Path, what: str = "file") -> os.stat_result:
    """Return the ``os.stat`` of ``path`` if it names a regular file, else raise ``ValueError``
    saying what is there instead (``what``: how the message calls the file expected).

    Only the metadata is read, so a named pipe or a device is refused without being opened
    (opening a FIFO would block until someone writes into it). An ``OSError`` other than a
    missing file (e.g. permission denied on a folder of the path) is raised as it is.
    """
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise ValueError(f"{path}: no such {what}") from None
    if stat.S_ISREG(info.st_mode):
        return info
    raise ValueError(f"{path} is {kind_of(info.st_mode)}, not a {what}")


def read_file(path: str | Path, what: str = "file", limit: int | None = None,
              text: bool = False) -> bytes | str:
    """The bytes of the regular file ``path``, or with ``text`` its UTF-8 text (a leading
    byte-order mark dropped).

    Parameters
    ----------
    path : path of the file
    what : str
        How a refusal calls the file ("TOML file", "text file").
    limit : int, optional
        The most bytes it may hold; at most ``limit + 1`` are read.
    text : bool
        Decode it: a NUL byte or bytes that are not UTF-8 are refused.

    Raises
    ------
    ValueError
        The wrong kind of thing, naming the file: missing, not a regular file (said which),
        larger than ``limit``, binary or not UTF-8 (the offset named).
    OSError
        It cannot be read (permission denied, an I/O error); its ``filename`` is ``path``.
    """
    path = Path(path)
    check_file(path, what)
    try:
        with open(path, "rb") as f:
            data = f.read() if limit is None else f.read(limit + 1)
    except OSError as e:
        raise os_error_naming(path, e) from None
    if limit is not None and len(data) > limit:
        raise ValueError(f"{path}: more than {limit:,} bytes, too large for a {what}")
    return _decode_text(path, data) if text else data


def _decode_text(path: str | Path, data: bytes) -> str:
    """``data``, the bytes of file ``path``, as UTF-8 text (a leading byte-order mark
    dropped); ``ValueError`` naming the file and the offset if they hold a NUL byte (a binary
    file) or are not UTF-8."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise ValueError(f"{path}: looks like a binary file (it contains a NUL byte at offset "
                         f"{nul}), expected UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid UTF-8 text (byte {data[e.start]:#04x} at offset "
                         f"{e.start})") from None


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

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


def os_error_naming(path: str | Path, e: OSError) -> OSError:
    """``e`` as the same kind of error about ``path`` (a failed read or write of an open file
    names no file)."""
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
        raise os_error_naming(path, e) from None
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
            raise os_error_naming(path, e) from None
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, whole."""
    atomic_write(Path(path), lambda f: f.write(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))
