// The coarse search of an IVF index over a flat L2 quantizer: what
// faiss::IndexFlatL2::search computes, equal bit for bit to FAISS 1.7.3's
// AVX2 build. Below FAISS's BLAS threshold (distance_compute_blas_threshold
// queries) four centroids at a time: FAISS's one chain of fused
// multiply-adds per centroid waits on its latency, and the coarse search
// was a third of a single-query search of Fashion-MNIST (256 centroids of
// 784 dims). From it up FAISS's own BLAS distances, each query's nearest
// picked without FAISS's heap (coarse_l2.cc). Internal to src/faiss/
// (fastscan_search.cc).
//
// Only compiled in (CoarseL2Applies true) with AVX2 and FMA, the flags of
// an AVX2 FAISS build (src/faiss/CMakeLists.txt); elsewhere callers keep
// FAISS's own search. Thread-safety: pure functions.
#ifndef KNND_FAISS_COARSE_L2_H_
#define KNND_FAISS_COARSE_L2_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace faiss {
struct Index;
}  // namespace faiss

namespace knnd {
namespace coarse_l2 {

// Whether Search() gives `quantizer`'s own answer for n queries and k
// results: an IndexFlatL2, n below FAISS's BLAS threshold or its centroids
// in one BLAS block (distance_compute_blas_database_bs) and k above 1, k
// below its reservoir threshold, and this build AVX2 + FMA.
bool Applies(const faiss::Index& quantizer, size_t n, size_t k);

// The squared norms of an IndexFlatL2's centroids as FAISS computes them
// on each call of its BLAS search (fvec_norms_L2sqr), for Search() to take
// instead; empty for another quantizer or more centroids than one BLAS
// block (distance_compute_blas_database_bs), where Search() never takes
// them.
std::vector<float> CentroidNorms(const faiss::Index& quantizer);

// The k nearest centroids of each of n queries (quantizer->d floats each),
// nearest first, as quantizer.search writes them; needs Applies().
// `centroid_norms`: CentroidNorms(quantizer), or null to compute them.
void Search(const faiss::Index& quantizer, size_t n, const float* x,
            size_t k, float* distances, int64_t* labels,
            const float* centroid_norms = nullptr);

}  // namespace coarse_l2
}  // namespace knnd

#endif  // KNND_FAISS_COARSE_L2_H_
