"""Where the aggregates live, and how to read them back without Spark.

Layout under the output directory (a local path or any Hadoop/pyarrow URL such as `s3a://`):

    records/minute=<ms>/batch=<id>/   uuid of the deduplicated records (what deduplication checks
                                      against), kept for the retention period (`retention`)
    clients/version=<id>/             one Parquet table per micro-batch that changed it
    windows/version=<id>/
    workers/version=<id>/
    histograms/version=<id>/          per minute, how many records had each latency and handler
                                      time (what a window's percentiles are recomputed from)
    _latest.json                      the newest complete version of each table, and the newest
                                      `created` aggregated (the retention's high-water mark)

A micro-batch writes new versions and never edits old ones, so a replay after a crash (Spark
re-runs the last uncommitted batch id) rebuilds the very same version from the one before it.
Versions older than the previous one are deleted.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

TABLES = ("clients", "windows", "workers")
MANIFEST = "_latest.json"
RECORDS = "records"
HISTOGRAMS = "histograms"
_VERSION = re.compile(r"^version=(\d+)$")
_BATCH = re.compile(r"^batch=(\d+)$")
_MINUTE = re.compile(r"^minute=(-?\d+)$")


def normalize(path: str) -> str:
    """Absolute local paths stay paths; URLs (s3a://, hdfs://, file://) pass through."""
    return path if urlparse(path).scheme else os.path.abspath(path)


class HadoopStorage:
    """Directory listing, deletion and small files through Spark's Hadoop FileSystem, so the
    same code works for local disks and object stores."""

    def __init__(self, spark: Any, root: str) -> None:
        self._jvm = spark.sparkContext._jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()
        self.root = root.rstrip("/")

    def _path(self, relative: str) -> Any:
        path = self._jvm.org.apache.hadoop.fs.Path(f"{self.root}/{relative}")
        return path, path.getFileSystem(self._conf)

    def exists(self, relative: str) -> bool:
        """True if `root/relative` exists."""
        path, fs = self._path(relative)
        return bool(fs.exists(path))

    def versions(self, table: str) -> list[int]:
        """Complete versions of a table (those with Spark's _SUCCESS marker), oldest first."""
        path, fs = self._path(table)
        if not fs.exists(path):
            return []
        found = []
        for status in fs.listStatus(path):
            match = _VERSION.match(status.getPath().getName())
            if match and fs.exists(self._jvm.org.apache.hadoop.fs.Path(status.getPath(), "_SUCCESS")):
                found.append(int(match.group(1)))
        return sorted(found)

    def record_partitions(self, minutes: list[int]) -> list[tuple[int, str]]:
        """(batch id, directory) of every stored `records/minute=<ms>/batch=<id>` of `minutes`."""
        if not minutes:
            return []
        pattern, fs = self._path(f"{RECORDS}/minute={{" + ",".join(str(m) for m in minutes) + "}/batch=*")
        found = []
        for status in fs.globStatus(pattern) or []:
            match = _BATCH.match(status.getPath().getName())
            if match and status.isDirectory():
                found.append((int(match.group(1)), str(status.getPath().toString())))
        return sorted(found)

    def record_minutes(self) -> list[int]:
        """Every minute that has stored records, oldest first."""
        path, fs = self._path(RECORDS)
        if not fs.exists(path):
            return []
        found = []
        for status in fs.listStatus(path):
            match = _MINUTE.match(status.getPath().getName())
            if match and status.isDirectory():
                found.append(int(match.group(1)))
        return sorted(found)

    def delete(self, relative: str) -> None:
        """Delete `root/relative` recursively (no error if absent)."""
        path, fs = self._path(relative)
        fs.delete(path, True)

    def read_text(self, relative: str) -> str | None:
        """The content of a small file, or None if it does not exist."""
        path, fs = self._path(relative)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            reader = self._jvm.java.io.BufferedReader(self._jvm.java.io.InputStreamReader(stream, "UTF-8"))
            lines = []
            line = reader.readLine()
            while line is not None:
                lines.append(line)
                line = reader.readLine()
            return "\n".join(lines)
        finally:
            stream.close()

    def write_text(self, relative: str, text: str) -> None:
        """Write a small file, replacing it as a whole (write aside, then rename)."""
        tmp, fs = self._path(f"{relative}.tmp")
        out = fs.create(tmp, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        final, _ = self._path(relative)
        fs.delete(final, False)
        fs.rename(tmp, final)


def table_path(root: str, table: str, version: int) -> str:
    """The directory of one version of one table."""
    return f"{root.rstrip('/')}/{table}/version={version}"


@dataclass(frozen=True)
class Manifest:
    """`_latest.json`: the newest published batch, its table versions and high-water mark, and the
    same for the batch published before it (what a replay of the newest batch must start from)."""

    batch: int | None = None
    versions: dict[str, int] = field(default_factory=dict)
    high_water_ms: int | None = None
    """The newest `created` among the records aggregated up to and including `batch`."""
    previous_batch: int | None = None
    previous_high_water_ms: int | None = None

    @classmethod
    def read(cls, storage: HadoopStorage) -> Manifest:
        """The stored manifest, or an empty one before the first batch."""
        text = storage.read_text(MANIFEST)
        if not text:
            return cls()
        data = json.loads(text)
        previous = data.get("previous") or {}
        return cls(data.get("batch"), dict(data.get("versions", {})), data.get("highWaterMs"),
                   previous.get("batch"), previous.get("highWaterMs"))

    def high_water_before(self, batch_id: int) -> int | None:
        """The high-water mark as it was before `batch_id` ran (the same on a replay of it)."""
        if self.batch is not None and self.batch >= batch_id:
            return self.previous_high_water_ms
        return self.high_water_ms

    def publish(self, storage: HadoopStorage, batch_id: int, high_water_ms: int | None) -> None:
        """Point readers at `batch_id`'s table versions (written aside, then renamed)."""
        if self.batch is not None and self.batch >= batch_id:  # a replay: keep what came before it
            previous = {"batch": self.previous_batch, "highWaterMs": self.previous_high_water_ms}
        else:
            previous = {"batch": self.batch, "highWaterMs": self.high_water_ms}
        manifest = {
            "batch": batch_id,
            "versions": dict.fromkeys(TABLES, batch_id),
            "highWaterMs": high_water_ms,
            "previous": previous,
            "updatedAtMs": int(time.time() * 1000),
        }
        storage.write_text(MANIFEST, json.dumps(manifest, indent=2))


@dataclass(frozen=True)
class AggregateResults:
    """The newest complete aggregates, as plain Python rows (dicts), sorted for reading."""

    clients: list[dict[str, Any]]
    """client_id, events, first_seen_ms, last_seen_ms, ledger_value, last_partition, last_offset."""
    windows: list[dict[str, Any]]
    """window_start_ms, window_end_ms, events, latency_p50/p95/p99_ms, handler_p50/p95/p99_ms."""
    workers: list[dict[str, Any]]
    """worker, events, handler_ms_total, handler_ms_mean, first_finished_ms, last_finished_ms."""
    manifest: dict[str, Any] = field(default_factory=dict)
    """The `_latest.json` this was read from (batch id, totals, update time)."""


def read_results(output: str) -> AggregateResults:
    """Read the newest aggregates under `output` with pyarrow (no Spark, no JVM).

    Returns empty tables when the job has not written anything yet.
    """
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    root = normalize(output)
    fs, base = pafs.FileSystem.from_uri(root if urlparse(root).scheme else f"file://{root}")
    try:
        with fs.open_input_stream(f"{base}/{MANIFEST}") as stream:
            manifest = json.loads(stream.read().decode("utf-8"))
    except (FileNotFoundError, OSError):
        return AggregateResults([], [], [])
    tables: dict[str, list[dict[str, Any]]] = {}
    sort_keys = {"clients": "client_id", "windows": "window_start_ms", "workers": "worker"}
    for table in TABLES:
        version = manifest["versions"].get(table)
        if version is None:
            tables[table] = []
            continue
        rows = pq.read_table(f"{base}/{table}/version={version}", filesystem=fs).to_pylist()
        key = sort_keys[table]
        tables[table] = sorted(rows, key=lambda r: (r[key] is None, r[key]))
    return AggregateResults(tables["clients"], tables["windows"], tables["workers"], manifest)
