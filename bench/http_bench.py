#!/usr/bin/python3
"""knnd over HTTP/JSON against gRPC: the same knnd, index and queries
(bench/RESULTS.md, "HTTP/JSON beside gRPC").

One knnd (--http_listen on) serves --rows seeded clustered 384-d vectors
(bench/make_clustered.py, `knnctl build`'s default recipe, built once under
--work). Every call is one query, k 10, at the index's default nprobe.
Cases, each in client processes of their own:

  grpc            knnd_client's KnnClient (installed from this tree)
  http            http.client, one kept-alive connection, the query as a
                  JSON array of numbers, the answer parsed with json
  http-base64     the same, the query as base64 float32 (vectors_f32le)
  requests        a requests.Session, the query as a JSON array

1. knnd's CPU per request: one client process makes --calls calls back to
   back after a warm-up and reads knnd's utime + stime (/proc/PID/stat)
   around them; knnd's CPU seconds / calls. The client's own CPU per call
   is printed beside it.
2. Throughput: --procs client processes of one case, closed loop, from a
   common start once all are warmed up, for --seconds: q/s.

Rounds (--rounds) alternate the cases; medians are printed, then the
ratios to gRPC. Last, for reference, gRPC's CPU per request with
inline_max_rows 0 (knnd never searches on the thread that received the
call, as it never does for HTTP) and with grpc_poll_us 0 (gRPC's threads
sleep at once after an event, as the HTTP listener's do).

  http_bench.py --build BUILD [--work DIR] [--rows 100000] [--calls 3000]
      [--seconds 5] [--rounds 3] [--procs 8]
"""
import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests", "python"))
import knnd_harness  # noqa: E402

DIM = 384
K = 10
CASES = ("grpc", "http", "http-base64", "requests")
# gRPC's CPU per request with one default changed, for reference: knnd
# never searches on an HTTP listener thread (inline_max_rows 0 for gRPC),
# and the HTTP listener does not poll before sleeping (grpc_poll_us 0).
REFERENCES = ("inline_max_rows: 0", "grpc_poll_us: 0")


def cpu_seconds(pid):
    """utime + stime of process `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------
# One client process (--case)


def make_call(case, grpc_address, http_address, queries):
    """A function making one call of `case` with query i; returns the ids."""
    if case == "grpc":
        from knnd_client import KnnClient
        client = KnnClient(grpc_address, timeout_s=30)
        return lambda i: client.search(queries[i][None, :], k=K).ids[0]
    host, port = http_address.rsplit(":", 1)
    headers = {"Content-Type": "application/json"}

    def body(i):
        if case == "http-base64":
            return json.dumps({"vectors_f32le": base64.b64encode(
                queries[i].astype("<f4").tobytes()).decode(), "k": K})
        return json.dumps({"vectors": queries[i].tolist(), "k": K})
    if case == "requests":
        import requests
        session = requests.Session()
        url = f"http://{http_address}/v1/search"

        def call(i):
            r = session.post(url, data=body(i), headers=headers, timeout=30)
            r.raise_for_status()
            return [int(x) for x in r.json()["ids"]]
        return call
    import http.client
    conn = http.client.HTTPConnection(host, int(port), timeout=30)

    def call(i):
        conn.request("POST", "/v1/search", body=body(i), headers=headers)
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {data[:200]}")
        return [int(x) for x in json.loads(data)["ids"]]
    return call


def run_case(args):
    """Runs one client process's part and prints its result as JSON."""
    queries = np.load(os.path.join(args.work, "queries.npy"))
    call = make_call(args.case, args.grpc, args.http, queries)
    for i in range(100):
        call(i % len(queries))
    if args.throughput:  # closed loop from the driver's common start
        print("ready", flush=True)
        sys.stdin.readline()
        end, calls = time.time() + args.seconds, 0
        while time.time() < end:
            call(calls % len(queries))
            calls += 1
        print(json.dumps({"calls": calls}))
        return
    knnd0, cpu0, wall0 = cpu_seconds(args.knnd_pid), time.process_time(), time.time()
    for i in range(args.calls):
        call(i % len(queries))
    print(json.dumps({
        "knnd_us": (cpu_seconds(args.knnd_pid) - knnd0) / args.calls * 1e6,
        "client_us": (time.process_time() - cpu0) / args.calls * 1e6,
        "wall_us": (time.time() - wall0) / args.calls * 1e6}))


# --------------------------------------------------------------------------
# The driver


