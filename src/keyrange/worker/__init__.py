"""One worker process: fetch -> dedup -> per-client serial execution -> transactional commit."""

from keyrange.worker.engine import Worker
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.stats import WorkerStats

__all__ = ["Worker", "WorkerSettings", "WorkerStats"]
