#include "knnd/faiss/fastscan_qbs.h"

#include <immintrin.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include <faiss/impl/simd_result_handlers.h>
#include <faiss/utils/ordered_key_value.h>

namespace knnd {
namespace fastscan_qbs {

#if defined(__AVX2__) && defined(__x86_64__)

namespace {

namespace rh = faiss::simd_result_handlers;
using faiss::simd16uint16;

#define KNND_AVX512 __attribute__((target("avx512f,avx512bw")))

// GCC 12's _mm512_extracti64x4_epi64 passes a deliberately undefined
// vector (_mm256_undefined_si256) to its masked builtin, which
// -Wuninitialized reports once inlined under a target attribute; the value
// is never read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// One block of 32 vectors for NQ queries: the distances of vectors 0..15
// and 16..31 of query q go to handler.handle(q, 0, ...), as FAISS's
// kernel_accumulate_block hands them. The queries' tables are read where
// they are, unpacked: query q's nsq tables of 16 entries at
// tables + 16 * nsq * rows[q], so the four tables of two pairs of
// sub-quantizers are 64 consecutive bytes, one load, in the lanes their
// codes take in the 64 code bytes of those two pairs.
//
// accu[q][0] sums each looked-up byte pair as one 16-bit value, accu[q][1]
// the upper bytes alone (vectors 0..15 from the low nibbles); accu[q][2]
// and [3] the same for the high nibbles (vectors 16..31). The lower half
// of a 512-bit sum holds the first pair's lookups, the upper half the
// second's.
template <int NQ, class Handler>
KNND_AVX512 void AccumulateBlock(int nsq, const uint8_t* codes,
                                 const uint8_t* tables, const int* rows,
                                 Handler& handler) {
  const uint8_t* lut[NQ];
  __m512i accu[NQ][4];
  for (int q = 0; q < NQ; ++q) {
    lut[q] = tables + size_t{16} * nsq * rows[q];
    for (int b = 0; b < 4; ++b) accu[q][b] = _mm512_setzero_si512();
  }
  const __m512i mask = _mm512_set1_epi8(0xf);
  const int pairs = nsq / 2;
  int p = 0;
  for (; p + 2 <= pairs; p += 2) {
    const __m512i c = _mm512_loadu_si512(codes + 32 * p);
    const __m512i clo = _mm512_and_si512(c, mask);
    const __m512i chi = _mm512_and_si512(_mm512_srli_epi16(c, 4), mask);
    for (int q = 0; q < NQ; ++q) {
      const __m512i table = _mm512_loadu_si512(lut[q] + 32 * p);
      const __m512i lo = _mm512_shuffle_epi8(table, clo);
      const __m512i hi = _mm512_shuffle_epi8(table, chi);
      accu[q][0] = _mm512_add_epi16(accu[q][0], lo);
      accu[q][1] = _mm512_add_epi16(accu[q][1], _mm512_srli_epi16(lo, 8));
      accu[q][2] = _mm512_add_epi16(accu[q][2], hi);
      accu[q][3] = _mm512_add_epi16(accu[q][3], _mm512_srli_epi16(hi, 8));
    }
  }
  // Both halves into one 256-bit sum each: the order of 16-bit additions
  // changes nothing modulo 2^16.
  __m256i sum[NQ][4];
  for (int q = 0; q < NQ; ++q) {
    for (int b = 0; b < 4; ++b) {
      sum[q][b] = _mm256_add_epi16(_mm512_castsi512_si256(accu[q][b]),
                                   _mm512_extracti64x4_epi64(accu[q][b], 1));
    }
  }
  if (p < pairs) {  // an odd count of pairs: the last one at 256 bits
    const __m256i c =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * p));
    const __m256i mask256 = _mm256_set1_epi8(0xf);
    const __m256i clo = _mm256_and_si256(c, mask256);
    const __m256i chi = _mm256_and_si256(_mm256_srli_epi16(c, 4), mask256);
    for (int q = 0; q < NQ; ++q) {
      const __m256i table = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(lut[q] + 32 * p));
      const __m256i lo = _mm256_shuffle_epi8(table, clo);
      const __m256i hi = _mm256_shuffle_epi8(table, chi);
      sum[q][0] = _mm256_add_epi16(sum[q][0], lo);
      sum[q][1] = _mm256_add_epi16(sum[q][1], _mm256_srli_epi16(lo, 8));
      sum[q][2] = _mm256_add_epi16(sum[q][2], hi);
      sum[q][3] = _mm256_add_epi16(sum[q][3], _mm256_srli_epi16(hi, 8));
    }
  }
  // FAISS's own last steps: the lower bytes' sums, and the two byte lanes
  // of each 16-bit sum into the distances of vectors 0..15 and 16..31.
  for (int q = 0; q < NQ; ++q) {
    simd16uint16 a0(sum[q][0]), a1(sum[q][1]), a2(sum[q][2]), a3(sum[q][3]);
    a0 -= a1 << 8;
    a2 -= a3 << 8;
    handler.handle(q, 0, faiss::combine2x2(a0, a1), faiss::combine2x2(a2, a3));
  }
}

