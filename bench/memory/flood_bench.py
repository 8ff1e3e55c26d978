#!/usr/bin/python3
"""Anonymous RSS of knnd through a flood of large requests, side by side:
knnd's heap trimmer off (heap_trim_interval_ms 0) and on (the default,
every 1 s); gRPC's memory quota off and at its default (half of
--headroom-mib).

A seeded N x D index (IVF256,PQ32 by default) is built with python3-faiss;
knnd runs with a byte budget (--budget-mib) and max_inflight_queries 65536,
so the byte budget binds; --processes client processes of --clients threads
each send NQ x D float requests (k 100, nprobe 16) back to back for
--seconds, waiting the server's grpc-retry-pushback-ms after a refusal.
RssAnon is sampled every 10 ms during the flood, then 1, 3 and 10 s after
it (the requests admitted last may still be running for a few seconds).
Besides memory, each row says how the calls ended: answered OK (and how
many knnd admitted and answered: the two differ when gRPC cut admitted
calls), refused RESOURCE_EXHAUSTED with grpc-retry-pushback-ms (the gate's)
and without it (gRPC's memory quota: RST_STREAM), and UNAVAILABLE (GOAWAY,
broken pipe).
  flood_bench.py --knnd BUILD/knnd [--n 100000] [--dim 128] [--nq 4096]
                 [--processes 1] [--clients 24] [--seconds 4]
                 [--budget-mib 32] [--headroom-mib 128]
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
import knnd_harness  # noqa: E402
import memory_test as mt  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--knnd", required=True)
    p.add_argument("--n", type=int, default=100000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--factory", default="IVF256,PQ32")
    p.add_argument("--nq", type=int, default=4096)
    p.add_argument("--processes", type=int, default=1,
                   help="client processes, each with --clients threads")
    p.add_argument("--clients", type=int, default=24)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--budget-mib", type=int, default=32)
    p.add_argument("--headroom-mib", type=int, default=128,
                   help="memory_headroom_bytes; the gRPC memory quota is half")
    a = p.parse_args()
    source = os.path.join(HERE, "..", "..")
    mt.ARGS = argparse.Namespace(knnd=a.knnd, source_dir=source)
    tmp = tempfile.mkdtemp(prefix="knnd_flood_")
    knnd_harness.generate_stubs(source, tmp)
    sys.path.insert(0, tmp)
    index = os.path.join(tmp, "flood.index")
    mt.build_index(index, a.n, a.dim, a.factory)
    mib = 2**20
    print(f"index {a.n} x {a.dim} {a.factory}; requests {a.nq} x {a.dim} "
          f"floats ({a.nq * a.dim * 4 / mib:.1f} MiB), k 100, nprobe 16; "
          f"{a.processes} x {a.clients} clients for {a.seconds:g} s; "
          f"max_inflight_bytes "
          f"{a.budget_mib} MiB; load average {os.getloadavg()}")
    quota = a.headroom_mib // 2
    print(f"memory_headroom_bytes {a.headroom_mib} MiB; documented bound: index "
          f"heap + {a.budget_mib} + {a.headroom_mib} MiB")
    print("| heap trimmer | gRPC memory quota | anon after warm-up MiB | peak MiB | "
          "after 1 s | after 3 s | after 10 s | OK (knnd answered) | "
          "RESOURCE_EXHAUSTED with pushback | without | UNAVAILABLE |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    off = f"grpc_memory_quota_bytes: {1 << 40}\n"
    for name, qname, knob in [
            ("off (heap_trim_interval_ms: 0)", f"{quota} MiB (default)",
             "heap_trim_interval_ms: 0\n"),
            ("on (default, 1 s)", "none (1 TiB)", off),
            ("on (default, 1 s)", f"{quota} MiB (default)", "")]:
        d = mt.Daemon(tmp, index, name="flood", extra=(
            f"max_inflight_bytes: {a.budget_mib * mib}\nmax_inflight_queries: 65536\n"
            f"memory_headroom_bytes: {a.headroom_mib * mib}\n"
            f"max_queries_per_request: {max(4096, a.nq)}\n" + knob))
        try:
            assert d.wait_serving(), d.read_log()
            stub = d.stub()
            rng = np.random.default_rng(1)
            mt.run_requests(stub, [mt.request(rng, a.dim, 8, 10, 16)
                                   for _ in range(200)], window=4)
            d.close_channels()
            time.sleep(1.5)
            warm = mt.rss_anon(d.proc.pid)
            before = mt.search_codes(d)
            with mt.PeakSampler(d.proc.pid) as s:
                res = mt.flood(d.address, tmp, a.dim, a.nq, a.processes,
                               a.clients, a.seconds)
            server = mt.search_codes(d) - before
            after = {}
            start = time.time()
            for t in (1.0, 3.0, 10.0):
                time.sleep(max(0.0, start + t - time.time()))
                after[t] = mt.rss_anon(d.proc.pid)
            codes = [c for c, _ in res]
            exhausted = [p for c, p in res if c == "RESOURCE_EXHAUSTED"]
            other = {c: n for c, n in server.items()
                     if c not in ("OK", "RESOURCE_EXHAUSTED")}
            print(f"| {name} | {qname} | {warm / mib:.1f} | {s.peak / mib:.1f} | "
                  f"{after[1.0] / mib:.1f} | {after[3.0] / mib:.1f} | "
                  f"{after[10.0] / mib:.1f} | {codes.count('OK')} "
                  f"({server['OK']}{''.join(f', {n} {c}' for c, n in other.items())}) | "
                  f"{sum(exhausted)} | {len(exhausted) - sum(exhausted)} | "
                  f"{codes.count('UNAVAILABLE')} |", flush=True)
        finally:
            d.stop()


if __name__ == "__main__":
    main()
