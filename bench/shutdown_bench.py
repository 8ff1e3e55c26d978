#!/usr/bin/python3
"""What clients see of a rolling restart, by what knnd does during its
shutdown delay (serve searches, the default, or refuse them) and by how the
client balances: two knnd replicas, 8 KnnClient threads (default retries:
5 attempts, 50 ms jittered exponential backoff) searching without pause,
each replica restarted once (SIGTERM, exit, start again on its port).

  shutdown_bench.py --build BUILD [--delay-ms 2000] [--rounds 1]

Balancing: "round_robin+health" is knnd-client's default for a multi-address
target (gRPC client-side health checking on knnd.v1.KnnService);
"round_robin" the same without health checking; "pick_first" one
connection, as through a ClusterIP Service (kube-proxy) or a plain
host:port target. Prints one line per case: calls, failed calls and their
statuses, and the calls each replica answered.
"""
import argparse
import collections
import json
import os
import sys
import tempfile

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests", "python"))
import rolling  # noqa: E402
from knnd_harness import generate_stubs, install_client  # noqa: E402

BALANCING = {
    "round_robin+health": [],
    "round_robin": [("grpc.service_config", json.dumps(
        {"loadBalancingConfig": [{"round_robin": {}}]}))],
    "pick_first": [("grpc.service_config", json.dumps(
        {"loadBalancingConfig": [{"pick_first": {}}]}))],
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--delay-ms", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="knnd-shutdown-bench-")
    install_client(SOURCE, os.path.join(tmp.name, "client"))
    generate_stubs(SOURCE, os.path.join(tmp.name, "stubs"))
    indexes, xb = rolling.build_indexes(tmp.name)
    print(f"shutdown_delay_ms={args.delay_ms}, {args.rounds} round(s) of "
          f"restarts, {rolling.CLIENTS} KnnClient threads", flush=True)
    for refuse in (False, True):
        for name, options in BALANCING.items():
            work = tempfile.mkdtemp(dir=tmp.name)
            config = (f"shutdown_delay_ms: {args.delay_ms}\n"
                      f"shutdown_delay_refuses_searches: {str(refuse).lower()}\n")
            replicas = rolling.Replicas(os.path.join(args.build, "knnd"), work,
                                        config, indexes)
            try:
                for r in (0, 1):
                    replicas.start(r)
                outcomes = rolling.Outcomes()
                load = rolling.SyncLoad(replicas.target(), xb, outcomes,
                                        timeout_s=10, options=options)
                try:
                    rolling.roll(replicas, outcomes, args.rounds,
                                 come_back=name != "pick_first")
                finally:
                    load.stop()
            finally:
                replicas.stop()
            statuses = collections.Counter(e.split(":")[0] for e in outcomes.errors)
            print(f"{'refuse' if refuse else 'serve':6} {name:19} calls "
                  f"{outcomes.calls():6}  failed {len(outcomes.errors):5} "
                  f"{dict(statuses)}  answered {outcomes.answered}", flush=True)


if __name__ == "__main__":
    main()
