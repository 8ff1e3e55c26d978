#include "knnd/faiss/vector_math.h"

#include <algorithm>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <faiss/utils/distances.h>
#include <faiss/utils/fp16.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/exact_scan.h"
#include "knnd/faiss/faiss_types.h"

namespace knnd {

namespace {

using DistanceFn = float (*)(const float*, const float*, size_t);

#if defined(__x86_64__) && defined(__GNUC__)
// AVX-512 kernels, chosen at run time where the CPU has AVX-512F (this file
// is compiled for any x86-64; FAISS's are compiled for AVX2 at most).

// 16 values of a row as 16 floats: float32 read as they are, float16
// converted (exact; the zero-masked form: GCC 12 warns on the plain one's
// "undefined" operand under -Werror).
__attribute__((target("avx512f"), always_inline)) inline __m512 Load16(
    const float* p) {
  return _mm512_loadu_ps(p);
}
__attribute__((target("avx512f"), always_inline)) inline __m512 Load16(
    const uint16_t* p) {
  return _mm512_maskz_cvtph_ps(
      static_cast<__mmask16>(0xffff),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// The first `left` (< 16, mask m) values, the lanes past them zero.
__attribute__((target("avx512f"), always_inline)) inline __m512 LoadFirst(
    const float* p, size_t, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
__attribute__((target("avx512f"), always_inline)) inline __m512 LoadFirst(
    const uint16_t* p, size_t left, __mmask16) {
  // Copied out: a masked 16-bit load needs AVX-512BW.
  alignas(32) uint16_t tail[16] = {};
  std::copy_n(p, left, tail);
  return Load16(tail);
}

// Distances of `a` to R rows at once (R = 1: one row). Two accumulators
// of 16 lanes per row: a single chain of fused multiply-adds left a row
// waiting on their latency; lanes past dim are zero on both sides, and no
// row is read past its end. Each row's arithmetic is the same for every R,
// so its result does not depend on the rows beside it. Re-ranking's rows
// lie at random places of the mapped vectors file: read one after another,
// each row's misses waited on its own; R rows' loads interleaved keep R
// rows' reads in flight: 1.05x to 1.15x the queries/s of whole searches
// (bench/RESULTS.md "Re-ranking eight rows at a time"). Float16 rows are
// converted in registers, so only their halves are read.
template <int R, bool kL2, typename Row>
__attribute__((target("avx512f"))) void RowsAvx512(const float* a,
                                                   const Row* const* b,
                                                   size_t dim, float* out) {
  __m512 s0[R], s1[R];
  for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= dim; i += 32) {
    const __m512 x0 = _mm512_loadu_ps(a + i);
    const __m512 x1 = _mm512_loadu_ps(a + i + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512 y0 = Load16(b[r] + i);
      __m512 y1 = Load16(b[r] + i + 16);
      __m512 z0 = x0, z1 = x1;
      if (kL2) {
        z0 = _mm512_sub_ps(x0, y0);
        z1 = _mm512_sub_ps(x1, y1);
        y0 = z0;
        y1 = z1;
      }
      s0[r] = _mm512_fmadd_ps(z0, y0, s0[r]);
      s1[r] = _mm512_fmadd_ps(z1, y1, s1[r]);
    }
  }
  for (; i < dim; i += 16) {
    const size_t left = std::min<size_t>(16, dim - i);
    const __mmask16 m = left == 16
                            ? static_cast<__mmask16>(0xffff)
                            : static_cast<__mmask16>((1u << left) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, a + i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512 y = LoadFirst(b[r] + i, left, m);
      __m512 z = x;
      if (kL2) {
        z = _mm512_sub_ps(x, y);
        y = z;
      }
      s0[r] = _mm512_fmadd_ps(z, y, s0[r]);
    }
  }
  // Summed from memory: GCC 12 warns inside the AVX-512 reduction and
  // lane-extraction intrinsics (their "undefined" operand) under -Werror.
  for (int r = 0; r < R; ++r) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_add_ps(s0[r], s1[r]));
    float sum = 0;
    for (float lane : lanes) sum += lane;
    out[r] = sum;
  }
}

template <bool kL2, typename Row>
__attribute__((target("avx512f"))) void ManyAvx512(const float* a,
                                                   const Row* const* rows,
                                                   size_t n, size_t dim,
                                                   float* out) {
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    RowsAvx512<8, kL2>(a, rows + j, dim, out + j);
  }
  if (j + 4 <= n) {
    RowsAvx512<4, kL2>(a, rows + j, dim, out + j);
    j += 4;
  }
  for (; j < n; ++j) RowsAvx512<1, kL2>(a, rows + j, dim, out + j);
}

template <bool kL2>
__attribute__((target("avx512f"))) float DistanceAvx512(const float* a,
                                                        const float* b,
                                                        size_t dim) {
  float out;
  RowsAvx512<1, kL2>(a, &b, dim, &out);
  return out;
}
#endif

float FaissL2(const float* a, const float* b, size_t dim) {
  return faiss::fvec_L2sqr(a, b, dim);
}

float FaissInnerProduct(const float* a, const float* b, size_t dim) {
  return faiss::fvec_inner_product(a, b, dim);
}

// The kernel for this CPU, picked once.
DistanceFn Pick(bool l2) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) {
    return l2 ? DistanceAvx512<true> : DistanceAvx512<false>;
  }
