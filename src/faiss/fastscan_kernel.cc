#include "knnd/faiss/fastscan_kernel.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <type_traits>
#include <vector>

#include <faiss/impl/simd_result_handlers.h>
#include <faiss/utils/Heap.h>

namespace knnd {
namespace fastscan_kernel {
namespace {

constexpr size_t kBlock = 32;

// Position of vector v (< 32) of sub-quantizer sq inside a block's pair of
// sub-quantizers: byte index (0..31) and whether it is the high nibble.
inline void Slot(size_t v, size_t sq, size_t* byte, bool* high) {
  const size_t w = v & 15;  // vectors v and v + 16 share a byte
  *high = v >= 16;
  *byte = (sq & 1) * 16 + (w < 8 ? 2 * w : 2 * (w - 8) + 1);
}

#if defined(__AVX2__)

// Distances of vectors 0..15 (lo) and 16..31 (hi) of one block.
inline void BlockDistancesAvx2(const uint8_t* block, size_t m2,
                               const uint8_t* lut, uint16_t bias,
                               __m256i* lo, __m256i* hi) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i low_byte = _mm256_set1_epi16(0x00ff);
  // Per 16-bit element i of each 128-bit lane (lane 0: even sub-quantizers,
  // lane 1: odd ones): the even byte is vector i, the odd byte vector 8 + i
  // (low nibbles), or vectors 16 + i and 24 + i (high nibbles).
  __m256i sum_v0 = _mm256_setzero_si256();   // vectors 0..7
  __m256i sum_v8 = _mm256_setzero_si256();   // vectors 8..15
  __m256i sum_v16 = _mm256_setzero_si256();  // vectors 16..23
  __m256i sum_v24 = _mm256_setzero_si256();  // vectors 24..31
  for (size_t p = 0; p < m2 / 2; ++p) {
    const __m256i codes = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(block + 32 * p));
    const __m256i table =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lut + 32 * p));
    const __m256i first = _mm256_and_si256(codes, nibble);
    const __m256i second = _mm256_and_si256(_mm256_srli_epi16(codes, 4), nibble);
    const __m256i d_first = _mm256_shuffle_epi8(table, first);
    const __m256i d_second = _mm256_shuffle_epi8(table, second);
    sum_v0 = _mm256_add_epi16(sum_v0, _mm256_and_si256(d_first, low_byte));
    sum_v8 = _mm256_add_epi16(sum_v8, _mm256_srli_epi16(d_first, 8));
    sum_v16 = _mm256_add_epi16(sum_v16, _mm256_and_si256(d_second, low_byte));
    sum_v24 = _mm256_add_epi16(sum_v24, _mm256_srli_epi16(d_second, 8));
  }
  // Add the two lanes (even + odd sub-quantizers) of each sum and lay the
  // vectors out in order.
  const __m256i b = _mm256_set1_epi16(static_cast<int16_t>(bias));
  *lo = _mm256_add_epi16(
      _mm256_add_epi16(_mm256_permute2x128_si256(sum_v0, sum_v8, 0x20),
                       _mm256_permute2x128_si256(sum_v0, sum_v8, 0x31)),
      b);
  *hi = _mm256_add_epi16(
      _mm256_add_epi16(_mm256_permute2x128_si256(sum_v16, sum_v24, 0x20),
                       _mm256_permute2x128_si256(sum_v16, sum_v24, 0x31)),
      b);
}

// Two bits (2v, 2v + 1) set for every vector v whose distance beats thr.
template <bool kKeepMin>
inline uint64_t BeatMask(__m256i lo, __m256i hi, uint16_t thr) {
  const __m256i t = _mm256_set1_epi16(static_cast<int16_t>(thr));
  __m256i not_lo, not_hi;  // distance does not beat thr
  if (kKeepMin) {          // beats: d < thr, i.e. not max(d, thr) == d
    not_lo = _mm256_cmpeq_epi16(_mm256_max_epu16(lo, t), lo);
    not_hi = _mm256_cmpeq_epi16(_mm256_max_epu16(hi, t), hi);
  } else {  // beats: d > thr
    not_lo = _mm256_cmpeq_epi16(_mm256_min_epu16(lo, t), lo);
    not_hi = _mm256_cmpeq_epi16(_mm256_min_epu16(hi, t), hi);
  }
  const uint64_t m_lo = ~static_cast<uint32_t>(_mm256_movemask_epi8(not_lo));
  const uint64_t m_hi = ~static_cast<uint32_t>(_mm256_movemask_epi8(not_hi));
  return (m_lo & 0xffffffffULL) | (m_hi << 32);
}

