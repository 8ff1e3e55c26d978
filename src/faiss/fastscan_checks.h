// The checks that a FAISS object is an IVF-PQ FastScan index knnd can write
// in its mappable layout and search with fastscan_search.h. Internal to
// src/faiss/.
#ifndef KNND_FAISS_FASTSCAN_CHECKS_H_
#define KNND_FAISS_FASTSCAN_CHECKS_H_

#include <string>

#include <faiss/Index.h>
#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/IndexPreTransform.h>

#include "knnd/faiss/faiss_types.h"

namespace knnd {

// The FAISS objects of a FastScan index: an IndexIVFPQFastScan, possibly
// under one IndexPreTransform. Borrowed from the index they were split from.
struct FastScanParts {
  faiss_types::IndexLayers layers;
  const faiss::IndexIVFPQFastScan* ivf = nullptr;
};

// Fills `parts` from `index` and returns "" when it is a trained
// IndexIVFPQFastScan (bbs 32, 4-bit PQ, M2 and code_size consistent with M,
// L2 or inner product, a coarse quantizer of nlist vectors of its dimension,
// FAISS's query-group size qbs2 at most 24, any precomputed table of the
// right size) alone or under a pre-transform chain that ends at its
// dimension; otherwise says what is wrong. The lists are not checked.
std::string CheckFastScanIndex(const faiss::Index& index, FastScanParts& parts);

}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_CHECKS_H_