def prepare(args):
    """The index and queries under --work (built once), and knnd_client."""
    os.makedirs(args.work, exist_ok=True)
    base = os.path.join(args.work, f"base{args.rows}.npy")
    index = os.path.join(args.work, f"http{args.rows}.index")
    if not os.path.exists(index):
        subprocess.run([sys.executable, os.path.join(HERE, "make_clustered.py"),
                        str(args.rows), str(DIM), "7", base], check=True)
        subprocess.run([os.path.join(args.build, "knnctl"), "build", "--input",
                        base, "--output", index], check=True, capture_output=True)
    queries = os.path.join(args.work, "queries.npy")
    if not os.path.exists(queries):
        subprocess.run([sys.executable, os.path.join(HERE, "make_clustered.py"),
                        "1000", str(DIM), "8", queries, "7"], check=True)
    site = os.path.join(args.work, "client", "site")
    if not os.path.isdir(site):
        knnd_harness.install_client(SOURCE, os.path.join(args.work, "client"))
    return index, site


def start_knnd(args, index, extra=""):
    config = os.path.join(args.work, "knnd.textproto")
    with open(config, "w") as f:
        f.write(extra)
    http = f"127.0.0.1:{knnd_harness.free_port()}"
    daemon = knnd_harness.Daemon(
        os.path.join(args.build, "knnd"),
        ["--config", config, "--index", index, "--http_listen", http],
        log_path=os.path.join(args.work, "knnd.log"),
        knnctl=os.path.join(args.build, "knnctl"))
    if not daemon.wait_serving(300):
        raise RuntimeError("knnd did not start: " + daemon.read_log())
    daemon.http = http
    return daemon


def spawn(args, site, daemon, case, throughput=False):
    env = dict(os.environ, PYTHONPATH=site)
    return subprocess.Popen(
        [sys.executable, __file__, "--case", case, "--work", args.work,
         "--grpc", daemon.address, "--http", daemon.http,
         "--knnd-pid", str(daemon.proc.pid), "--calls", str(args.calls),
         "--seconds", str(args.seconds)] + (["--throughput"] if throughput else []),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def collect(proc):
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"client exited {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def cpu_case(args, site, daemon, case):
    return collect(spawn(args, site, daemon, case))


def qps_case(args, site, daemon, case):
    procs = [spawn(args, site, daemon, case, True) for _ in range(args.procs)]
    for p in procs:  # every process imported and warmed up
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a {case} client failed")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    return sum(collect(p)["calls"] for p in procs) / args.seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(),
                                                       "knnd_bench", "http"))
    parser.add_argument("--rows", type=int, default=100000)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--case", choices=CASES)
    parser.add_argument("--grpc")
    parser.add_argument("--http")
    parser.add_argument("--knnd-pid", type=int)
    parser.add_argument("--throughput", action="store_true")
    args = parser.parse_args()
    if args.case:
        return run_case(args)
    index, site = prepare(args)
    daemon = start_knnd(args, index)
    cpu = {c: [] for c in CASES}
    qps = {c: [] for c in CASES}
    try:
        for r in range(args.rounds):
            for case in CASES:
                cpu[case].append(cpu_case(args, site, daemon, case))
            for case in CASES:
                qps[case].append(qps_case(args, site, daemon, case))
            print(f"round {r + 1}: " + ", ".join(
                f"{c} {cpu[c][-1]['knnd_us']:.0f} us {qps[c][-1]:.0f} q/s"
                for c in CASES), flush=True)
    finally:
        daemon.stop(grace_s=30)
    print(f"\n{args.rows} x {DIM} vectors, 1 query per call, k {K}; "
          f"medians of {args.rounds} rounds; {args.calls} calls per CPU "
          f"measurement, {args.procs} processes x {args.seconds:g} s per q/s one\n")
    print("| case | knnd CPU per request (us) | client CPU per call (us) | "
          "latency, 1 client (us) | q/s, %d processes |" % args.procs)
    print("|---|---|---|---|---|")
    med = {}
    for case in CASES:
        med[case] = (statistics.median(x["knnd_us"] for x in cpu[case]),
                     statistics.median(x["client_us"] for x in cpu[case]),
                     statistics.median(x["wall_us"] for x in cpu[case]),
                     statistics.median(qps[case]))
        print(f"| {case} | {med[case][0]:.0f} | {med[case][1]:.0f} | "
              f"{med[case][2]:.0f} | {med[case][3]:.0f} |")
    print("\n| ratio to grpc | knnd CPU per request | q/s |\n|---|---|---|")
    for case in CASES[1:]:
        print(f"| {case} | {med[case][0] / med['grpc'][0]:.2f}x | "
              f"{med[case][3] / med['grpc'][3]:.2f}x |")
    print()
    for config in REFERENCES:
        daemon = start_knnd(args, index, config + "\n")
        try:
            us = statistics.median(cpu_case(args, site, daemon, "grpc")["knnd_us"]
                                   for _ in range(args.rounds))
        finally:
            daemon.stop(grace_s=30)
        print(f"reference: grpc with {config}: {us:.0f} us of knnd CPU per "
              f"request ({us / med['grpc'][0]:.2f}x grpc's)")


if __name__ == "__main__":
    main()
