import asyncio
import threading

from tests.stacks import describe_stacks


async def test_the_stacks_name_each_task_where_it_waits_and_each_thread() -> None:
    gate = asyncio.Event()

    async def waits_for_the_gate() -> None:
        await gate.wait()

    task = asyncio.create_task(waits_for_the_gate(), name="gatekeeper")
    await asyncio.sleep(0)
    released = threading.Event()
    thread = threading.Thread(target=released.wait, name="parked-thread", daemon=True)
    thread.start()
    try:
        stacks = describe_stacks()
    finally:
        gate.set()
        released.set()
        await task
        thread.join(5)
    # The whole chain the task awaits, down to the Event's wait, not only its outermost coroutine.
    assert "--- task gatekeeper" in stacks and "in test_the_stacks_name_each_task_where_it_waits_and_each_thread." \
        "<locals>.waits_for_the_gate" in stacks and "in Event.wait" in stacks
    assert "--- thread parked-thread" in stacks
    assert "--- thread MainThread" in stacks


def test_without_a_running_loop_it_gives_the_threads() -> None:
    stacks = describe_stacks()
    assert "--- task" not in stacks and "--- thread MainThread" in stacks
