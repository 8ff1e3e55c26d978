#!/usr/bin/python3
"""Anonymous RSS of knnd with glibc's malloc defaults vs knnd's
(malloc_arena_max 2, malloc_mmap_threshold_bytes 1 MiB): 500 mixed searches
of warm-up, then 3000 more (the soak's shapes), one run.
  malloc_ab.py BUILD/knnd SOURCE_DIR
"""
import argparse, os, sys, tempfile, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))
import knnd_harness
import memory_test as mt
mt.ARGS = argparse.Namespace(knnd=sys.argv[1], source_dir=sys.argv[2])
tmp = tempfile.mkdtemp()
knnd_harness.generate_stubs(sys.argv[2], tmp)
index = os.path.join(tmp, "x.index")
mt.build_index(index, 50000, 64, "IVF1024,PQ16")
t = mt.MemoryTest()
for name, extra in [("glibc defaults", "malloc_arena_max: 0\nmalloc_mmap_threshold_bytes: 0\n"),
                    ("knnd defaults (arenas 2, mmap threshold 1 MiB)", "")]:
    d = mt.Daemon(tmp, index, name="ab", extra=extra)
    assert d.wait_serving(), d.read_log()
    stub = d.stub()
    rng = np.random.default_rng(1)
    mt.run_requests(stub, t.mixed(rng, 500), window=8)
    time.sleep(0.5)
    warm = mt.rss_anon(d.proc.pid)
    with mt.PeakSampler(d.proc.pid) as s:
        for _ in range(3):
            mt.run_requests(stub, t.mixed(rng, 1000), window=8)
    time.sleep(0.5)
    after = mt.rss_anon(d.proc.pid)
    print(f"{name}: anon after warm-up {warm/2**20:.1f} MiB, after 3000 more {after/2**20:.1f} MiB, peak {s.peak/2**20:.1f} MiB", flush=True)
    d.stop()
