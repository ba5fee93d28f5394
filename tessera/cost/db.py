"""The tuning database: measured kernel costs that survive interruption.

SQLite in WAL mode. Each measurement is committed the moment it is taken, so
a tuning run killed at any point (SIGKILL included) loses at most the
measurement in flight, and a rerun picks up where it stopped. Keys are the
device name, the software versions that change generated code (torch,
Triton, CUDA, tessera), the kernel's signature (its computation with tensor
names erased, so identical layers share a row) and the schedule. A failed
candidate (compile error, timeout, GPU fault) is stored with infinite cost
and the reason, so it is not retried either.

`export`/`import_` move results between machines as JSON lines.
"""
from __future__ import annotations

import datetime
import json
import math
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from tessera.errors import TesseraError

def default_db_path() -> Path:
    """$TESSERA_CACHE/tuning.db (default ~/.cache/tessera/tuning.db)."""
    from tessera.cache import cache_root

    return cache_root() / "tuning.db"


def software_versions() -> str:
    """The versions that change generated code or its speed: part of every key.

    Triton's version comes from its package metadata, not an import: importing Triton fixes, for
    the whole process, whether its standard library's jit functions (the reductions' combine
    functions) run in the interpreter, so an import here, before any CPU executable set
    TRITON_INTERPRET, broke that process's later interpreted kernels with "Cannot call
    @triton.jit'd outside of the scope of a kernel"."""
    from importlib.metadata import version

    import torch

    from tessera.codegen.kernels import CODEGEN_VERSION
    from tessera.codegen.launch import pdl_requested
    from tessera.cost.profiler import TIMING_VERSION
    from tessera.version import __version__

    pdl = " pdl" if pdl_requested() else ""  # candidates timed as PDL launches (codegen/launch.py)
    return (f"tessera {__version__} codegen {CODEGEN_VERSION} timing {TIMING_VERSION}{pdl}; torch {torch.__version__}; "
            f"triton {version('triton')}; cuda {torch.version.cuda}")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    device TEXT NOT NULL,
    versions TEXT NOT NULL,
    signature TEXT NOT NULL,
    schedule TEXT NOT NULL,
    seconds REAL,            -- NULL: the candidate failed (infinite cost)
    reason TEXT NOT NULL DEFAULT '',
    measured_at TEXT NOT NULL,
    PRIMARY KEY (device, versions, signature, schedule)
)
"""
# What the GEMM-chain model knows of a kernel (cost/chain_search.py, ChainFeatures), by signature: with
# the chain's measured schedules it refits the model (`TuningDB.chain_samples`).
_FEATURES = """
CREATE TABLE IF NOT EXISTS chain_features (
    signature TEXT PRIMARY KEY,
    features TEXT NOT NULL   -- JSON
)
"""


def _when_unlocked(step: Callable[[], object], wait_s: float = 60.0) -> None:
    """Run `step`, retrying while another process holds the database. Switching a new file to WAL
    takes an exclusive lock and SQLite answers "database is locked" at once, without its busy
    timeout, so two compiles that open one new database together need this (tests/test_tuning.py)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            step()
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@dataclass(frozen=True)
class Key:
    device: str
    versions: str
    signature: str
    schedule: str


@dataclass(frozen=True)
class Record:
    key: Key
    seconds: float  # math.inf when the candidate failed
    reason: str = ""


