#include "knnd/faiss/coarse_l2.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <typeinfo>
#include <utility>
#include <vector>

#include <faiss/IndexFlat.h>
#include <faiss/utils/Heap.h>
#include <faiss/utils/distances.h>

#include "knnd/faiss/sgemm.h"

namespace knnd {
namespace coarse_l2 {
namespace {

#if defined(__AVX2__) && defined(__FMA__)

// The first r (< 4) floats of p, zeros after (FAISS's masked_read).
inline __m128 ReadTail(const float* p, size_t r) {
  alignas(16) float buf[4] = {0, 0, 0, 0};
  for (size_t i = 0; i < r; ++i) buf[i] = p[i];
  return _mm_load_ps(buf);
}

// Every loop over the ways is unrolled (KNND_EACH_WAY): GCC 12 at -O2
// otherwise keeps s8[] in memory, each fused multiply-add then waits on a
// store and a reload, and four ways ran slower than one (25.5 against
// 18.6 us a Fashion-MNIST query here; 8.9 us unrolled, bench/RESULTS.md
// "Peers").
#define KNND_EACH_WAY _Pragma("GCC unroll 16") for (int w = 0; w < kWays; ++w)

// Squared L2 distances of x to the kWays rows y[0..kWays) of d floats, each
// in FAISS 1.7.3's fvec_L2sqr order: 8-lane fused sums, the two halves
// added, a 4-lane step, a zero-padded tail, two horizontal adds.
template <int kWays>
inline void Distances(const float* x, const float* const* y, size_t d,
                      float* out) {
  __m256 s8[kWays];
  KNND_EACH_WAY s8[w] = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    KNND_EACH_WAY {
      const __m256 diff = _mm256_sub_ps(xv, _mm256_loadu_ps(y[w] + i));
      s8[w] = _mm256_fmadd_ps(diff, diff, s8[w]);
    }
  }
  __m128 s4[kWays];
  KNND_EACH_WAY {
    s4[w] = _mm_add_ps(_mm256_extractf128_ps(s8[w], 1),
                       _mm256_castps256_ps128(s8[w]));
  }
  if (d - i >= 4) {
    const __m128 xv = _mm_loadu_ps(x + i);
    KNND_EACH_WAY {
      const __m128 diff = _mm_sub_ps(xv, _mm_loadu_ps(y[w] + i));
      s4[w] = _mm_fmadd_ps(diff, diff, s4[w]);
    }
    i += 4;
  }
  if (d > i) {
    const __m128 xv = ReadTail(x + i, d - i);
    KNND_EACH_WAY {
      const __m128 diff = _mm_sub_ps(xv, ReadTail(y[w] + i, d - i));
      s4[w] = _mm_fmadd_ps(diff, diff, s4[w]);
    }
  }
  KNND_EACH_WAY {
    __m128 h = _mm_hadd_ps(s4[w], s4[w]);
    h = _mm_hadd_ps(h, h);
    out[w] = _mm_cvtss_f32(h);
  }
}

#undef KNND_EACH_WAY

// Scratch of Search(), kept per thread between calls.
struct Selection {
  std::vector<float> distances;  // one query's, every centroid
  std::vector<float> minima;
  std::vector<std::pair<float, int64_t>> kept;
};

// The smallest of n floats (FAISS's neutral +inf when none is smaller);
// NaN is passed over, as FAISS's heap passes it over.
inline float Minimum(const float* v, size_t n) {
  __m256 m8 = _mm256_set1_ps(HUGE_VALF);
  size_t i = 0;
  // min(a, b) is b when either is NaN: the running minimum goes second.
  for (; i + 8 <= n; i += 8) m8 = _mm256_min_ps(_mm256_loadu_ps(v + i), m8);
  __m128 m4 = _mm_min_ps(_mm256_castps256_ps128(m8),
                         _mm256_extractf128_ps(m8, 1));
  m4 = _mm_min_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_min_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  float m = _mm_cvtss_f32(m4);
  for (; i < n; ++i) {
    if (v[i] < m) m = v[i];
  }
  return m;
}

// What FAISS's heap of k keeps of dis[0..n) offered in index order (one
// strictly closer than the k-th replaces it): the k smallest by (distance,
// index), never one at or above the heap's neutral FLT_MAX nor NaN, sorted,
// then (FLT_MAX, -1) for the places left. The heap's ~k ln(n / k)
// replacements and mispredicted rejections took 4.1 us of a query at k 20
// of 1,024 centroids (a filtered search's widened nprobe on 1M rows);
// here a bound first, the k-th smallest of the minima of 2k blocks (k
// blocks hold a distance at or under it, so the k-th smallest does not
// exceed it), then only the distances at or under it are ordered: 1.9 us,
// and 0.6 against 2.4 us at k 12 (bench/RESULTS.md "Filters").
void SmallestK(const float* dis, size_t n, size_t k, Selection& scratch,
               float* out_d, int64_t* out_i) {
  using C = faiss::CMax<float, int64_t>;
  if (k == 0) return;
  float bound = HUGE_VALF;
  const size_t blocks = std::min(n, 2 * k);
  if (blocks >= k) {
    std::vector<float>& minima = scratch.minima;
    minima.resize(blocks);
    for (size_t b = 0; b < blocks; ++b) {
      const size_t begin = b * n / blocks, end = (b + 1) * n / blocks;
      minima[b] = Minimum(dis + begin, end - begin);
    }
    std::nth_element(minima.begin(), minima.begin() + (k - 1), minima.end());
    bound = minima[k - 1];
  }
  auto& kept = scratch.kept;
  kept.clear();
  const __m256 at_most = _mm256_set1_ps(bound);
  const float neutral = C::neutral();
  const __m256 below = _mm256_set1_ps(neutral);
  size_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m256 v = _mm256_loadu_ps(dis + c);
    unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(
        _mm256_and_ps(_mm256_cmp_ps(v, at_most, _CMP_LE_OQ),
                      _mm256_cmp_ps(v, below, _CMP_LT_OQ))));
    while (mask != 0) {
      const size_t j = c + static_cast<size_t>(__builtin_ctz(mask));
      mask &= mask - 1;
      kept.emplace_back(dis[j], static_cast<int64_t>(j));
    }
  }
  for (; c < n; ++c) {
    if (dis[c] <= bound && dis[c] < neutral) {
      kept.emplace_back(dis[c], static_cast<int64_t>(c));
    }
  }
  const size_t found = std::min(kept.size(), k);
  if (kept.size() > k) {
    std::nth_element(kept.begin(), kept.begin() + (k - 1), kept.end());
  }
  std::sort(kept.begin(), kept.begin() + found);
  for (size_t j = 0; j < found; ++j) {
    out_d[j] = kept[j].first;
    out_i[j] = kept[j].second;
  }
  for (size_t j = found; j < k; ++j) {
    out_d[j] = neutral;
    out_i[j] = -1;
  }
}

