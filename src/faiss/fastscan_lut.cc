#include "knnd/faiss/fastscan_lut.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/impl/ProductQuantizer.h>
#include <faiss/utils/quantize_lut.h>

namespace knnd {
namespace fastscan_lut {
namespace {

constexpr size_t kKsub = 16;

// floor((x - lo) * a + 0.5), the rounding of FAISS's round_tab.
inline int RoundScaled(float x, float lo, float a) {
  const float t = (x - lo) * a;
  return static_cast<int>(std::floor(t + 0.5f));
}

#if defined(__AVX2__)

// Smallest / largest of 8 lanes.
inline float LaneMin(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps(m, m, 1)));
}

inline float LaneMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

// Minimum and maximum of one 16-entry table, NaNs skipped: min_ps / max_ps
// return their second operand when either is NaN, and the accumulator
// (never NaN) is always second.
inline void TableRange(const float* t, float* lo, float* hi) {
  const __m256 x0 = _mm256_loadu_ps(t), x1 = _mm256_loadu_ps(t + 8);
  __m256 mn = _mm256_set1_ps(HUGE_VALF), mx = _mm256_set1_ps(-HUGE_VALF);
  mn = _mm256_min_ps(x0, mn);
  mn = _mm256_min_ps(x1, mn);
  mx = _mm256_max_ps(x0, mx);
  mx = _mm256_max_ps(x1, mx);
  *lo = LaneMin(mn);
  *hi = LaneMax(mx);
}

// RoundScaled of 16 entries into 16 bytes (as FAISS's int -> uint8_t
// truncation for the values 0..255 a table quantizes to).
inline void RoundTable(const float* t, float lo, float a, uint8_t* out) {
  const __m256 vlo = _mm256_set1_ps(lo), va = _mm256_set1_ps(a);
  const __m256 half = _mm256_set1_ps(0.5f);
  auto round8 = [&](const float* p) {
    const __m256 s = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(p), vlo), va);
    return _mm256_cvttps_epi32(_mm256_floor_ps(_mm256_add_ps(s, half)));
  };
  const __m256i i0 = round8(t), i1 = round8(t + 8);
  const __m128i w0 = _mm_packs_epi32(_mm256_castsi256_si128(i0),
                                     _mm256_extracti128_si256(i0, 1));
  const __m128i w1 = _mm_packs_epi32(_mm256_castsi256_si128(i1),
                                     _mm256_extracti128_si256(i1, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(w0, w1));
}

#else

inline void TableRange(const float* t, float* lo, float* hi) {
  float mn = HUGE_VALF, mx = -HUGE_VALF;
  for (size_t i = 0; i < kKsub; ++i) {
    if (t[i] < mn) mn = t[i];
    if (t[i] > mx) mx = t[i];
  }
  *lo = mn;
  *hi = mx;
}

inline void RoundTable(const float* t, float lo, float a, uint8_t* out) {
  for (size_t i = 0; i < kKsub; ++i) {
    out[i] = static_cast<uint8_t>(RoundScaled(t[i], lo, a));
  }
}

#endif  // __AVX2__

}  // namespace

void QuantizeResidualLuts(size_t nprobe, size_t m, size_t m2,
                          const float* luts, const float* biases,
                          uint8_t* luts_q, uint16_t* biases_q, float* a,
                          float* b, std::vector<float>* mins) {
  mins->resize(nprobe * m + nprobe);
  float* table_min = mins->data();
  float* probe_bias = table_min + nprobe * m;  // bias + sum of table minima
  float bias_min = HUGE_VALF;
  for (size_t j = 0; j < nprobe; ++j) {
    if (biases[j] < bias_min) bias_min = biases[j];
  }
  // The widest table and the widest probe (its bias's excess over the
  // smallest plus its tables' spans) set the scale; the sums run in
  // FAISS's order, so they round as its do.
  float max_span_table = -HUGE_VALF, max_span_probe = -HUGE_VALF;
  float lowest = HUGE_VALF;
  for (size_t j = 0; j < nprobe; ++j) {
    float span_probe = biases[j] - bias_min;
    float low = biases[j];
    for (size_t i = 0; i < m; ++i) {
      float lo, hi;
      TableRange(luts + (j * m + i) * kKsub, &lo, &hi);
      table_min[j * m + i] = lo;
      const float span = hi - lo;
      if (span > max_span_table) max_span_table = span;
      span_probe += span;
      low += lo;
    }
    if (span_probe > max_span_probe) max_span_probe = span_probe;
    probe_bias[j] = low;
    if (low < lowest) lowest = low;
  }
  const float scale =
      std::min(255 / max_span_table, 65535 / max_span_probe);
  for (size_t j = 0; j < nprobe; ++j) {
    for (size_t i = 0; i < m; ++i) {
      RoundTable(luts + (j * m + i) * kKsub, table_min[j * m + i], scale,
                 luts_q + (j * m2 + i) * kKsub);
    }
    std::memset(luts_q + (j * m2 + m) * kKsub, 0, kKsub * (m2 - m));
    biases_q[j] = static_cast<uint16_t>(RoundScaled(probe_bias[j], lowest, scale));
  }
  *a = scale;
  *b = lowest;
}