class TuningDB:
    """One SQLite file; safe to open from several processes (WAL, a busy timeout)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise TesseraError(f"{self.path}: a directory, not a tuning database; pass a file path with --db")
        if self.path.is_file() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as f:
                head = f.read(16)
            if head != b"SQLite format 3\x00":  # SQLite would take over a tiny file of someone else's
                raise TesseraError(f"{self.path}: not a tessera tuning database (an SQLite file); "
                                   "pass another path with --db")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit: every put is its own durable transaction.
        self.conn = sqlite3.connect(str(self.path), timeout=60.0, isolation_level=None)
        _when_unlocked(lambda: self.conn.execute("PRAGMA journal_mode=WAL"))
        self.conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL survives a killed process
        _when_unlocked(lambda: self.conn.execute(_SCHEMA))
        _when_unlocked(lambda: self.conn.execute(_FEATURES))

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "TuningDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, key: Key) -> Record | None:
        row = self.conn.execute(
            "SELECT seconds, reason FROM measurements WHERE device=? AND versions=? AND signature=? AND schedule=?",
            (key.device, key.versions, key.signature, key.schedule)).fetchone()
        if row is None:
            return None
        return Record(key, math.inf if row[0] is None else float(row[0]), row[1])

    def put(self, key: Key, seconds: float, reason: str = "") -> bool:
        """Record one measurement (committed on return); False if the key was there already.

        Two compiles sharing a database (two terminals, two CI shards) may measure the same
        kernel at once: the first row written stays, the later one is dropped, and each caller
        reads back what the database holds (`tune`), so both plans use the same number."""
        value = None if not math.isfinite(seconds) else float(seconds)
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        cur = self.conn.execute("INSERT INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                                (key.device, key.versions, key.signature, key.schedule, value, reason, now))
        return cur.rowcount == 1

    def best(self, device: str, versions: str, signature: str) -> Record | None:
        """The fastest measured schedule of a kernel (None if none was measured or all failed)."""
        row = self.conn.execute(
            "SELECT schedule, seconds, reason FROM measurements WHERE device=? AND versions=? AND signature=? "
            "AND seconds IS NOT NULL ORDER BY seconds LIMIT 1", (device, versions, signature)).fetchone()
        if row is None:
            return None
        return Record(Key(device, versions, signature, row[0]), float(row[1]), row[2])

    def timed(self, device: str, versions: str, signature: str) -> set[str]:
        """The schedules of a kernel that have a time (not those that failed): what another step
        of this or an earlier compile measured, which a tuner may read for free."""
        cur = self.conn.execute("SELECT schedule FROM measurements WHERE device=? AND versions=? AND signature=? "
                                "AND seconds IS NOT NULL", (device, versions, signature))
        return {row[0] for row in cur}

    def faulted(self, device: str, versions: str, prefix: str = "") -> set[str]:
        """Schedules (keys starting with `prefix`) that faulted the GPU for any kernel on `device`
        with these versions (`profiler._fail`'s reason)."""
        cur = self.conn.execute(
            "SELECT DISTINCT schedule FROM measurements WHERE device=? AND versions=? AND seconds IS NULL "
            "AND reason LIKE '%the GPU faulted%' AND schedule LIKE ?", (device, versions, prefix + "%"))
        return {row[0] for row in cur}

    def put_features(self, signature: str, features: dict[str, object]) -> None:
        """Record what the chain model knows of a kernel (kept if already there)."""
        self.conn.execute("INSERT OR IGNORE INTO chain_features VALUES (?, ?)", (signature, json.dumps(features)))

    def chain_samples(self, device: str) -> list[tuple[str, str, float, dict[str, object]]]:
        """Every chain schedule measured on `device` whose kernel has features:
        (signature, schedule, seconds, features)."""
        cur = self.conn.execute(
            "SELECT m.signature, m.schedule, m.seconds, f.features FROM measurements m JOIN chain_features f "
            "ON m.signature = f.signature WHERE m.device = ? AND m.seconds IS NOT NULL "
            "AND m.schedule LIKE 'chain-%' ORDER BY m.signature, m.schedule", (device,))
        return [(sig, sch, float(sec), json.loads(feat)) for sig, sch, sec, feat in cur]

    def __len__(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0])

    def rows(self) -> Iterator[dict[str, object]]:
        cur = self.conn.execute("SELECT device, versions, signature, schedule, seconds, reason, measured_at "
                                "FROM measurements ORDER BY device, versions, signature, schedule")
        for r in cur:
            yield dict(zip(("device", "versions", "signature", "schedule", "seconds", "reason", "measured_at"), r))

    def export(self, out: str | Path, append: bool = False) -> int:
        """Write every row as JSON lines (after what `out` holds, with append), then the chain
        features; returns the count of measurement rows."""
        n = 0
        with open(out, "a" if append else "w") as f:
            for row in self.rows():
                f.write(json.dumps(row) + "\n")
                n += 1
            # The chain model's features of measured chains travel too (`put_features`), so an
            # imported database refits the model the same way.
            for sig, feat in self.conn.execute("SELECT signature, features FROM chain_features ORDER BY signature"):
                f.write(json.dumps({"signature": sig, "chain_features": json.loads(feat)}) + "\n")
        return n

    def import_(self, src: str | Path) -> int:
        """Add the rows of an export; rows already present are kept. Returns how many were added."""
        added = 0
        self.conn.execute("BEGIN")  # one transaction: all rows or none
        try:
            with open(src) as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        r = json.loads(line)
                        if "chain_features" in r:
                            self.conn.execute("INSERT OR IGNORE INTO chain_features VALUES (?, ?)",
                                              (str(r["signature"]), json.dumps(dict(r["chain_features"]))))
                            continue
                        row = (str(r["device"]), str(r["versions"]), str(r["signature"]), str(r["schedule"]),
                               None if r["seconds"] is None else float(r["seconds"]), str(r.get("reason", "")),
                               str(r["measured_at"]))
                    except (ValueError, KeyError, TypeError) as e:
                        raise TesseraError(f"{src}, line {number}: not a tuning row written by tessera db export "
                                           f"({type(e).__name__}: {e}); nothing was imported") from None
                    added += self.conn.execute("INSERT OR IGNORE INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?)",
                                               row).rowcount
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return added