// From FAISS's BLAS threshold up: the distances as FAISS 1.7.3's
// exhaustive_L2sqr_blas computes them (the same norms, the same sgemm
// calls over blocks of distance_compute_blas_query_bs queries, then
// |x|^2 + |c|^2 - 2 <x, c> clamped at 0), and each query's k nearest by
// SmallestK instead of FAISS's heap, whose scalar pass over every centroid
// was 3% of a 384-dim batch query over 512 centroids; FAISS also allocates
// (and the kernel maps and faults in) a 16 MiB block on every call. Needs
// the centroids in one BLAS block (distance_compute_blas_database_bs) and
// k > 1.
void SearchBlas(const faiss::IndexFlatL2& flat, size_t n, const float* x,
                size_t k, float* distances, int64_t* labels,
                const float* centroid_norms) {
  const float* centroids = flat.get_xb();
  const size_t d = flat.d, nc = static_cast<size_t>(flat.ntotal);
  const size_t bs_x = faiss::distance_compute_blas_query_bs;
  thread_local Selection selection;
  thread_local std::vector<float> x_norms, c_norms, block;
  x_norms.resize(n);
  faiss::fvec_norms_L2sqr(x_norms.data(), x, d, n);
  if (centroid_norms == nullptr) {
    c_norms.resize(nc);
    faiss::fvec_norms_L2sqr(c_norms.data(), centroids, d, nc);
    centroid_norms = c_norms.data();
  }
  block.resize(std::min(n, bs_x) * nc);
  for (size_t i0 = 0; i0 < n; i0 += bs_x) {
    const size_t i1 = std::min(n, i0 + bs_x);
    const float one = 1, zero = 0;
    const int nyi = static_cast<int>(nc), nxi = static_cast<int>(i1 - i0),
              di = static_cast<int>(d);
    sgemm_("Transpose", "Not transpose", &nyi, &nxi, &di, &one, centroids,
           &di, x + i0 * d, &di, &zero, block.data(), &nyi);
    for (size_t i = i0; i < i1; ++i) {
      float* line = block.data() + (i - i0) * nc;
      for (size_t j = 0; j < nc; ++j) {
        // (|x|^2 + |c|^2) - 2ip: 2ip is exact, so a fused multiply-add
        // rounds it as FAISS's separate subtraction does.
        const float dis = x_norms[i] + centroid_norms[j] - 2 * line[j];
        line[j] = dis < 0 ? 0 : dis;
      }
      SmallestK(line, nc, k, selection, distances + i * k, labels + i * k);
    }
  }
}

