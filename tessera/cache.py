"""The kernel cache: generated kernel files under a size cap, evicted least recently used first.

Every generated kernel is written to `$TESSERA_CACHE/kernels/` (default `~/.cache/tessera/kernels`)
under a content hash, because Triton names a kernel by its file and line. Tuning writes one file
per candidate kernel, so without a bound the folder grows with every model ever tuned.

- **Cap.** `TESSERA_CACHE_MAX_MB` (default 512, in MiB of disk; `0` means no cap). The cap is
  soft: a process sweeps when its running estimate (the total the last sweep recorded plus what
  it wrote since) passes the cap, after every `SWEEP_EVERY` files it writes, and at its first write
  when the last sweep is older than `SWEEP_AGE_S`. A sweep deletes the files used longest ago
  (by modification time; each load touches its file) until the folder is under `LOW_WATER` of the
  cap. One process sweeps at a time (an `flock`); the others skip.
- **Safe with concurrent processes.** The loader (`codegen/launch.py`) runs a kernel from the
  source it generated, held in memory, never from the file: a file evicted or cleared by another
  process, even between its write and the import, breaks nothing, and the next load writes it
  again. Eviction only deletes whole files by name; writers write a temporary file and rename it.
- Triton's own cache of compiled binaries (`~/.triton/cache`, `TRITON_CACHE_DIR`) is not capped
  here; `tessera cache info` reports it and `tessera cache clear --triton` empties it.
- The tuning database (`$TESSERA_CACHE/tuning.db`) is never touched: it holds measurements.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tessera.errors import TesseraError

DEFAULT_MAX_MB = 512
LOW_WATER = 0.8  # a sweep evicts down to this fraction of the cap, so the next one is not at once
SWEEP_EVERY = 1000  # files one process writes between sweeps, whatever its estimate says
SWEEP_AGE_S = 600.0  # a process's first write sweeps when the last sweep is older than this
STALE_TMP_S = 3600.0  # a temporary file this old belongs to a writer that died
_USAGE = ".usage"  # the total in bytes that the last sweep left; its mtime is when
_LOCK = ".lock"
_BLOCK = 4096


def cache_root() -> Path:
    """$TESSERA_CACHE, or ~/.cache/tessera."""
    return Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache" / "tessera"))


def kernel_dir(create: bool = True) -> Path:
    """Where generated kernel files live: $TESSERA_CACHE/kernels."""
    d = cache_root() / "kernels"
    if create:
        d.mkdir(parents=True, exist_ok=True)
    return d


def cap_bytes() -> int | None:
    """The cap from TESSERA_CACHE_MAX_MB in bytes (None: no cap). A bad value is the user's to fix."""
    text = os.environ.get("TESSERA_CACHE_MAX_MB", "").strip()
    if not text:
        return DEFAULT_MAX_MB << 20
    try:
        mb = float(text)
        if not mb >= 0 or mb == float("inf"):
            raise ValueError
    except ValueError:
        raise TesseraError(f"TESSERA_CACHE_MAX_MB={text!r} is not a size in MiB (a number >= 0; 0: no cap)") from None
    return None if mb == 0 else int(mb * (1 << 20))


def _disk_bytes(st: os.stat_result) -> int:
    blocks = getattr(st, "st_blocks", None)
    return blocks * 512 if blocks is not None else st.st_size


def _is_ours(name: str) -> bool:
    """Kernel files and writers' temporary files (`NAME.tmpPID`); nothing else in the folder."""
    return name.endswith(".py") or ".tmp" in name


@dataclass
class _Entry:
    path: str
    mtime: float
    nbytes: int
    tmp: bool


def _scan(d: Path) -> list[_Entry]:
    out = []
    try:
        it = os.scandir(d)
    except FileNotFoundError:
        return out
    with it:
        for e in it:
            if not _is_ours(e.name):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:  # deleted by another process meanwhile
                continue
            if e.is_file(follow_symlinks=False):
                out.append(_Entry(e.path, st.st_mtime, _disk_bytes(st), not e.name.endswith(".py")))
    return out


# What this process knows: the total the last sweep left (None: not read yet), and what it wrote since.
_state_lock = threading.Lock()
_known: int | None = None
_since_bytes = 0
_since_files = 0


def _reset_state(total: int | None) -> None:
    global _known, _since_bytes, _since_files
    _known, _since_bytes, _since_files = total, 0, 0