void QuantizeQueryLuts(size_t m, size_t m2, const float* luts,
                       uint8_t* luts_q, float* a, float* b,
                       std::vector<float>* mins) {
  mins->resize(m);
  float* table_min = mins->data();
  // FAISS's order: the widest table, the summed spans and the summed minima
  // accumulate table by table.
  float max_span_table = -HUGE_VALF, max_span_sum = 0, low = 0;
  for (size_t i = 0; i < m; ++i) {
    float lo, hi;
    TableRange(luts + i * kKsub, &lo, &hi);
    table_min[i] = lo;
    const float span = hi - lo;
    max_span_table = std::max(max_span_table, span);
    max_span_sum += span;
    low += lo;
  }
  const float scale = std::min(255 / max_span_table, 65535 / max_span_sum);
  for (size_t i = 0; i < m; ++i) {
    RoundTable(luts + i * kKsub, table_min[i], scale, luts_q + i * kKsub);
  }
  std::memset(luts_q + m * kKsub, 0, kKsub * (m2 - m));
  *a = scale;
  *b = low;
}

bool D4TablesApply(size_t dsub, size_t ksub) {
#if defined(__AVX2__) && defined(__FMA__)
  return dsub == 4 && ksub == kKsub;
#else
  (void)dsub;
  (void)ksub;
  return false;
#endif
}

std::vector<float> CentroidsByDim(const float* centroids, size_t m) {
  std::vector<float> by_dim(m * 4 * kKsub);
  for (size_t j = 0; j < m; ++j) {
    for (size_t c = 0; c < kKsub; ++c) {
      for (size_t t = 0; t < 4; ++t) {
        by_dim[(j * 4 + t) * kKsub + c] = centroids[(j * kKsub + c) * 4 + t];
      }
    }
  }
  return by_dim;
}

void D4DistanceTables(size_t n, const float* x, size_t m,
                      const float* by_dim, float* out) {
#if defined(__AVX2__) && defined(__FMA__)
  for (size_t i = 0; i < n; ++i) {
    const float* xi = x + i * 4 * m;
    float* oi = out + i * m * kKsub;
    for (size_t j = 0; j < m; ++j) {
      const float* c = by_dim + j * 4 * kKsub;
      const __m256 x0 = _mm256_set1_ps(xi[4 * j]);
      const __m256 x1 = _mm256_set1_ps(xi[4 * j + 1]);
      const __m256 x2 = _mm256_set1_ps(xi[4 * j + 2]);
      const __m256 x3 = _mm256_set1_ps(xi[4 * j + 3]);
      for (size_t h = 0; h < kKsub; h += 8) {
        // FAISS's arithmetic: the first square rounded, then three fused
        // multiply-adds in dimension order.
        const __m256 d0 = _mm256_sub_ps(x0, _mm256_loadu_ps(c + h));
        const __m256 d1 = _mm256_sub_ps(x1, _mm256_loadu_ps(c + kKsub + h));
        const __m256 d2 = _mm256_sub_ps(x2, _mm256_loadu_ps(c + 2 * kKsub + h));
        const __m256 d3 = _mm256_sub_ps(x3, _mm256_loadu_ps(c + 3 * kKsub + h));
        __m256 dis = _mm256_mul_ps(d0, d0);
        dis = _mm256_fmadd_ps(d1, d1, dis);
        dis = _mm256_fmadd_ps(d2, d2, dis);
        dis = _mm256_fmadd_ps(d3, d3, dis);
        _mm256_storeu_ps(oi + j * kKsub + h, dis);
      }
    }
  }
#else
  (void)n;
  (void)x;
  (void)m;
  (void)by_dim;
  (void)out;
#endif
}