// Up to four groups of queries per block (QBS = 0xQ4Q3Q2Q1), as FAISS's
// accumulate_q_4step: each group's distances into one fixed store, then
// all of them to the handler.
template <int QBS, class Handler>
KNND_AVX512 void AccumulateGroups(size_t ntotal2, int nsq,
                                  const uint8_t* codes, const uint8_t* tables,
                                  const int* rows, Handler& handler) {
  constexpr int Q1 = QBS & 15;
  constexpr int Q2 = (QBS >> 4) & 15;
  constexpr int Q3 = (QBS >> 8) & 15;
  constexpr int Q4 = (QBS >> 12) & 15;
  constexpr int kQueries = Q1 + Q2 + Q3 + Q4;
  for (size_t j0 = 0; j0 < ntotal2; j0 += 32) {
    rh::FixedStorageHandler<kQueries, 2> store;
    AccumulateBlock<Q1>(nsq, codes, tables, rows, store);
    if constexpr (Q2 > 0) {
      store.set_block_origin(Q1, 0);
      AccumulateBlock<Q2>(nsq, codes, tables, rows + Q1, store);
    }
    if constexpr (Q3 > 0) {
      store.set_block_origin(Q1 + Q2, 0);
      AccumulateBlock<Q3>(nsq, codes, tables, rows + Q1 + Q2, store);
    }
    if constexpr (Q4 > 0) {
      store.set_block_origin(Q1 + Q2 + Q3, 0);
      AccumulateBlock<Q4>(nsq, codes, tables, rows + Q1 + Q2 + Q3, store);
    }
    handler.set_block_origin(0, j0);
    store.to_other_handler(handler);
    codes += 32 * nsq / 2;
  }
}

// A qbs outside FAISS's list (pq4_preferred_qbs gives none): one group at
// a time, straight to the handler.
template <class Handler>
KNND_AVX512 void AccumulateAnyQbs(int qbs, size_t ntotal2, int nsq,
                                  const uint8_t* codes, const uint8_t* tables,
                                  const int* rows, Handler& handler) {
  for (size_t j0 = 0; j0 < ntotal2; j0 += 32) {
    int i0 = 0;
    for (int rest = qbs; rest != 0; rest >>= 4) {
      const int nq = rest & 15;
      handler.set_block_origin(i0, j0);
      switch (nq) {
        case 1:
          AccumulateBlock<1>(nsq, codes, tables, rows + i0, handler);
          break;
        case 2:
          AccumulateBlock<2>(nsq, codes, tables, rows + i0, handler);
          break;
        case 3:
          AccumulateBlock<3>(nsq, codes, tables, rows + i0, handler);
          break;
        case 4:
          AccumulateBlock<4>(nsq, codes, tables, rows + i0, handler);
          break;
        default:
          throw std::invalid_argument("FastScan query group of " +
                                      std::to_string(nq) + " (1 to 4)");
      }
      i0 += nq;
    }
    codes += 32 * nsq / 2;
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

bool CpuRunsAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw");
}

}  // namespace