#endif  // __AVX2__

}  // namespace

void BlockDistancesScalar(const uint8_t* block, size_t m2, const uint8_t* lut,
                          uint16_t bias, uint16_t out[32]) {
  for (size_t v = 0; v < kBlock; ++v) {
    uint16_t d = bias;
    for (size_t sq = 0; sq < m2; ++sq) {
      size_t byte;
      bool high;
      Slot(v, sq, &byte, &high);
      const uint8_t b = block[(sq / 2) * 32 + byte];
      const uint8_t code = high ? b >> 4 : b & 15;
      d = static_cast<uint16_t>(d + lut[16 * sq + code]);
    }
    out[v] = d;
  }
}

void CopyPackedCode(const uint8_t* from, size_t from_v, uint8_t* to,
                    size_t to_v, size_t m2) {
  for (size_t sq = 0; sq < m2; ++sq) {
    size_t from_byte, to_byte;
    bool from_high, to_high;
    Slot(from_v, sq, &from_byte, &from_high);
    Slot(to_v, sq, &to_byte, &to_high);
    const uint8_t b = from[(sq / 2) * 32 + from_byte];
    const uint8_t code = from_high ? b >> 4 : b & 15;
    uint8_t& out = to[(sq / 2) * 32 + to_byte];
    out = to_high ? static_cast<uint8_t>((out & 0x0f) | (code << 4))
                  : static_cast<uint8_t>((out & 0xf0) | code);
  }
}

void BlockDistances(const uint8_t* block, size_t m2, const uint8_t* lut,
                    uint16_t bias, uint16_t out[32]) {
#if defined(__AVX2__)
  __m256i lo, hi;
  BlockDistancesAvx2(block, m2, lut, bias, &lo, &hi);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), lo);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), hi);
#else
  BlockDistancesScalar(block, m2, lut, bias, out);
#endif
}

