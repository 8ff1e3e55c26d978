#!/usr/bin/env python3
"""Builds the example's corpus: chunks a text collection, embeds each chunk
with embedder.py, writes each chunk's payload (its text, source file and
ordinal) as a JSON line, builds a knnd index of the vectors with their
payloads, a BM25 index of their text and their source file as a filterable
attribute (`knnctl build --payloads --text text --attribute_fields
source`) and publishes it with `knnctl publish` into the versions
directory knnd serves.

The default collection is /usr/share/common-licenses (Debian's base-files,
present on every Debian machine): the full texts of the GPL, LGPL, Apache,
MPL, GFDL, Artistic, BSD and CC0 licenses, about 260 KB of real English.
Any other plain-text files work: --source '/usr/share/doc/*/README*'.

    python3 build_corpus.py --knnctl build/knnctl --out /srv/rag
    # -> /srv/rag/chunks.jsonl, /srv/rag/versions/<N>/ (knnd --index /srv/rag/versions)

The chunks travel inside the index version (INDEX.payloads, beside the
vectors), so knnd returns each result's chunk with its id: no chunk store
to keep in step with the index, and a rebuild may reorder or drop chunks
freely, since every version carries its own.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
from typing import Iterator, List, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from embedder import DIM, embed_many  # noqa: E402

DEFAULT_SOURCE = "/usr/share/common-licenses/*"


def documents(pattern: str) -> Iterator[Tuple[str, str]]:
    """(name, text) of every regular file matching `pattern`, each file once
    (common-licenses has symlinks such as GPL -> GPL-3), in name order."""
    seen = set()
    for path in sorted(glob.glob(pattern)):
        real = os.path.realpath(path)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        with open(real, encoding="utf-8", errors="replace") as f:
            yield os.path.basename(real), f.read()


def chunks(text: str, words: int, overlap: int) -> Iterator[str]:
    """Windows of `words` words, each sharing `overlap` with the previous
    one, so that a sentence cut at one window's end is whole in the next."""
    tokens = re.findall(r"\S+", text)
    step = words - overlap
    for start in range(0, max(len(tokens) - overlap, 1), step):
        window = tokens[start:start + words]
        if window:
            yield " ".join(window)


def write_payloads(path: str, rows: List[Tuple[int, str, int, str]]) -> None:
    """One JSON line per chunk, in vector order: what `knnctl build
    --payloads` stores and knnd returns with each result."""
    with open(path, "w", encoding="utf-8") as out:
        for _, source, ordinal, text in rows:
            out.write(json.dumps({"text": text, "source": source,
                                  "ordinal": ordinal}) + "\n")


def run(command: List[str]) -> None:
    """Runs `command`; its stderr is passed on with repeated lines folded
    (FAISS warns once per sub-quantizer when a corpus has fewer than 39 x
    256 vectors to train on: true, and expected for a small example)."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    last, repeats = None, 0
    for line in process.stderr:
        if line == last:
            repeats += 1
            continue
        if repeats:
            print(f"  (the line above {repeats} more times)", file=sys.stderr)
        sys.stderr.write(line)
        last, repeats = line, 0
    if repeats:
        print(f"  (the line above {repeats} more times)", file=sys.stderr)
    if process.wait() != 0:
        sys.exit(f"{command[0]} {command[1]} failed (exit {process.returncode})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--knnctl", required=True, help="the knnctl binary")
    parser.add_argument("--out", required=True, help="work directory")
    parser.add_argument("--source", default=DEFAULT_SOURCE,
                        help=f"glob of text files (default {DEFAULT_SOURCE})")
    parser.add_argument("--versions", help="directory knnd serves "
                        "(default OUT/versions)")
    parser.add_argument("--chunk-words", type=int, default=80)
    parser.add_argument("--overlap-words", type=int, default=20)
    parser.add_argument("--nprobe", type=int, default=0,
                        help="default nprobe stored in the index; 0 (the "
                        "default): every list")
    args = parser.parse_args()
    if not 0 <= args.overlap_words < args.chunk_words:
        parser.error("--overlap-words must be >= 0 and < --chunk-words")
    os.makedirs(args.out, exist_ok=True)
    versions = args.versions or os.path.join(args.out, "versions")

    start = time.monotonic()
    rows = []
    for name, text in documents(args.source):
        for ordinal, chunk in enumerate(chunks(text, args.chunk_words,
                                               args.overlap_words)):
            rows.append((len(rows), name, ordinal, chunk))
    if len(rows) < 256:
        sys.exit(f"{len(rows)} chunks from {args.source}: too few to train "
                 "a product quantizer (256 or more)")
    vectors = embed_many(row[3] for row in rows)
    vectors_path = os.path.join(args.out, "vectors.npy")
    np.save(vectors_path, vectors)
    payloads_path = os.path.join(args.out, "chunks.jsonl")
    write_payloads(payloads_path, rows)
    print(f"{len(rows)} chunks of {args.chunk_words} words from "
          f"{len({r[1] for r in rows})} files, embedded ({DIM} dims) in "
          f"{time.monotonic() - start:.1f} s", flush=True)

    # Cosine (knnd normalises queries too); raw vectors kept for exact
    # re-ranking; the PQ size chosen by knnctl. nlist as knnctl would pick
    # it (a power of two near 4 sqrt(N), at most N/39), so that the default
    # nprobe can be all of them: a few thousand chunks are searched
    # exhaustively in well under a millisecond, and hashed embeddings
    # cluster too loosely for a few lists to hold a query's neighbours.
    # For millions of chunks, choose nprobe with `knnctl eval`.
    nlist = 1
    while nlist * 2 <= min(4 * len(rows) ** 0.5, len(rows) / 39):
        nlist *= 2
    index = os.path.join(args.out, "chunks.index")
    # --text text: a BM25 index of each chunk's text (hybrid search);
    # --attribute_fields source: each chunk's source file as an attribute
    # from its payload, which /search?source=... filters on.
    run([args.knnctl, "build", "--input", vectors_path, "--output", index,
         "--payloads", payloads_path, "--text", "text",
         "--attribute_fields", "source",
         "--metric", "cosine", "--keep_vectors", "--nlist", str(nlist),
         "--stored_nprobe", str(args.nprobe or nlist)])
    run([args.knnctl, "publish", "--index", index, "--dir", versions])
    print(f"serve it: knnd --index {versions}", flush=True)


if __name__ == "__main__":
    main()