constexpr bool kCompiled = true;

#else

constexpr bool kCompiled = false;

#endif  // __AVX2__ && __FMA__

}  // namespace

bool Applies(const faiss::Index& quantizer, size_t n, size_t k) {
  if (!kCompiled || typeid(quantizer) != typeid(faiss::IndexFlatL2) ||
      k >= static_cast<size_t>(faiss::distance_compute_min_k_reservoir)) {
    return false;
  }
  // From the BLAS threshold up, k 1 takes FAISS's own AVX2 arithmetic
  // (its SingleBestResultHandler specialisation), left to it.
  const auto one_block = static_cast<faiss::Index::idx_t>(
      faiss::distance_compute_blas_database_bs);
  return n < static_cast<size_t>(faiss::distance_compute_blas_threshold) ||
         (k > 1 && quantizer.ntotal <= one_block);
}

std::vector<float> CentroidNorms(const faiss::Index& quantizer) {
  // Search() takes them only for centroids in one BLAS block (Applies).
  if (typeid(quantizer) != typeid(faiss::IndexFlatL2) ||
      quantizer.ntotal > static_cast<faiss::Index::idx_t>(
                             faiss::distance_compute_blas_database_bs)) {
    return {};
  }
  const auto& flat = static_cast<const faiss::IndexFlatL2&>(quantizer);
  std::vector<float> norms(static_cast<size_t>(flat.ntotal));
  faiss::fvec_norms_L2sqr(norms.data(), flat.get_xb(), flat.d, norms.size());
  return norms;
}

void Search(const faiss::Index& quantizer, size_t n, const float* x,
            size_t k, float* distances, int64_t* labels,
            const float* centroid_norms) {
#if defined(__AVX2__) && defined(__FMA__)
  const auto& flat = static_cast<const faiss::IndexFlatL2&>(quantizer);
  if (n >= static_cast<size_t>(faiss::distance_compute_blas_threshold)) {
    if (k > 0) SearchBlas(flat, n, x, k, distances, labels, centroid_norms);
    return;
  }
  const float* centroids = flat.get_xb();
  const size_t d = flat.d, nc = static_cast<size_t>(flat.ntotal);
  constexpr int kWays = 4;
  thread_local Selection selection;
  std::vector<float>& dis = selection.distances;
  dis.resize(nc);
  for (size_t q = 0; q < n; ++q) {
    const float* xq = x + q * d;
    size_t c = 0;
    for (; c + kWays <= nc; c += kWays) {
      const float* rows[kWays];
      for (int w = 0; w < kWays; ++w) rows[w] = centroids + (c + w) * d;
      Distances<kWays>(xq, rows, d, dis.data() + c);
    }
    for (; c < nc; ++c) {
      const float* row = centroids + c * d;
      Distances<1>(xq, &row, d, dis.data() + c);
    }
    SmallestK(dis.data(), nc, k, selection, distances + q * k,
              labels + q * k);
  }
#else
  quantizer.search(static_cast<faiss::Index::idx_t>(n), x,
                   static_cast<faiss::Index::idx_t>(k), distances, labels);
#endif
}

}  // namespace coarse_l2
}  // namespace knnd
