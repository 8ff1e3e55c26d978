#include "knnd/faiss/coarse_l2.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <typeinfo>

#include <faiss/IndexFlat.h>
#include <faiss/utils/Heap.h>
#include <faiss/utils/distances.h>

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

constexpr bool kCompiled = true;

#else

constexpr bool kCompiled = false;

#endif  // __AVX2__ && __FMA__

}  // namespace

bool Applies(const faiss::Index& quantizer, size_t n, size_t k) {
  return kCompiled && typeid(quantizer) == typeid(faiss::IndexFlatL2) &&
         n < static_cast<size_t>(faiss::distance_compute_blas_threshold) &&
         k < static_cast<size_t>(faiss::distance_compute_min_k_reservoir);
}

void Search(const faiss::Index& quantizer, size_t n, const float* x,
            size_t k, float* distances, int64_t* labels) {
#if defined(__AVX2__) && defined(__FMA__)
  using C = faiss::CMax<float, int64_t>;
  const auto& flat = static_cast<const faiss::IndexFlatL2&>(quantizer);
  const float* centroids = flat.get_xb();
  const size_t d = flat.d, nc = static_cast<size_t>(flat.ntotal);
  constexpr int kWays = 4;
  float dis[kWays];
  for (size_t q = 0; q < n; ++q) {
    const float* xq = x + q * d;
    float* hd = distances + q * k;
    int64_t* hi = labels + q * k;
    faiss::heap_heapify<C>(k, hd, hi);
    // FAISS's heap handler: offered in centroid order, kept when strictly
    // closer than the current k-th.
    auto offer = [&](float di, size_t c) {
      if (C::cmp(hd[0], di)) {
        faiss::heap_replace_top<C>(k, hd, hi, di, static_cast<int64_t>(c));
      }
    };
    size_t c = 0;
    for (; c + kWays <= nc; c += kWays) {
      const float* rows[kWays];
      for (int w = 0; w < kWays; ++w) rows[w] = centroids + (c + w) * d;
      Distances<kWays>(xq, rows, d, dis);
      for (int w = 0; w < kWays; ++w) offer(dis[w], c + w);
    }
    for (; c < nc; ++c) {
      const float* row = centroids + c * d;
      Distances<1>(xq, &row, d, dis);
      offer(dis[0], c);
    }
    faiss::heap_reorder<C>(k, hd, hi);
  }
#else
  quantizer.search(static_cast<faiss::Index::idx_t>(n), x,
                   static_cast<faiss::Index::idx_t>(k), distances, labels);
#endif
}

}  // namespace coarse_l2
}  // namespace knnd
