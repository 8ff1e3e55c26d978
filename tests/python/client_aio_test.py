#!/usr/bin/python3
"""knnd-client's AsyncKnnClient (knnd_client/aio.py), installed in each
route's venv (client_testing.py):
  - against the fake server: the contract KnnClient keeps (client_test.py)
    plus its bound on calls in flight and the deadline of a call waiting
    for a slot (AsyncFakeServerTest);
  - against a live knnd (AsyncLiveKnndTest): async results equal sync
    ones; the event loop keeps ticking during async searches; cancelling
    the awaiting task makes knnd count the call CANCELLED; RESOURCE_EXHAUSTED
    from a full gate is retried after the pushback until every request
    succeeds; after a knnd restart on the same address the client answers
    within 2 s of knnd serving.

  client_aio_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl --source-dir . \
      --venvs BUILD/tests/python_client_venvs [unittest args]
"""
import asyncio
import time
import unittest

import numpy as np

import client_testing
from client_testing import (SEARCH_CANCELLED, SEARCH_OK, ClientContract,
                            LiveKnnd)
from knnd_harness import LoopThread, free_port

ARGS = None


class AsyncFakeServerTest(ClientContract, unittest.TestCase):
    """AsyncKnnClient against the fake server: the same contract, plus its
    bound on calls in flight."""

    def setUp(self):
        self.loop = LoopThread()
        self.addCleanup(self.loop.stop)  # runs after the clients' close

    def connect(self, address, **client_args):
        from knnd_client import AsyncKnnClient

        async def make():
            return AsyncKnnClient(address, **client_args)
        client = self.loop.run(make())
        self.addCleanup(lambda: self.loop.run(client.close()))
        self.client = client
        return lambda *args, **kwargs: self.loop.run(client.search(*args, **kwargs))

    def test_calls_in_flight_are_bounded(self):
        fake, _ = self.serve(("sleep", 0.2), max_concurrent_calls=3)

        async def nine():
            start = time.monotonic()
            results = await asyncio.gather(*(
                self.client.search(np.ones((1, 4), np.float32), 2) for _ in range(9)))
            return len(results), time.monotonic() - start
        count, elapsed = self.loop.run(nine())
        self.assertEqual(count, 9)
        self.assertEqual(fake.max_active, 3)
        self.assertGreaterEqual(elapsed, 0.6 - 0.01)  # three rounds of 0.2 s

    def test_waiting_for_a_slot_counts_against_the_deadline(self):
        import grpc
        fake, _ = self.serve(("sleep", 1.0), max_concurrent_calls=1)
        client = self.client
        q = np.ones((1, 4), np.float32)

        async def main():
            first = asyncio.ensure_future(client.search(q, 2))
            await asyncio.sleep(0.1)
            start = time.monotonic()
            with self.assertRaises(grpc.RpcError) as err:
                await client.search(q, 2, timeout_s=0.2)
            self.assertEqual(err.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
            self.assertIn("max_concurrent_calls=1", err.exception.details())
            self.assertLess(time.monotonic() - start, 0.5)
            # A caller cancelled while it waits for a slot gives nothing
            # away: the slot goes to the next caller once the first ends.
            waiting = asyncio.ensure_future(client.search(q, 2))
            await asyncio.sleep(0.05)
            waiting.cancel()
            await first
            self.assertEqual(len(fake.calls), 1, "calls that waited were sent")
            fake.script[:] = [("ok",)]
            ids = (await client.search(q, 2, timeout_s=1)).ids
            self.assertEqual(ids.tolist(), [[0, 1]])
            self.assertTrue(waiting.cancelled())
        self.loop.run(main())



class AsyncLiveKnndTest(LiveKnnd):
    """AsyncKnnClient against knnd serving the test index."""

    def test_async_results_equal_sync(self):
        from knnd_client import AsyncKnnClient
        addr = self.start_knnd().address
        sync = self.client(f"dns:///{addr}")
        q = self.xb[:50] + 0.1
        calls = [((q, 10, nprobe), {}) for nprobe in (None, 1, 8)] + [
            ((q, 10, 8), {"refine_factor": 0}),
            ((q.astype(">f4"), 10, 8), {}),
            ((np.asfortranarray(q), 10, 8), {}),
            ((q[:4], 10, 64), {"allowed_ids": np.array([3, 30, 300])})]
        expected = [sync.search(*args, **kwargs) for args, kwargs in calls]

        async def main():
            async with AsyncKnnClient(f"dns:///{addr}") as client:
                # One at a time, as the sync calls were: concurrent requests
                # with equal (k, nprobe) are batched together by knnd,
                # which may change distances in the last bits.
                one_by_one = [await client.search(*args, **kwargs)
                              for args, kwargs in calls]
                together = await asyncio.gather(*(
                    client.search(*args, **kwargs) for args, kwargs in calls))
                return one_by_one, together, await client.info()
        one_by_one, together, info = asyncio.run(main())
        for got, got_together, want in zip(one_by_one, together, expected):
            ids, distances = got.ids, got.distances
            ids2, distances2 = got_together.ids, got_together.distances
            want_ids, want_distances = want.ids, want.distances
            np.testing.assert_array_equal(ids, want_ids)
            np.testing.assert_array_equal(distances, want_distances)
            self.assertEqual((ids.dtype, distances.dtype), (np.int64, np.float32))
            # (near-ties may swap when the distances move; a batch of 20 or
            # more rows takes FAISS's BLAS path for the coarse distances,
            # which rounds differently: seen 1.03e-4 relative)
            self.assertGreater((ids2 == want_ids).mean(), 0.98)
            np.testing.assert_allclose(np.sort(distances2, axis=1), want_distances,
                                       rtol=1e-3)
        self.assertEqual(info, sync.info())

    def test_event_loop_keeps_ticking_during_async_searches(self):
        from knnd_client import AsyncKnnClient, KnnClient
        addr = self.start_knnd(args=["--workers", "1"]).address
        q = self.xb[:1024]

        async def measure(work):
            """(seconds `work` took, the longest gap of a 5 ms ticker that
            ran beside it)."""
            gaps, done = [], asyncio.Event()

            async def tick():
                while not done.is_set():
                    start = time.monotonic()
                    await asyncio.sleep(0.005)
                    gaps.append(time.monotonic() - start)
            ticker = asyncio.ensure_future(tick())
            await asyncio.sleep(0.02)
            start = time.monotonic()
            await work()
            elapsed = time.monotonic() - start
            done.set()
            await ticker
            return elapsed, max(gaps)

        async def main():
            # 3 x 1024 rows in flight stay under knnd's 4096-row gate.
            async with AsyncKnnClient(addr, timeout_s=60,
                                      max_concurrent_calls=3) as client:
                await client.search(q[:1], 10)  # connected

                async def searches():
                    await asyncio.gather(*(client.search(q, 10, 64)
                                           for _ in range(6)))
                async_times = await measure(searches)
            with KnnClient(addr, timeout_s=60) as blocking:
                blocking.search(q[:1], 10)

                async def blocking_search():
                    blocking.search(q, 10, 64)
                blocking_times = await measure(blocking_search)
            return async_times, blocking_times
        (elapsed, gap), (blocking_elapsed, blocking_gap) = asyncio.run(main())
        print(f"\n  6 async searches: {elapsed:.3f} s, longest tick gap "
              f"{gap * 1000:.1f} ms; one blocking search: "
              f"{blocking_elapsed:.3f} s, gap {blocking_gap * 1000:.1f} ms",
              flush=True)
        # Enough work to show a stall: the searches outlast many of the
        # ticker's 5 ms intervals (relative, as below: an idle machine
        # does the same work in under 0.5 s, a loaded one in seconds).
        self.assertGreater(elapsed, 20 * 0.005, "too little work to show anything")
        # The ticker does see a blocked loop: the sync client stalls it for
        # the whole search. The async searches never stall it for more
        # than a fraction of one such search (relative bounds, so that a
        # loaded machine slows both sides alike), and well under 0.5 s.
        self.assertGreater(blocking_gap, blocking_elapsed * 0.8)
        self.assertLess(gap, blocking_elapsed / 3)
        self.assertLess(gap, elapsed / 6)
        self.assertLess(gap, 0.5)

    def test_cancelling_the_task_cancels_the_rpc(self):
        from knnd_client import AsyncKnnClient
        daemon = self.start_knnd(args=["--workers", "1"])
        # 4096 queries over every list at k=100: over a second of work.
        q = np.tile(self.xb[:1024], (4, 1)) + 0.03

        async def main():
            async with AsyncKnnClient(daemon.address, timeout_s=60,
                                      max_concurrent_calls=1) as client:
                await client.search(q[:1], 1)
                ok_before = daemon.scrape().get(SEARCH_OK, 0)
                task = asyncio.ensure_future(client.search(q, 100, 64))
                loop = asyncio.get_running_loop()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and (await loop.run_in_executor(
                        None, daemon.scrape)).get("knnd_queries_in_flight", 0) == 0:
                    await asyncio.sleep(0.01)
                self.assertFalse(task.done(), "the search ended before it could be cancelled")
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    values = await loop.run_in_executor(None, daemon.scrape)
                    if (values.get(SEARCH_CANCELLED, 0) >= 1
                            and values["knnd_queries_in_flight"] == 0):
                        break
                    await asyncio.sleep(0.05)
                # The client's one slot came back: the next call runs.
                ids = (await client.search(self.xb[:2], 5, timeout_s=10)).ids
                self.assertEqual(ids[:, 0].tolist(), [0, 1])
                return ok_before
        ok_before = asyncio.run(main())
        values = daemon.scrape()
        self.assertEqual(values.get(SEARCH_CANCELLED), 1,
                         sorted(k for k in values if "handled" in k))
        self.assertEqual(values["knnd_queries_in_flight"], 0)
        self.assertEqual(values.get(SEARCH_OK), ok_before + 1,
                         "the cancelled search was answered")


    def test_async_full_gate_is_retried_after_pushback_until_all_succeed(self):
        from knnd_client import AsyncKnnClient, RetryPolicy
        addr = self.start_small_gate()
        q = self.xb[:256]
        retries = self.record_retries()

        async def main():
            async with AsyncKnnClient(addr, timeout_s=60,
                                      retry=RetryPolicy(max_attempts=1000),
                                      max_concurrent_calls=8) as client:
                async def three():
                    return [(await client.search(q, 100, 64)).ids for _ in range(3)]
                return [ids for r in await asyncio.gather(*(three() for _ in range(8)))
                        for ids in r]
        results = asyncio.run(main())
        self.assert_flood_answered(results, retries)

    def test_a_restarted_knnd_is_found_within_a_second(self):
        from knnd_client import AsyncKnnClient
        loop = LoopThread()
        self.addCleanup(loop.stop)
        address = f"127.0.0.1:{free_port()}"

        async def make():
            return AsyncKnnClient(address)
        client = loop.run(make())
        self.addCleanup(lambda: loop.run(client.close()))
        self.assert_back_within(
            address,
            lambda: loop.run(client.search(self.xb[:1], 5, timeout_s=0.5)),
            2.0)


if __name__ == "__main__":
    client_testing.main(__doc__)
