"""Files at the boundary: bounded reads of what users give, atomic writes of what simdist produces.

Every file simdist reads goes through `read_text` (regular files, FIFOs such as ``<(...)`` and devices, never
more than `simdist.limits.INPUT_BYTES`; opening never blocks); every file it writes goes through
`write_files` / `write_text` (or `open_append` for the search's results log). A write is atomic: each
target is rendered by the caller in memory, written to a hidden temporary file in the target's folder,
flushed to disk, and renamed over the target (POSIX rename(2) replaces atomically), so a reader sees the
old file or the new one, never half of one. Several targets are checked first, all written to temporary
files, and only then renamed: if any fails, none is written, no temporary file stays behind and folders
created for them are removed again. Missing parent folders are created. New files get the mode an
ordinary ``open()`` would give them (0666 less the umask), whatever the temporary file had.

Problems are one line naming the target and the reason (`OutputError` for writes, `SpecError` for reads):
a folder where a file should be, a target that exists as a FIFO or device, a read-only folder, a parent
path that is a file, a full disk.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from simdist.errors import OutputError, SpecError, note
from simdist.limits import INPUT_BYTES, Limit

__all__ = ["check_target", "json_text", "open_append", "os_fix", "os_reason", "read_bytes", "read_text", "sigint_held",
           "write_files", "write_text"]

_KINDS = ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


_REASONS = {errno.EACCES: "permission denied", errno.EPERM: "permission denied", errno.EROFS: "read-only file system",
            errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
            errno.ENAMETOOLONG: "the name is too long", errno.ENOTDIR: "a parent is not a folder",
            errno.EISDIR: "it is a folder", errno.ELOOP: "too many symbolic links",
            errno.EFBIG: "larger than this process may write (the file size limit, ulimit -f)",
            errno.EMFILE: "too many open files (the limit on open files, ulimit -n)",
            errno.ENFILE: "too many open files on this machine", errno.EIO: "input/output error"}
_FIXES = {errno.ENOSPC: "free space or give a path on another disk", errno.EDQUOT: "free space or give another path",
          errno.EFBIG: "raise the file size limit (ulimit -f unlimited)",
          errno.EMFILE: "raise the limit on open files (ulimit -n 1024) or use fewer --workers",
          errno.ENFILE: "close other programs' files or use fewer --workers"}


def os_reason(err: OSError) -> str:
    """Why an operating-system call failed, as a reader says it (``no space left on the device``)."""
    return _REASONS.get(err.errno or 0, (err.strerror or type(err).__name__).lower())


def os_fix(err: OSError, default: str) -> str:
    """What to do about ``err`` where the reason decides it (a full disk, a limit of ``ulimit``), else ``default``."""
    return _FIXES.get(err.errno or 0, default)


# --------------------------------------------------------------------------- reading
def read_bytes(path: str | Path, *, field: str | None = None, limit: Limit = INPUT_BYTES) -> bytes:
    """The bytes of an input file, at most ``limit`` of them; any problem is one `SpecError`."""
    p = Path(path)
    fix = "give the path of a readable file"
    if "\0" in str(p):
        raise SpecError(f"cannot read {str(p)!r}: the name holds a NUL byte", field=field, fix=fix)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise SpecError(f"file not found: {p}", field=field, fix="check the path") from None
    except OSError as err:
        raise SpecError(f"cannot read {p}: {os_reason(err)}", field=field, fix=os_fix(err, fix)) from None
    if stat.S_ISDIR(mode) or stat.S_ISSOCK(mode):
        raise SpecError(f"cannot read {p}: it is {_kind(mode)}, not a file", field=field, fix=fix)
    try:
        # O_NONBLOCK: opening a FIFO nobody writes to returns at once instead of waiting for a writer.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise SpecError(f"cannot read {p}: {os_reason(err)}", field=field, fix=os_fix(err, fix)) from None
    try:
        os.set_blocking(fd, True)  # a FIFO with a writer: wait for its data; without one, read returns EOF
        chunks: list[bytes] = []
        size = 0
        while size <= limit.value:
            chunk = os.read(fd, min(1 << 20, int(limit.value) + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise SpecError(f"cannot read {p}: {os_reason(err)}", field=field, fix=os_fix(err, fix)) from None
    finally:
        os.close(fd)
    if size > limit.value:
        raise SpecError(f"{p} is larger than {limit.text()}, the limit for an input file ({limit.reason})",
                        field=field, fix="give a smaller file")
    return b"".join(chunks)


def read_text(path: str | Path, *, field: str | None = None, limit: Limit = INPUT_BYTES,
              errors: str = "strict") -> str:
    """An input file as UTF-8 text (``errors="replace"`` for logs); bytes that are not UTF-8 are one error
    naming the line."""
    data = read_bytes(path, field=field, limit=limit)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise SpecError(f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x})", field=field,
                        fix="give a text file saved as UTF-8") from None


# --------------------------------------------------------------------------- writing
HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""The signals a block of renames holds back (`sigint_held`): Ctrl-C, a kill, a closed terminal."""


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """Hold SIGINT (and SIGTERM, SIGHUP: `HELD_SIGNALS`) back until the block is done, then act on each as the
    handler before would have (the default: KeyboardInterrupt for SIGINT, the signal's own action for the others).

    The Python-level handler is swapped (masking the signal would not do: the kernel may hand a process-directed
    signal to another thread, whose C handler still trips the main thread's KeyboardInterrupt). Outside the main
    thread (where handlers cannot be set) the block runs as is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    olds = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in HELD_SIGNALS}
    try:
        yield
    finally:
        for s, old in olds.items():
            signal.signal(s, old)
    for signum in dict.fromkeys(pending):
        old = olds[signum]
        if old is signal.SIG_IGN or old is None:
            continue
        if callable(old):
            old(signum, None)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            os.kill(os.getpid(), signum)  # the default action, now that the block is done


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_target(path: str | Path, *, field: str | None = None) -> Path:
    """Check, without creating anything, that ``path`` could be written; return it. Run it before long work so
    that an unwritable ``--html`` is refused at once, not after the computation."""
    target = Path(path)
    if "\0" in str(target):
        raise OutputError(f"cannot write {str(target)!r}: the name holds a NUL byte", field=field,
                          fix="give a plain file name")
    if not target.name or target.name in (".", ".."):
        raise OutputError(f"cannot write {str(target)!r}: it names a folder, not a file", field=field,
                          fix="give a file name, e.g. report.html")
    try:
        st: os.stat_result | None = os.lstat(target)  # a symbolic link is replaced itself, never followed
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as err:
        raise OutputError(f"cannot write {target}: {os_reason(err)}", field=field, fix="give a writable path") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write {target}: it is a folder", field=field,
                          fix="give the path of a file (in that folder or elsewhere)")
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
        raise OutputError(f"cannot write {target}: it exists as {_kind(st.st_mode)}", field=field,
                          fix="remove it or give another file name")
    # the nearest existing ancestor must be a writable folder
    parent = target.parent
    pst: os.stat_result | None = None
    while pst is None:
        try:
            pst = os.stat(parent)
        except (FileNotFoundError, NotADirectoryError):
            if parent == parent.parent:
                raise OutputError(f"cannot write {target}: no existing folder above it", field=field,
                                  fix="give a path in an existing folder") from None
            parent = parent.parent
        except OSError as err:
            raise OutputError(f"cannot write {target}: {parent}: {os_reason(err)}", field=field,
                              fix="give a writable path") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise OutputError(f"cannot write {target}: {parent} is {_kind(pst.st_mode)}, not a folder", field=field,
                          fix="give a path whose parents are folders")
    if not os.access(parent, os.W_OK | os.X_OK):
        missing = "" if parent == target.parent else f" (to create {target.parent} in it)"
        raise OutputError(f"cannot write {target}: folder {parent} is not writable{missing}", field=field,
                          fix="give a path in a writable folder")
    return target


def _make_parents(folder: Path, created: list[Path], target: Path, field: str | None) -> None:
    missing: list[Path] = []
    p = folder
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        except OSError as err:
            raise OutputError(f"cannot write {target}: cannot create folder {d}: {os_reason(err)}", field=field,
                              fix="create the folder or give another path") from None
        created.append(d)


def _cleanup(temps: list[str], created: list[Path]) -> None:
    for tmp in temps:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    for d in reversed(created):
        with contextlib.suppress(OSError):
            d.rmdir()


def write_files(files: Mapping[str | Path, str | bytes], *, field: str | None = None,
                fields: Mapping[str | Path, str] | None = None) -> list[Path]:
    """Write every file of ``files`` (target -> content) or none of them; return the targets written.

    ``field`` names the option the targets came from (``--out``); ``fields`` per target where they differ.
    """
    targets = [(Path(t), content, (fields or {}).get(t, field)) for t, content in files.items()]
    for target, _, where in targets:
        check_target(target, field=where)
    mode = 0o666 & ~_umask()
    temps: list[str] = []
    created: list[Path] = []
    done: list[Path] = []
    try:
        staged: list[tuple[str, Path, str | None]] = []
        for target, content, where in targets:
            # Never through a symbolic link: a link planted where an output goes (report.json -> ~/.bashrc) is
            # replaced by the file itself, the file it pointed to untouched (and the user told).
            real = target
            if target.is_symlink():
                note(f"{target} was a symbolic link (to {os.readlink(target)}): replaced by the file itself, the "
                     "file it pointed to left unchanged")
            _make_parents(real.parent, created, target, where)
            data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
            try:
                fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
            except OSError as err:
                raise OutputError(f"cannot write {target}: {os_reason(err)}", field=where,
                                  fix=os_fix(err, "give a path in a writable folder")) from None
            temps.append(tmp)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.chmod(tmp, mode)
            except OSError as err:
                raise OutputError(f"cannot write {target}: {os_reason(err)}", field=where,
                                  fix=os_fix(err, "free space or give another path")) from None
            staged.append((tmp, real, where))
        with sigint_held():  # a Ctrl-C lands after the renames: all targets are replaced, or none
            for tmp, real, where in staged:
                try:
                    os.replace(tmp, real)
                except OSError as err:
                    raise OutputError(f"cannot write {real}: {os_reason(err)}", field=where,
                                      fix="give a writable path") from None
                temps.remove(tmp)
                done.append(real)
    except BaseException:
        _cleanup(temps, created if not done else [])
        raise
    return [t for t, _, _ in targets]


def write_text(path: str | Path, text: str | bytes, *, field: str | None = None) -> Path:
    """Write one file atomically (see `write_files`)."""
    return write_files({path: text}, field=field)[0]


def open_append(path: str | Path, *, field: str | None = None) -> TextIO:
    """Open a log (``simdist search --out``) to append lines to, creating it and its folders if missing."""
    target = check_target(path, field=field)
    created: list[Path] = []
    _make_parents(target.parent, created, target, field)
    try:
        return open(target, "a", encoding="utf-8")
    except OSError as err:
        _cleanup([], created)
        raise OutputError(f"cannot write {target}: {os_reason(err)}", field=field,
                          fix=os_fix(err, "give a writable file")) from None


# --------------------------------------------------------------------------- strict JSON
def _non_finite_path(doc: object, path: str = "") -> str | None:
    if isinstance(doc, float) and not math.isfinite(doc):
        return path or "(the document)"
    if isinstance(doc, dict):
        items = doc.items()
    elif isinstance(doc, (list, tuple)):
        items = enumerate(doc)
    else:
        return None
    for key, value in items:
        found = _non_finite_path(value, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}".lstrip("."))
        if found:
            return found
    return None


class JsonProblem(ValueError):
    """Why a JSON text could not be read (`loads_json`), with its line where the syntax is at fault."""

    def __init__(self, reason: str, lineno: int | None = None) -> None:
        super().__init__(reason if lineno is None else f"line {lineno}: {reason}")
        self.reason, self.lineno = reason, lineno


def loads_json(text: str) -> Any:
    """``json.loads(text)``, every way it can fail a `JsonProblem` (a ValueError) whose message says where in one
    line: bad syntax (its line), nesting past the interpreter's recursion limit, or an integer of more digits than
    Python converts (sys.get_int_max_str_digits(), 4,300 by default: a guard against quadratic-time conversion)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise JsonProblem(err.msg, err.lineno) from None
    except RecursionError:
        raise JsonProblem("nested too deep") from None
    except ValueError as err:  # int() past the digit limit
        raise JsonProblem(f"a number too long to read ({' '.join(str(err).split())[:120]})") from None


def json_text(doc: object, *, indent: int | None = 2, compact: bool = False) -> str:
    """``doc`` as strict JSON (RFC 8259: no NaN or Infinity), ending in a newline; a non-finite number is one
    error naming where it is (inputs are checked before they get that far, so this names a bug)."""
    try:
        text = json.dumps(doc, indent=None if compact else indent, allow_nan=False,
                          separators=(",", ":") if compact else None)
    except ValueError:
        where = _non_finite_path(doc) or "a value"
        raise OutputError(f"the result holds a non-finite number at {where}, which JSON cannot carry",
                          fix="check the inputs that lead to it (a zero or an overflow); please report it") from None
    return text if compact else text + "\n"
