"""A deterministic hashing embedder: the stand-in for a sentence-embedding
model in this example, so that it runs with no model download.

A text becomes its lower-cased word unigrams and bigrams; each feature is
hashed (BLAKE2b, so the same text gives the same vector in every process
and on every machine, unlike Python's salted hash()) to one of `dim`
buckets with a sign taken from another bit of the hash (collisions then
cancel out on average instead of piling up); a feature counts
1 + log(term frequency); the vector is L2-normalised, so an index built
with `knnctl build --metric cosine` ranks by cosine similarity.

It captures shared words, not meaning: "car" and "automobile" are
unrelated to it. Swap in a real model (e.g. all-MiniLM-L6-v2, 384 dims,
from the sentence-transformers package) by replacing embed(); the index
must then be rebuilt with the same model.
"""
from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from typing import Iterable, List

import numpy as np

DIM = 256
_WORD = re.compile(r"[a-z0-9]+")


def features(text: str) -> List[str]:
    """The unigrams and bigrams the embedding is made of."""
    words = _WORD.findall(text.lower())
    return words + [f"{a} {b}" for a, b in zip(words, words[1:])]


def embed(text: str, dim: int = DIM) -> np.ndarray:
    """float32 (dim,), unit length (all zeros for a text without words)."""
    vector = np.zeros(dim, np.float32)
    for feature, count in Counter(features(text)).items():
        digest = int.from_bytes(
            hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
        sign = 1.0 if digest >> 63 else -1.0
        vector[digest % dim] += sign * (1.0 + math.log(count))
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def embed_many(texts: Iterable[str], dim: int = DIM) -> np.ndarray:
    """float32 (len(texts), dim), one row per text."""
    rows = [embed(t, dim) for t in texts]
    return np.stack(rows) if rows else np.zeros((0, dim), np.float32)
