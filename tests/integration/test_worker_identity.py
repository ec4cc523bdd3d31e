"""Two processes that both run one worker id: `keyrange run`'s worker 0 and a second `keyrange
worker --worker-id 0` started by hand (what a force-deleted pod still running beside its
replacement looks like). Before, they fenced each other's slot producers forever ("acquiring 0-3
again: their producer failed", dozens of times a minute), both running handler calls. Now the
older process stands down with an error saying why; the supervisor restarts its worker 0, which
is then the newest claim, and the hand-started one stands down, exits 2 and says why. Nothing is
lost or handled twice meanwhile."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from keyrange.loadgen import LoadShape
from keyrange.local.load import Phase
from tests.conftest import BrokerUnderTest
from tests.integration.supervised import check_everything, consumer_yaml, supervised, wait_for

REACQUIRED = "again: their producer failed"


@pytest.mark.slow
def test_a_second_process_with_the_same_worker_id_stands_down_with_a_clear_error(
        broker_engine: BrokerUnderTest, topic_name: str, tmp_path: Path) -> None:
    bootstrap = broker_engine.bootstrap
    path = tmp_path / "consumer.yaml"
    path.write_text(consumer_yaml("identity", topic_name, 4))
    shape = LoadShape(rate=300, clients=50, duplicate_ratio=0.05, ledger=True, seed=3)
    rogue_log = tmp_path / "rogue.log"
    rogue = None
    with supervised(path, bootstrap, tmp_path / "run", shape, [Phase(20, 300)], spare_workers=0) as run:
        try:
            wait_for(run.worker_holds_slots(0), 60, "worker 0 to hold its slots")
            run.load.start()
            time.sleep(2)  # the load flows through worker 0 first
            with rogue_log.open("wb") as out:
                rogue = subprocess.Popen(
                    [sys.executable, "-m", "keyrange.cli", "worker", "--spec-file", str(path), "--bootstrap",
                     bootstrap, "--worker-id", "0"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            # Within seconds one stands down for good: worker 0 of the supervisor, restarted, keeps it.
            code = rogue.wait(timeout=60)
            run.finish_load()
            check_everything(bootstrap, topic_name, f"{topic_name}-g", run.totals.sent)
        finally:
            if rogue is not None and rogue.poll() is None:
                rogue.kill()
    output = rogue_log.read_text(errors="replace")
    assert code == 2, output[-3000:]
    assert "keyrange worker: error: worker 0 of group" in output and "claimed by another process" in output, \
        output[-3000:]
    worker_output = run.fleet.worker_log(0).read_text(errors="replace")
    assert "claimed by another process" in worker_output  # the first to stand down was the older one
    reacquires = worker_output.count(REACQUIRED) + output.count(REACQUIRED)
    assert reacquires <= 2, f"{reacquires} re-acquires: the two processes kept fencing each other"