bool UsesAvx512() {
  // KNND_FASTSCAN_AVX512=0: FAISS's kernel even here (A/B runs, or a CPU
  // whose AVX-512 runs slower than its AVX2).
  static const bool uses = [] {
    const char* env = std::getenv("KNND_FASTSCAN_AVX512");
    return CpuRunsAvx512() && !(env != nullptr && std::string(env) == "0");
  }();
  return uses;
}

template <class Handler>
void AccumulateAvx512(int qbs, size_t ntotal2, int nsq, const uint8_t* codes,
                      const uint8_t* tables, const int* rows,
                      Handler& handler) {
  switch (qbs) {
#define KNND_QBS(QBS)                                                  \
  case QBS:                                                            \
    AccumulateGroups<QBS>(ntotal2, nsq, codes, tables, rows, handler); \
    return;
    // FAISS's list (pq4_accumulate_loop_qbs), 12 queries down to 1.
    KNND_QBS(0x3333) KNND_QBS(0x2333) KNND_QBS(0x2233) KNND_QBS(0x333)
    KNND_QBS(0x2223) KNND_QBS(0x233) KNND_QBS(0x1223) KNND_QBS(0x223)
    KNND_QBS(0x34) KNND_QBS(0x133) KNND_QBS(0x6) KNND_QBS(0x33)
    KNND_QBS(0x123) KNND_QBS(0x222) KNND_QBS(0x23) KNND_QBS(0x5)
    KNND_QBS(0x13) KNND_QBS(0x22) KNND_QBS(0x4) KNND_QBS(0x3)
    KNND_QBS(0x21) KNND_QBS(0x2) KNND_QBS(0x1)
#undef KNND_QBS
  }
  AccumulateAnyQbs(qbs, ntotal2, nsq, codes, tables, rows, handler);
}

#else  // no AVX2 FAISS build: FAISS's kernel everywhere

bool UsesAvx512() { return false; }

template <class Handler>
void AccumulateAvx512(int, size_t, int, const uint8_t*, const uint8_t*,
                      const int*, Handler&) {
  throw std::logic_error(
      "knnd's AVX-512 FastScan kernel is built only with the AVX2 FAISS");
}

#endif

// The handlers fastscan_search.cc scans with (k == 1, k <= 20, k > 20; L2
// and inner product).
namespace rh_types = faiss::simd_result_handlers;
using MaxC = faiss::CMax<uint16_t, int64_t>;
using MinC = faiss::CMin<uint16_t, int64_t>;
#define KNND_INSTANTIATE(H)                                               \
  template void AccumulateAvx512<H>(int, size_t, int, const uint8_t*,     \
                                    const uint8_t*, const int*, H&);
using SingleMax = rh_types::SingleResultHandler<MaxC, true>;
using HeapMax = rh_types::HeapHandler<MaxC, true>;
using ReservoirMax = rh_types::ReservoirHandler<MaxC, true>;
using SingleMin = rh_types::SingleResultHandler<MinC, true>;
using HeapMin = rh_types::HeapHandler<MinC, true>;
using ReservoirMin = rh_types::ReservoirHandler<MinC, true>;
KNND_INSTANTIATE(SingleMax)
KNND_INSTANTIATE(HeapMax)
KNND_INSTANTIATE(ReservoirMax)
KNND_INSTANTIATE(SingleMin)
KNND_INSTANTIATE(HeapMin)
KNND_INSTANTIATE(ReservoirMin)
#undef KNND_INSTANTIATE

}  // namespace fastscan_qbs
}  // namespace knnd