#endif
  return l2 ? FaissL2 : FaissInnerProduct;
}

// Without AVX-512: one row at a time through L2Squared / InnerProduct,
// float16 rows decoded first (HalvesToFloats).
template <bool kL2>
float OneRow(const float* a, const float* row, size_t dim) {
  return kL2 ? L2Squared(a, row, dim) : InnerProduct(a, row, dim);
}
template <bool kL2>
float OneRow(const float* a, const uint16_t* row, size_t dim) {
  thread_local std::vector<float> decoded;
  decoded.resize(dim);
  HalvesToFloats(row, dim, decoded.data());
  return OneRow<kL2>(a, decoded.data(), dim);
}

template <bool kL2, typename Row>
void OneAtATime(const float* a, const Row* const* rows, size_t n, size_t dim,
                float* out) {
  for (size_t j = 0; j < n; ++j) out[j] = OneRow<kL2>(a, rows[j], dim);
}

template <typename Row>
using ManyFn = void (*)(const float*, const Row* const*, size_t, size_t,
                        float*);

template <typename Row>
ManyFn<Row> PickMany(bool l2) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) {
    return l2 ? ManyAvx512<true, Row> : ManyAvx512<false, Row>;
  }
#endif
  return l2 ? OneAtATime<true, Row> : OneAtATime<false, Row>;
}

template <typename Row>
void Many(Metric metric, const float* a, const Row* const* rows, size_t n,
          size_t dim, float* out) {
  static const ManyFn<Row> l2 = PickMany<Row>(true);
  static const ManyFn<Row> ip = PickMany<Row>(false);
  (metric == Metric::kL2 ? l2 : ip)(a, rows, n, dim, out);
}

}  // namespace

void ExactDistances(Metric metric, const float* a, const float* const* rows,
                    size_t n, size_t dim, float* out) {
  Many(metric, a, rows, n, dim, out);
}

void ExactDistances(Metric metric, const float* a,
                    const uint16_t* const* rows, size_t n, size_t dim,
                    float* out) {
  Many(metric, a, rows, n, dim, out);
}

float L2Squared(const float* a, const float* b, size_t dim) {
  static const DistanceFn fn = Pick(true);
  return fn(a, b, dim);
}

float InnerProduct(const float* a, const float* b, size_t dim) {
  static const DistanceFn fn = Pick(false);
  return fn(a, b, dim);
}

void NormalizeRows(float* values, int64_t rows, int dim) {
  if (rows <= 0 || dim <= 0) return;
  faiss::fvec_renorm_L2(static_cast<size_t>(dim), static_cast<size_t>(rows),
                        values);
}

uint16_t FloatToHalf(float value) { return faiss::encode_fp16(value); }

float HalfToFloat(uint16_t half) { return faiss::decode_fp16(half); }

namespace {

void HalvesToFloatsScalar(const uint16_t* halves, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = faiss::decode_fp16(halves[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
// Eight halves at a time with F16C's conversion, which is exact (every half
// is a float), as FAISS's scalar decode is: re-ranking over a float16
// vectors file decodes every candidate row (60 rows of 384 halves a query
// took longer to decode than to read).
__attribute__((target("avx,f16c"))) void HalvesToFloatsF16c(
    const uint16_t* halves, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(halves + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  HalvesToFloatsScalar(halves + i, n - i, out + i);
}
#endif

using HalvesFn = void (*)(const uint16_t*, size_t, float*);

HalvesFn PickHalves() {
#if defined(__x86_64__) && defined(__GNUC__)
  // F16C from CPUID leaf 1 (ECX bit 29): clang 14 (the fuzz build) has no
  // "f16c" for __builtin_cpu_supports; "avx" covers the OS's YMM state.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 &&
                    (ecx & (1u << 29)) != 0;
  if (__builtin_cpu_supports("avx") && f16c) return HalvesToFloatsF16c;
#endif
  return HalvesToFloatsScalar;
}

}  // namespace

void HalvesToFloats(const uint16_t* halves, size_t n, float* out) {
  static const HalvesFn fn = PickHalves();
  fn(halves, n, out);
}

absl::Status ExactKnn(const float* base, int64_t rows, const float* queries,
                      int64_t num_queries, int dim, int k, Metric metric,
                      float* distances, int64_t* ids) {
  // ExactScan reads `base` in place (IndexFlat::add would copy it whole)
  // and keeps one OpenMP region for the scan.
  return faiss_types::CatchFaiss(
      absl::StatusCode::kInternal, "exact search failed", [&] {
        ExactScan scan(queries, num_queries, dim, k, metric);
        scan.Add(base, rows);
        std::copy(scan.ids().begin(), scan.ids().end(), ids);
        std::copy(scan.distances().begin(), scan.distances().end(),
                  distances);
      });
}

}  // namespace knnd