namespace {

// Whether list id `id` is in the filter: the bitmap's bit, inline, or
// IdFilter::Contains for the other kinds.
struct BitmapTest {
  const RowBitmap* rows;
  int64_t first;
  bool operator()(int64_t id) const { return rows->Test(id - first); }
};
struct RangeTest {
  const ColumnRange* range;
  int64_t first;
  bool operator()(int64_t id) const {
    return range->TestWithoutBranches(id - first);
  }
};
struct FilterTest {
  const IdFilter* filter;
  bool operator()(int64_t id) const { return filter->Contains(id); }
};

// What a scan offers its candidates to, one query's best k so far: FAISS's
// heap (a candidate goes in where it beats the top) or its reservoir (where
// it beats the threshold). Bound() is what a candidate must beat.
template <bool kKeepMin>
struct HeapTop {
  using C = HeapOf<kKeepMin>;
  size_t k;
  uint16_t* dis;
  int64_t* ids;
  uint16_t Bound() const { return dis[0]; }
  void Add(uint16_t d, int64_t id) {
    faiss::heap_replace_top<C>(k, dis, ids, d, id);
  }
};

template <bool kKeepMin>
struct ReservoirTop {
  ReservoirOf<kKeepMin>* reservoir;
  uint16_t Bound() const { return reservoir->threshold; }
  void Add(uint16_t d, int64_t id) { reservoir->add(d, id); }
};

// One block's scan (vectors j0 .. j0 + valid of the list, codes at
// `block`): with kPremask, `admitted` holds the block's admitted vectors;
// else only the vectors that beat the top are tested.
template <bool kKeepMin, bool kPremask, class Admits, class Top>
inline void ScanBlock(const uint8_t* block, size_t j0, size_t valid,
                      uint32_t admitted, const int64_t* ids, size_t m2,
                      const uint8_t* lut, uint16_t bias, const Admits& admits,
                      Top& top) {
  using C = HeapOf<kKeepMin>;
  alignas(32) uint16_t dis[kBlock];
#if defined(__AVX2__)
  __m256i lo, hi;
  BlockDistancesAvx2(block, m2, lut, bias, &lo, &hi);
  uint64_t mask = BeatMask<kKeepMin>(lo, hi, top.Bound());
  if (valid < kBlock) mask &= (uint64_t{1} << (2 * valid)) - 1;
  if (mask == 0) return;
  _mm256_store_si256(reinterpret_cast<__m256i*>(dis), lo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(dis + 16), hi);
  if (!kPremask) {
    // The filter of every candidate first, in a loop whose reads do not
    // wait on each other (a column's values at random rows miss the
    // cache: their misses overlap), then the top.
    for (uint64_t m = mask; m != 0;) {
      const size_t v = static_cast<size_t>(__builtin_ctzll(m)) >> 1;
      m &= ~(uint64_t{3} << (2 * v));
      admitted |= static_cast<uint32_t>(admits(ids[j0 + v])) << v;
    }
  }
  // The admitted vectors that beat the top at the block's start, in
  // order; the top moves as they go in.
  while (admitted != 0) {
    const size_t v = static_cast<size_t>(__builtin_ctz(admitted));
    admitted &= admitted - 1;
    if ((mask >> (2 * v) & 1) == 0) continue;
#else
  BlockDistancesScalar(block, m2, lut, bias, dis);
  for (size_t v = 0; v < valid; ++v) {
    if (kPremask && (admitted >> v & 1) == 0) continue;
#endif
    const uint16_t d = dis[v];
    if (!C::cmp(top.Bound(), d)) continue;
    const int64_t id = ids[j0 + v];
#if !defined(__AVX2__)
    if (!kPremask && !admits(id)) continue;
#endif
    top.Add(d, id);
  }
}

// Blocks whose codes are requested ahead of their scan in a sparse
// filter's list.
constexpr size_t kBlocksAhead = 4;
// Ids read ahead of their test.
constexpr size_t kIdsAhead = 4 * kBlock;

inline void PrefetchBlock(const uint8_t* block, size_t bytes) {
#if defined(__AVX2__)
  for (size_t b = 0; b < bytes; b += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(block) + b, _MM_HINT_T0);
  }
#else
  (void)block;
  (void)bytes;
#endif
}

// One list's scan. kPremask (a sparse filter: at 1% of the rows, 73% of
// 32-vector blocks hold none): every block's ids are tested first, then
// only the blocks holding an admitted vector are scanned, each one's codes
// requested kBlocksAhead blocks before its turn (the skipped blocks break
// the sequential reads the hardware prefetcher follows: the codes' loads
// were ~40% of such a scan). Else every block, and only the vectors that
// beat the top are tested.
template <bool kKeepMin, bool kPremask, class Admits, class Top>
void ScanList(const uint8_t* codes, size_t n, const int64_t* ids, size_t m2,
              const uint8_t* lut, uint16_t bias, const Admits& admits,
              Top& top) {
  const size_t block_bytes = 16 * m2;
  if (!kPremask) {
    for (size_t j0 = 0; j0 < n; j0 += kBlock, codes += block_bytes) {
      const size_t valid = n - j0 < kBlock ? n - j0 : kBlock;
      ScanBlock<kKeepMin, false>(codes, j0, valid, 0, ids, m2, lut, bias,
                                 admits, top);
    }
    return;
  }
  // (block << 32) | its admitted vectors, for the blocks holding one.
  thread_local std::vector<uint64_t> found;
  found.clear();
  for (size_t j0 = 0; j0 < n; j0 += kBlock) {
    const size_t valid = n - j0 < kBlock ? n - j0 : kBlock;
    if (j0 + kIdsAhead < n) {
      PrefetchBlock(reinterpret_cast<const uint8_t*>(ids + j0 + kIdsAhead),
                    kBlock * sizeof(int64_t));
    }
    uint32_t admitted = 0;
    for (size_t v = 0; v < valid; ++v) {
      admitted |= static_cast<uint32_t>(admits(ids[j0 + v])) << v;
    }
    if (admitted != 0) found.push_back(uint64_t{j0 / kBlock} << 32 | admitted);
  }
  for (size_t i = 0; i < std::min(found.size(), kBlocksAhead); ++i) {
    PrefetchBlock(codes + (found[i] >> 32) * block_bytes, block_bytes);
  }
  for (size_t i = 0; i < found.size(); ++i) {
    if (i + kBlocksAhead < found.size()) {
      PrefetchBlock(codes + (found[i + kBlocksAhead] >> 32) * block_bytes,
                    block_bytes);
    }
    const size_t j0 = (found[i] >> 32) * kBlock;
    const size_t valid = n - j0 < kBlock ? n - j0 : kBlock;
    ScanBlock<kKeepMin, true>(codes + (found[i] >> 32) * block_bytes, j0,
                              valid, static_cast<uint32_t>(found[i]), ids, m2,
                              lut, bias, admits, top);
  }
}

// ScanList with the filter's test for `filter`'s kind.
template <bool kKeepMin, class Top>
void ScanListOf(const uint8_t* codes, size_t n, const int64_t* ids, size_t m2,
                const uint8_t* lut, uint16_t bias, const IdFilter& filter,
                Top& top) {
  if (filter.range() != nullptr) {
    ScanList<kKeepMin, false>(codes, n, ids, m2, lut, bias,
                              RangeTest{filter.range(), filter.first()}, top);
    return;
  }
  if (filter.bitmap() == nullptr) {
    ScanList<kKeepMin, false>(codes, n, ids, m2, lut, bias,
                              FilterTest{&filter}, top);
    return;
  }
  const BitmapTest bits{filter.bitmap(), filter.first()};
  if (filter.sparse()) {
    ScanList<kKeepMin, true>(codes, n, ids, m2, lut, bias, bits, top);
  } else {
    ScanList<kKeepMin, false>(codes, n, ids, m2, lut, bias, bits, top);
  }
}

// Vectors [begin, end) of dense blocks, every one admitted.
template <bool kKeepMin, class Top>
void ScanRows(const uint8_t* codes, size_t begin, size_t end,
              const int64_t* ids, size_t m2, const uint8_t* lut,
              uint16_t bias, Top& top) {
  using C = HeapOf<kKeepMin>;
  const size_t block_bytes = 16 * m2;
  alignas(32) uint16_t dis[kBlock];
  for (size_t j0 = begin / kBlock * kBlock; j0 < end; j0 += kBlock) {
    // Vectors [lo, hi) of this block are in the range.
    const size_t lo = begin > j0 ? begin - j0 : 0;
    const size_t hi = end - j0 < kBlock ? end - j0 : kBlock;
    const uint8_t* block = codes + (j0 / kBlock) * block_bytes;
#if defined(__AVX2__)
    __m256i lo_d, hi_d;
    BlockDistancesAvx2(block, m2, lut, bias, &lo_d, &hi_d);
    uint64_t mask = BeatMask<kKeepMin>(lo_d, hi_d, top.Bound());
    const uint64_t below_hi =
        hi == kBlock ? ~uint64_t{0} : (uint64_t{1} << (2 * hi)) - 1;
    mask &= below_hi & ~((uint64_t{1} << (2 * lo)) - 1);
    if (mask == 0) continue;
    _mm256_store_si256(reinterpret_cast<__m256i*>(dis), lo_d);
    _mm256_store_si256(reinterpret_cast<__m256i*>(dis + 16), hi_d);
    while (mask != 0) {
      const size_t v = static_cast<size_t>(__builtin_ctzll(mask)) >> 1;
      mask &= ~(uint64_t{3} << (2 * v));
#else
    BlockDistancesScalar(block, m2, lut, bias, dis);
    for (size_t v = lo; v < hi; ++v) {
#endif
      const uint16_t d = dis[v];
      if (!C::cmp(top.Bound(), d)) continue;
      top.Add(d, ids[j0 + v]);
    }
  }
}

}  // namespace

template <bool kKeepMin>
void ScanListFiltered(const uint8_t* codes, size_t n, const int64_t* ids,
                      size_t m2, const uint8_t* lut, uint16_t bias,
                      const IdFilter& filter, size_t k, uint16_t* heap_dis,
                      int64_t* heap_ids) {
  HeapTop<kKeepMin> top{k, heap_dis, heap_ids};
  ScanListOf<kKeepMin>(codes, n, ids, m2, lut, bias, filter, top);
}

template <bool kKeepMin>
void ScanListFiltered(const uint8_t* codes, size_t n, const int64_t* ids,
                      size_t m2, const uint8_t* lut, uint16_t bias,
                      const IdFilter& filter, ReservoirOf<kKeepMin>& reservoir) {
  ReservoirTop<kKeepMin> top{&reservoir};
  ScanListOf<kKeepMin>(codes, n, ids, m2, lut, bias, filter, top);
}

template <bool kKeepMin>
void ScanRowsAdmitted(const uint8_t* codes, size_t begin, size_t end,
                      const int64_t* ids, size_t m2, const uint8_t* lut,
                      uint16_t bias, size_t k, uint16_t* heap_dis,
                      int64_t* heap_ids) {
  HeapTop<kKeepMin> top{k, heap_dis, heap_ids};
  ScanRows<kKeepMin>(codes, begin, end, ids, m2, lut, bias, top);
}

template <bool kKeepMin>
void ScanRowsAdmitted(const uint8_t* codes, size_t begin, size_t end,
                      const int64_t* ids, size_t m2, const uint8_t* lut,
                      uint16_t bias, ReservoirOf<kKeepMin>& reservoir) {
  ReservoirTop<kKeepMin> top{&reservoir};
  ScanRows<kKeepMin>(codes, begin, end, ids, m2, lut, bias, top);
}

template void ScanRowsAdmitted<true>(const uint8_t*, size_t, size_t,
                                     const int64_t*, size_t, const uint8_t*,
                                     uint16_t, size_t, uint16_t*, int64_t*);
template void ScanRowsAdmitted<false>(const uint8_t*, size_t, size_t,
                                      const int64_t*, size_t, const uint8_t*,
                                      uint16_t, size_t, uint16_t*, int64_t*);
template void ScanListFiltered<true>(const uint8_t*, size_t, const int64_t*,
                                     size_t, const uint8_t*, uint16_t,
                                     const IdFilter&, size_t, uint16_t*,
                                     int64_t*);
template void ScanListFiltered<false>(const uint8_t*, size_t, const int64_t*,
                                      size_t, const uint8_t*, uint16_t,
                                      const IdFilter&, size_t, uint16_t*,
                                      int64_t*);
template void ScanListFiltered<true>(const uint8_t*, size_t, const int64_t*,
                                     size_t, const uint8_t*, uint16_t,
                                     const IdFilter&, ReservoirOf<true>&);
template void ScanListFiltered<false>(const uint8_t*, size_t, const int64_t*,
                                      size_t, const uint8_t*, uint16_t,
                                      const IdFilter&, ReservoirOf<false>&);
template void ScanRowsAdmitted<true>(const uint8_t*, size_t, size_t,
                                     const int64_t*, size_t, const uint8_t*,
                                     uint16_t, ReservoirOf<true>&);
template void ScanRowsAdmitted<false>(const uint8_t*, size_t, size_t,
                                      const int64_t*, size_t, const uint8_t*,
                                      uint16_t, ReservoirOf<false>&);

}  // namespace fastscan_kernel
}  // namespace knnd