@contextlib.contextmanager
def _sweep_lock(d: Path) -> Iterator[bool]:
    """True if this process may sweep now; False while another one is sweeping."""
    try:
        fd = os.open(d / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def _read_usage(d: Path) -> tuple[int, float] | None:
    """(total bytes, when) the last sweep recorded, or None."""
    try:
        f = d / _USAGE
        return int(f.read_text().strip()), f.stat().st_mtime
    except (OSError, ValueError):
        return None


def _write_usage(d: Path, total: int) -> None:
    tmp = d / f"{_USAGE}.{os.getpid()}"
    with contextlib.suppress(OSError):
        tmp.write_text(str(total))
        tmp.replace(d / _USAGE)


def sweep(cap: int | None = None, directory: Path | None = None) -> tuple[int, int]:
    """Evict the least recently used kernel files while the folder is over the cap (down to
    `LOW_WATER` of it), and temporary files of dead writers. Returns (files removed, bytes freed)."""
    cap = cap_bytes() if cap is None else cap
    d = directory or kernel_dir()
    removed = freed = 0
    with _sweep_lock(d) as mine:
        if not mine:  # another process is sweeping: count on it
            with _state_lock:
                _reset_state(_known)
            return 0, 0
        entries = _scan(d)
        total = sum(e.nbytes for e in entries)
        now = time.time()
        keep = []
        for e in entries:
            if e.tmp and now - e.mtime > STALE_TMP_S:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
                removed, freed, total = removed + 1, freed + e.nbytes, total - e.nbytes
            elif not e.tmp:
                keep.append(e)
        if cap is not None and total > cap:
            target = int(cap * LOW_WATER)
            for e in sorted(keep, key=lambda e: e.mtime):
                if total <= target:
                    break
                with contextlib.suppress(FileNotFoundError):  # another process removed it: the same
                    os.unlink(e.path)
                removed, freed, total = removed + 1, freed + e.nbytes, total - e.nbytes
        _write_usage(d, total)
        with _state_lock:
            _reset_state(total)
    return removed, freed


def _note_write(nbytes: int) -> None:
    """After a new kernel file: sweep when this process's estimate passes the cap (see the module doc)."""
    global _known, _since_bytes, _since_files
    cap = cap_bytes()
    if cap is None:
        return
    d = kernel_dir()
    with _state_lock:
        if _known is None:
            usage = _read_usage(d)
            fresh = usage is not None and time.time() - usage[1] < SWEEP_AGE_S
            _known = usage[0] if fresh and usage is not None else None
        _since_bytes += -(-max(nbytes, 1) // _BLOCK) * _BLOCK
        _since_files += 1
        due = _known is None or _known + _since_bytes > cap or _since_files >= SWEEP_EVERY
    if due:
        sweep(cap, d)


def store(name: str, source: str, directory: Path | None = None) -> Path:
    """The path of `name` holding `source`: written if missing (atomically), else touched so that
    eviction sees it in use. Only the default cache folder is capped. Never raises for the disk:
    the caller runs the kernel from `source` whether or not the file could be written."""
    capped = directory is None
    d = directory or kernel_dir()
    path = d / name
    try:
        os.utime(path)  # in use: the newest for eviction
        return path
    except FileNotFoundError:
        pass  # new, or evicted since: (re)write it
    except OSError:
        return path
    tmp = path.with_name(f"{name}.tmp{os.getpid()}.{threading.get_ident()}")
    try:
        tmp.write_text(source)
        tmp.replace(path)  # a concurrent reader never sees half a file
    except OSError:  # a full or read-only disk, or a `cache clear` took the temporary file
        with contextlib.suppress(OSError):
            tmp.unlink()
        return path
    if capped:
        _note_write(len(source.encode()))
    return path


@dataclass
class Usage:
    directory: Path
    files: int
    nbytes: int
    cap: int | None


def usage(directory: Path | None = None) -> Usage:
    d = directory or kernel_dir(create=False)
    entries = _scan(d)
    return Usage(d, len(entries), sum(e.nbytes for e in entries), cap_bytes())


def clear(directory: Path | None = None) -> tuple[int, int]:
    """Delete every kernel file (a process running a kernel keeps it: kernels run from memory, and a
    missing file is written again). Returns (files removed, bytes freed)."""
    d = directory or kernel_dir(create=False)
    removed = freed = 0
    for e in _scan(d):
        try:
            os.unlink(e.path)
        except FileNotFoundError:
            continue
        removed, freed = removed + 1, freed + e.nbytes
    pycache = d / "__pycache__"  # bytecode an older tessera let Python write beside its kernels
    if pycache.is_dir():
        n, b = _tree_usage(pycache)
        shutil.rmtree(pycache, ignore_errors=True)
        removed, freed = removed + n, freed + b
    if d.is_dir():
        _write_usage(d, 0)
        with _state_lock:
            _reset_state(0)
    return removed, freed


def triton_cache_dir() -> Path:
    """Triton's cache of compiled kernels ($TRITON_CACHE_DIR, default ~/.triton/cache)."""
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except Exception:  # noqa: BLE001 - an older or a missing triton: its documented default
        home = os.environ.get("TRITON_HOME", str(Path.home()))
        return Path(os.environ.get("TRITON_CACHE_DIR", Path(home) / ".triton" / "cache"))


def _tree_usage(d: Path) -> tuple[int, int]:
    files = nbytes = 0
    for root, _, names in os.walk(d):
        for n in names:
            try:
                st = os.lstat(os.path.join(root, n))
            except OSError:
                continue
            files, nbytes = files + 1, nbytes + _disk_bytes(st)
    return files, nbytes


def triton_usage() -> tuple[Path, int, int]:
    d = triton_cache_dir()
    return (d, *_tree_usage(d))


def clear_triton() -> tuple[int, int]:
    """Empty Triton's cache folder (the folder itself stays). Triton writes its entries through
    temporary folders renamed into place, and compiles again what it does not find."""
    d = triton_cache_dir()
    files, nbytes = _tree_usage(d)
    if d.is_dir():
        for child in d.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    child.unlink()
    left, left_bytes = _tree_usage(d)
    return files - left, nbytes - left_bytes