void D1DistanceTables(size_t n, const float* x, size_t m,
                      const float* centroids, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const float* xi = x + i * m;
    float* oi = out + i * m * kKsub;
    for (size_t j = 0; j < m; ++j) {
      const float* c = centroids + j * kKsub;
      float* o = oi + j * kKsub;
      // FAISS's fvec_op_ny_D1: the difference, then its square.
#if defined(__AVX2__)
      const __m256 xj = _mm256_set1_ps(xi[j]);
      for (size_t h = 0; h < kKsub; h += 8) {
        const __m256 diff = _mm256_sub_ps(xj, _mm256_loadu_ps(c + h));
        _mm256_storeu_ps(o + h, _mm256_mul_ps(diff, diff));
      }
#else
      for (size_t h = 0; h < kKsub; ++h) {
        const float diff = xi[j] - c[h];
        o[h] = diff * diff;
      }
#endif
    }
  }
}

namespace {

// c = a + bf * b, element-wise (FAISS: fvec_madd_avx). bf = -2 makes bf * b
// exact, so the result is the same with or without a fused multiply-add.
void MultiplyAdd(size_t n, const float* __restrict a, float bf,
                 const float* __restrict b, float* __restrict c) {
  size_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 f = _mm256_set1_ps(bf);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(c + i, _mm256_fmadd_ps(f, _mm256_loadu_ps(b + i),
                                            _mm256_loadu_ps(a + i)));
  }
#endif
  for (; i < n; ++i) c[i] = a[i] + bf * b[i];
}

// pq's L2 tables of n vectors (ProductQuantizer::compute_distance_tables),
// by knnd's loop where `by_dim` holds the centroids rearranged for it.
void DistanceTables(const faiss::ProductQuantizer& pq,
                    const std::vector<float>& by_dim, size_t n,
                    const float* x, float* out) {
  if (!by_dim.empty()) {
    D4DistanceTables(n, x, pq.M, by_dim.data(), out);
  } else if (pq.dsub == 1 && pq.ksub == kKsub) {
    D1DistanceTables(n, x, pq.M, pq.centroids.data(), out);
  } else {
    pq.compute_distance_tables(n, x, out);
  }
}

}  // namespace

