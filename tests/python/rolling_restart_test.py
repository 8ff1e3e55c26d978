#!/usr/bin/python3
"""A rolling restart as knnd-client sees it: two knnd replicas on two
ports, 8 clients (round_robin over both addresses, the client's default
retries), each replica restarted in turn under load, three rounds; once
with KnnClient on threads, once with AsyncKnnClient on one event loop.

Asserted: no call failed; every call was answered by one replica or the
other (the replicas serve the same vectors under different ids); while a
replica was away the other answered calls, and the clients came back to
each restarted replica; every knnd exited 0 after SIGTERM.

knnd-client is built from clients/python with Debian's packages (no
download) into a temporary folder.

  rolling_restart_test.py --knnd BUILD/knnd --source-dir . [unittest args]
"""
import os
import tempfile
import unittest

import rolling
from knnd_harness import generate_stubs, install_client, unittest_main

ARGS = None
ROUNDS = 3
# Short delays keep the test to seconds; the sequence is the production one.
CONFIG = "shutdown_delay_ms: 300\ndrain_grace_period_ms: 10000\n"


class RollingRestartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="knnd-rolling-")
        install_client(ARGS.source_dir, os.path.join(cls.tmp.name, "client"))
        generate_stubs(ARGS.source_dir, os.path.join(cls.tmp.name, "stubs"))
        cls.indexes, cls.xb = rolling.build_indexes(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def roll_under(self, load_class):
        work = tempfile.mkdtemp(dir=self.tmp.name)
        replicas = rolling.Replicas(ARGS.knnd, work, CONFIG, self.indexes)
        self.addCleanup(replicas.stop)
        for r in (0, 1):
            replicas.start(r)
        outcomes = rolling.Outcomes()
        load = load_class(replicas.target(), self.xb, outcomes, timeout_s=10)
        try:
            others_answered = rolling.roll(replicas, outcomes, ROUNDS)
        finally:
            load.stop()
        summary = (f"answered {outcomes.answered}, while away "
                   f"{others_answered}, errors {outcomes.errors[:10]}")
        print(summary, flush=True)
        self.assertEqual(outcomes.errors, [], summary)
        self.assertEqual(outcomes.bad, [], summary)
        self.assertEqual(sum(outcomes.answered), outcomes.calls(), summary)
        self.assertTrue(all(n > 0 for n in others_answered), summary)
        self.assertEqual(replicas.exit_codes, [0] * (2 * ROUNDS), summary)

    def test_sync_clients(self):
        self.roll_under(rolling.SyncLoad)

    def test_async_clients(self):
        self.roll_under(rolling.AsyncLoad)


if __name__ == "__main__":
    unittest_main(__doc__)
