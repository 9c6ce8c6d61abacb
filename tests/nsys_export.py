"""Nsight Systems SQLite exports written event by event, for tests: the tables and columns
``nsys export --type sqlite`` writes (the subset lmprof reads, with nsys's names and types)."""
from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, registersPerThread INTEGER NOT NULL,
  gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL,
  blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL,
  dynamicSharedMemory INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  value INTEGER NOT NULL, bytes INTEGER NOT NULL, memKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
  globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
  domainId INTEGER);
CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT);
"""
PID, TID = 4242, 4243


def gtid(pid: int = PID, tid: int = TID) -> int:
    """nsys's serialized globalTid: the process id in bits 24..47, the thread id below."""
    return (1 << 56) | (pid << 24) | tid


class Export:
    """Rows added one by one; :meth:`write` makes the file. Times in nanoseconds."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {}
        self.rows: dict[str, list[tuple]] = {}
        self.corr = 0

    def sid(self, s: str) -> int:
        return self.strings.setdefault(s, len(self.strings) + 100)

    def _add(self, table: str, row: tuple) -> None:
        self.rows.setdefault(table, []).append(row)

    def launch(self, name: str, at: int, dur: int, call: str = "cudaLaunchKernel_v7000", pid: int = PID,
               tid: int = TID, device: int = 0, stream: int = 7) -> int:
        """A runtime call at ``at`` (2 us) and the kernel it launched (``dur`` ns from ``at`` + 3 us);
        returns the end of the call."""
        self.corr += 1
        self.runtime(call, at, at + 2_000, self.corr, pid, tid)
        start, end = at + 3_000, at + 3_000 + dur
        self._add("CUPTI_ACTIVITY_KIND_KERNEL", (start, end, device, 1, stream, self.corr, gtid(pid, 0), self.sid(name),
                                                 self.sid(name.split("<")[0]), 32, 1, 1, 1, 128, 1, 1, 0, 0))
        return at + 2_000

    def runtime(self, name: str, start: int, end: int, corr: int = -1, pid: int = PID, tid: int = TID,
                driver: bool = False) -> None:
        self._add("CUPTI_ACTIVITY_KIND_RUNTIME",
                  (start, end, 1 if driver else 0, gtid(pid, tid), corr if corr >= 0 else None, self.sid(name), 0))

    def memcpy(self, start: int, end: int, nbytes: int, kind: int = 1, pid: int = PID, tid: int = TID) -> None:
        self.corr += 1
        self.runtime("cudaMemcpyAsync_v3020", start - 3_000, start - 1_000, self.corr, pid, tid)
        self._add("CUPTI_ACTIVITY_KIND_MEMCPY", (start, end, 0, 1, 7, self.corr, gtid(pid, 0), nbytes, kind, 1, 2))

    def nvtx(self, text: str, start: int, end: int | None, pid: int = PID, tid: int = TID) -> None:
        self._add("NVTX_EVENTS", (start, end, 59, None, None, None, text, gtid(pid, tid), None, None, 0))

    def write(self, path: Path, gpu: str | None = "NVIDIA H100 80GB HBM3") -> Path:
        con = sqlite3.connect(path)
        con.executescript(SCHEMA)
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in self.strings.items()])
        for table, rows in self.rows.items():
            con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
        if gpu:
            con.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, ?)", (gpu,))
        con.commit()
        con.close()
        return path