void ComputeQuantizedLuts(const faiss::IndexIVFPQFastScan& ivf,
                          const std::vector<float>& by_dim, size_t n,
                          const float* x, const int64_t* coarse_ids,
                          const float* coarse_dis, size_t nprobe,
                          QuantizedLuts* out) {
  const faiss::ProductQuantizer& pq = ivf.pq;
  const size_t M = pq.M, ksub = pq.ksub, M2 = ivf.M2, d = ivf.d;
  const size_t dim12 = ksub * M, dim12_2 = ksub * M2;
  const bool l2 = ivf.metric_type == faiss::METRIC_L2;
  out->is_3d = ivf.by_residual && l2;
  out->has_bias = ivf.by_residual;

  const size_t per_query = out->is_3d ? nprobe : 1;
  out->tables.resize(n * per_query * dim12_2);
  if (out->has_bias) out->biases.resize(n * nprobe);
  out->normalizers.resize(2 * n);
  std::vector<float> mins;
  // Quantizes query i's float tables and biases.
  auto quantize = [&](size_t i, const float* tab, const float* bias) {
    if (out->is_3d) {
      QuantizeResidualLuts(
          nprobe, M, M2, tab, bias, out->tables.get() + i * nprobe * dim12_2,
          out->biases.get() + i * nprobe, &out->normalizers[2 * i],
          &out->normalizers[2 * i + 1], &mins);
      return;
    }
    if (!out->has_bias) {
      QuantizeQueryLuts(
          M, M2, tab, out->tables.get() + i * dim12_2,
          &out->normalizers[2 * i], &out->normalizers[2 * i + 1], &mins);
      return;
    }
    faiss::quantize_lut::quantize_LUT_and_bias(
        nprobe, M, ksub, out->is_3d, tab, bias,
        out->tables.get() + i * per_query * dim12_2, M2,
        out->has_bias ? out->biases.get() + i * nprobe : nullptr,
        &out->normalizers[2 * i], &out->normalizers[2 * i + 1]);
  };

  // Float tables and biases (IndexIVFPQFastScan::compute_LUT), for a group
  // of queries at a time, each group's quantized before the next group's:
  // one query where FAISS computes them query by query (sub-vectors under
  // 16 dims: the same values), so that a batch's float tables (3 MiB for 256
  // Fashion-MNIST rows) are never held at once; the whole slice where FAISS
  // multiplies matrices (BLAS), whose tables of at most d / 16
  // sub-quantizers are small.
  const size_t group = pq.dsub < 16 ? 1 : n;
  faiss::AlignedTable<float> ftab;
  if (out->is_3d && ivf.use_precomputed_table == 1) {
    // table(list, x) = precomputed(list) - 2 <x, centroid codes>; the
    // coarse distance is the bias. Built and quantized one query at a
    // time: its nprobe tables stay in cache and the batch's are never
    // held at once.
    faiss::AlignedTable<float> ip(group * dim12);
    ftab.resize(nprobe * dim12);
    for (size_t i = 0; i < n; ++i) {
      if (i % group == 0) {
        pq.compute_inner_prod_tables(std::min(group, n - i), x + i * d,
                                     ip.get());
      }
      for (size_t j = 0; j < nprobe; ++j) {
        float* tab = ftab.get() + j * dim12;
        const int64_t list = coarse_ids[i * nprobe + j];
        if (list < 0) {  // NaNs: ignored by the quantization
          std::memset(tab, -1, sizeof(float) * dim12);
          continue;
        }
        MultiplyAdd(dim12, ivf.precomputed_table.get() + list * dim12, -2.0f,
                    ip.get() + (i % group) * dim12, tab);
      }
      quantize(i, ftab.get(), coarse_dis + i * nprobe);
    }
    return;
  }
  faiss::AlignedTable<float> fbias;
  std::vector<float> residuals;
  for (size_t g0 = 0; g0 < n; g0 += group) {
    const size_t ng = std::min(group, n - g0);
    const float* xg = x + g0 * d;
    if (!ivf.by_residual) {
      ftab.resize(ng * dim12);
      if (l2) {
        DistanceTables(pq, by_dim, ng, xg, ftab.get());
      } else {
        pq.compute_inner_prod_tables(ng, xg, ftab.get());
      }
    } else if (l2) {
      ftab.resize(ng * nprobe * dim12);
      fbias.resize(ng * nprobe);
      residuals.resize(ng * nprobe * d);
      std::memset(fbias.get(), 0, sizeof(float) * ng * nprobe);
      for (size_t ij = 0; ij < ng * nprobe; ++ij) {
        float* r = residuals.data() + ij * d;
        const int64_t list = coarse_ids[g0 * nprobe + ij];
        if (list < 0) {
          std::memset(r, -1, sizeof(float) * d);
        } else {
          ivf.quantizer->compute_residual(xg + (ij / nprobe) * d, r, list);
        }
      }
      DistanceTables(pq, by_dim, ng * nprobe, residuals.data(), ftab.get());
    } else {  // inner product with residuals: coarse similarity is the bias
      ftab.resize(ng * dim12);
      pq.compute_inner_prod_tables(ng, xg, ftab.get());
      fbias.resize(ng * nprobe);
      std::memcpy(fbias.get(), coarse_dis + g0 * nprobe,
                  sizeof(float) * ng * nprobe);
    }
    for (size_t i = 0; i < ng; ++i) {
      quantize(g0 + i, ftab.get() + i * per_query * dim12,
               out->has_bias ? fbias.get() + i * nprobe : nullptr);
    }
  }
}

}  // namespace fastscan_lut
}  // namespace knnd
