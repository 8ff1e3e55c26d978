#!/usr/bin/python3
"""Queue time of admitted requests under a flood of large ones, with the
gate's time bound off (max_queue_time_ms 0, the default) and on, side by
side in one run.

A seeded N x D index (IVF256,PQ16 by default) is built with python3-faiss;
knnd runs with 2 workers and a byte budget (--budget-mib) large enough to
admit several large requests at once. --clients threads send NQ x D float
requests (k 100, nprobe 16) back to back for --seconds, waiting the
server's grpc-retry-pushback-ms after a refusal; one more client sends
8-query requests every 10 ms. Printed per setting: answers, refusals by
reason, the latency of answered requests (p50 / p99 / max, client side) of
both kinds, and knnd's own mean queue time of admitted requests
(knnd_search_queue_duration_seconds sum / count).
  queue_time_bench.py --knnd BUILD/knnd [--bound-ms 500] [--budget-mib 128]
"""
import argparse
import os
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import knnd_harness  # noqa: E402
import memory_test as mt  # noqa: E402


def flood(d, big, small, clients, seconds):
    import grpc
    out = {"big": [], "small": []}
    lock = threading.Lock()
    end = time.time() + seconds

    def client(i, kind):
        stub = d.stub()
        mine = []
        n = i
        while time.time() < end:
            req = big[n % len(big)] if kind == "big" else small
            start = time.perf_counter()
            try:
                stub.Search(req, timeout=60)
                mine.append(("OK", time.perf_counter() - start))
            except grpc.RpcError as e:
                mine.append((e.code().name, time.perf_counter() - start))
                pushback = [v for k, v in (e.trailing_metadata() or ())
                            if k == "grpc-retry-pushback-ms"]
                if pushback:
                    time.sleep(int(pushback[0]) / 1000)
            if kind == "small":
                time.sleep(0.01)
            n += clients
        with lock:
            out[kind].extend(mine)

    threads = [threading.Thread(target=client, args=(i, "big")) for i in range(clients)]
    threads.append(threading.Thread(target=client, args=(0, "small")))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def summary(results):
    ok = sorted(t for c, t in results if c == "OK")
    codes = {}
    for c, _ in results:
        codes[c] = codes.get(c, 0) + 1
    if not ok:
        return codes, "-"
    p = lambda q: ok[min(len(ok) - 1, int(q * len(ok)))]  # noqa: E731
    return codes, f"{p(0.5):.2f} / {p(0.99):.2f} / {ok[-1]:.2f}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--knnd", required=True)
    p.add_argument("--n", type=int, default=50000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--factory", default="IVF256,PQ16")
    p.add_argument("--nq", type=int, default=4096)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--budget-mib", type=int, default=128)
    p.add_argument("--bound-ms", type=int, default=500)
    a = p.parse_args()
    source = os.path.join(HERE, "..")
    mt.ARGS = argparse.Namespace(knnd=a.knnd, source_dir=source)
    tmp = tempfile.mkdtemp(prefix="knnd_queue_")
    knnd_harness.generate_stubs(source, tmp)
    sys.path.insert(0, tmp)
    index = os.path.join(tmp, "queue.index")
    mt.build_index(index, a.n, a.dim, a.factory)
    print(f"index {a.n} x {a.dim} {a.factory}; {a.clients} clients of {a.nq} x "
          f"{a.dim} floats (k 100, nprobe 16) + 1 client of 8 queries every "
          f"10 ms, for {a.seconds:g} s; 2 workers; max_inflight_bytes "
          f"{a.budget_mib} MiB; load average {os.getloadavg()}")
    print("| max_queue_time_ms | large: answered / refused | large latency s p50 / p99 / max "
          "| small: answered / refused | small latency s p50 / p99 / max "
          "| knnd mean queue s | refused for queue_time |")
    print("|---|---|---|---|---|---|---|")
    for bound in (0, a.bound_ms):
        d = mt.Daemon(tmp, index, name="queue", extra=(
            f"max_inflight_bytes: {a.budget_mib << 20}\nmax_inflight_queries: 65536\n"
            f"max_queries_per_request: {max(4096, a.nq)}\n"
            f"max_queue_time_ms: {bound}\n"))
        try:
            assert d.wait_serving(), d.read_log()
            rng = np.random.default_rng(1)
            mt.run_requests(d.stub(), [mt.request(rng, a.dim, 8, 10, 16)
                                       for _ in range(100)], window=4)
            q_sum0 = d.metric("knnd_search_queue_duration_seconds_sum")
            q_cnt0 = d.metric("knnd_search_queue_duration_seconds_count")
            big = [mt.request(rng, a.dim, a.nq, 100, 16) for _ in range(8)]
            small = mt.request(rng, a.dim, 8, 10, 16)
            out = flood(d, big, small, a.clients, a.seconds)
            time.sleep(1)
            q_sum = d.metric("knnd_search_queue_duration_seconds_sum") - q_sum0
            q_cnt = d.metric("knnd_search_queue_duration_seconds_count") - q_cnt0
            qt = d.metric('knnd_search_rejected_total{reason="queue_time"}')
            bc, bl = summary(out["big"])
            sc, sl = summary(out["small"])
            fmt = lambda c: f"{c.get('OK', 0)} / {sum(v for k, v in c.items() if k != 'OK')}"  # noqa: E731
            print(f"| {bound} | {fmt(bc)} | {bl} | {fmt(sc)} | {sl} | "
                  f"{q_sum / max(q_cnt, 1):.3f} | {int(qt)} |", flush=True)
        finally:
            d.stop()


if __name__ == "__main__":
    main()
