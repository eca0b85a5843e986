"""The fixed-latency server is the ruler: it must never answer before its deadlines, and the
transport's arrival stamps must never come before the bytes did, whatever the scheduler does."""

from __future__ import annotations

import asyncio
import select
import socket

from benchmarks.loadgen.testserver import sleep_until
from benchmarks.loadgen.transport import (
    CLOCK,
    enable_rx_stamps,
    new_event_loop_factory,
    recv_stamped,
)


def test_sleep_until_never_wakes_before_the_deadline():
    # uvloop's millisecond timers end a plain asyncio.sleep early most of the time.
    async def early_wakes() -> list[float]:
        early = []
        for k in range(40):
            deadline = CLOCK() + 0.001 + (k % 7) * 0.0007
            await sleep_until(deadline)
            if CLOCK() < deadline:
                early.append(deadline - CLOCK())
        return early

    with asyncio.Runner(loop_factory=new_event_loop_factory()) as runner:
        assert runner.run(early_wakes()) == []


def test_a_read_is_stamped_between_its_send_and_its_read():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        left = socket.create_connection(listener.getsockname())
        right, _ = listener.accept()
    with left, right:
        enable_rx_stamps(right)
        before = CLOCK()
        left.sendall(b"x" * 100)
        assert select.select([right], [], [], 10)[0]
        size, stamp = recv_stamped(right, [memoryview(bytearray(4096))])
        assert size == 100
        assert before <= stamp <= CLOCK()
