// knnd's FastScan kernel against a direct computation from unpacked codes
// packed by FAISS (pq4_pack_codes).
#include "knnd/faiss/fastscan_kernel.h"

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <faiss/impl/pq4_fast_scan.h>
#include <faiss/impl/simd_result_handlers.h>
#include <faiss/utils/Heap.h>

#include "knnd/base/row_bitmap.h"
#include "knnd/faiss/id_filter.h"
#include "knnd/faiss/search_args.h"

namespace knnd {
namespace {

struct Packed {
  size_t m2;
  size_t n;
  std::vector<uint8_t> flat;    // n x ceil(M/2) bytes, 2 codes per byte
  std::vector<uint8_t> blocks;  // packed, round_up(n, 32) * m2 / 2 bytes
  std::vector<uint8_t> lut;     // m2 x 16
};

Packed MakePacked(size_t m, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Packed p;
  p.m2 = (m + 1) / 2 * 2;
  p.n = n;
  const size_t bytes_per_code = (m + 1) / 2;
  p.flat.resize(n * bytes_per_code);
  for (auto& b : p.flat) b = static_cast<uint8_t>(rng());
  if (m % 2 == 1) {  // the unused high nibble of the last byte
    for (size_t i = 0; i < n; ++i) p.flat[i * bytes_per_code + m / 2] &= 15;
  }
  const size_t nb = (n + 31) / 32 * 32;
  p.blocks.resize(nb * p.m2 / 2);
  faiss::pq4_pack_codes(p.flat.data(), n, m, nb, 32, p.m2, p.blocks.data());
  p.lut.resize(p.m2 * 16);
  for (auto& v : p.lut) v = static_cast<uint8_t>(rng());
  for (size_t sq = m; sq < p.m2; ++sq) {  // FAISS zeroes the padding tables
    for (int c = 0; c < 16; ++c) p.lut[sq * 16 + c] = 0;
  }
  return p;
}

uint16_t Direct(const Packed& p, size_t v, uint16_t bias) {
  const size_t bytes_per_code = p.m2 / 2;
  uint16_t d = bias;
  for (size_t sq = 0; sq < p.m2; ++sq) {
    const uint8_t byte = p.flat[v * bytes_per_code + sq / 2];
    const uint8_t code = sq % 2 == 0 ? byte & 15 : byte >> 4;
    d = static_cast<uint16_t>(d + p.lut[sq * 16 + code]);
  }
  return d;
}

// The filter of `rows` as a search passes it: counted, row 0 is list id
// `first`.
IdFilter CountedBitmap(const RowBitmap& rows, int64_t first) {
  SearchArgs args;
  args.allowed_rows = &rows;
  args.allowed_rows_first = first;
  args.allowed_rows_count = rows.Count();
  return IdFilter(args);
}

TEST(FastScanKernel, BlockDistancesMatchUnpackedCodes) {
  for (size_t m : {2, 7, 16, 33, 98}) {
    const Packed p = MakePacked(m, 70, 42 + m);
    for (size_t b = 0; b < 3; ++b) {
      uint16_t simd[32], scalar[32];
      const uint8_t* block = p.blocks.data() + b * 16 * p.m2;
      fastscan_kernel::BlockDistances(block, p.m2, p.lut.data(), 1000, simd);
      fastscan_kernel::BlockDistancesScalar(block, p.m2, p.lut.data(), 1000,
                                            scalar);
      for (size_t v = 0; v < 32 && b * 32 + v < p.n; ++v) {
        ASSERT_EQ(scalar[v], Direct(p, b * 32 + v, 1000))
            << "m " << m << " vector " << b * 32 + v;
        ASSERT_EQ(simd[v], scalar[v]) << "m " << m << " vector " << b * 32 + v;
      }
    }
  }
}

// Codes copied vector by vector into dense blocks at an offset (as
// FilteredLists does, a list's rows starting anywhere in a block) give the
// same distances there, and the scan of that row range keeps what the
// bitmap-filtered scan of the whole list keeps.
TEST(FastScanKernel, CopiedCodesScanLikeTheirFilteredList) {
  for (size_t m : {size_t{7}, size_t{16}, size_t{64}}) {
    const Packed p = MakePacked(m, 200, 11 + m);
    RowBitmap rows(static_cast<int64_t>(p.n));
    std::vector<size_t> picked;
    for (size_t v = 0; v < p.n; v += 1 + v % 5) {
      rows.Set(static_cast<int64_t>(v));
      picked.push_back(v);
    }
    const size_t block_bytes = 16 * p.m2;
    // Rows [kAt, kAt + picked) of the copy; the rows around them hold
    // vector 0's code, which the range scan must never return.
    constexpr size_t kAt = 13;
    const size_t rows_end = kAt + picked.size();
    std::vector<uint8_t> copied((rows_end + 40 + 31) / 32 * block_bytes);
    std::vector<int64_t> copied_ids(rows_end + 40, -7);
    for (size_t r = 0; r < rows_end + 40; ++r) {
      const bool in = r >= kAt && r < rows_end;
      const size_t v = in ? picked[r - kAt] : 0;
      fastscan_kernel::CopyPackedCode(p.blocks.data() + (v / 32) * block_bytes,
                                      v % 32,
                                      copied.data() + (r / 32) * block_bytes,
                                      r % 32, p.m2);
      if (in) copied_ids[r] = static_cast<int64_t>(v);
    }
    for (size_t r0 = 0; r0 < rows_end; r0 += 32) {
      uint16_t out[32];
      fastscan_kernel::BlockDistancesScalar(
          copied.data() + (r0 / 32) * block_bytes, p.m2, p.lut.data(), 5, out);
      for (size_t r = std::max(r0, kAt); r < std::min(rows_end, r0 + 32);
           ++r) {
        ASSERT_EQ(out[r - r0], Direct(p, picked[r - kAt], 5))
            << "m " << m << " row " << r << " of vector " << picked[r - kAt];
      }
    }
    std::vector<int64_t> ids(p.n);
    for (size_t i = 0; i < p.n; ++i) ids[i] = static_cast<int64_t>(i);
    const IdFilter filter = CountedBitmap(rows, 0);
    using C = faiss::CMax<uint16_t, int64_t>;
    for (size_t k : {size_t{1}, size_t{10}, size_t{300}}) {
      std::vector<uint16_t> want_d(k), d(k);
      std::vector<int64_t> want_l(k), l(k);
      faiss::heap_heapify<C>(k, want_d.data(), want_l.data());
      faiss::heap_heapify<C>(k, d.data(), l.data());
      fastscan_kernel::ScanListFiltered<true>(p.blocks.data(), p.n, ids.data(),
                                              p.m2, p.lut.data(), 5, filter, k,
                                              want_d.data(), want_l.data());
      fastscan_kernel::ScanRowsAdmitted<true>(copied.data(), kAt, rows_end,
                                              copied_ids.data(), p.m2,
                                              p.lut.data(), 5, k, d.data(),
                                              l.data());
      faiss::heap_reorder<C>(k, want_d.data(), want_l.data());
      faiss::heap_reorder<C>(k, d.data(), l.data());
      EXPECT_EQ(l, want_l) << "m " << m << " k " << k;
      EXPECT_EQ(d, want_d) << "m " << m << " k " << k;
    }
  }
}

TEST(FastScanKernel, WrapsModulo65536LikeFaiss) {
  // 392 sub-quantizers of 255 overflow 16 bits; the sum wraps.
  Packed p = MakePacked(392, 32, 7);
  for (auto& v : p.lut) v = 255;
  uint16_t simd[32];
  fastscan_kernel::BlockDistances(p.blocks.data(), p.m2, p.lut.data(), 0, simd);
  EXPECT_EQ(simd[0], static_cast<uint16_t>(392 * 255));
}

TEST(FastScanKernel, ScanListFilteredKeepsBestAllowed) {
  const Packed p = MakePacked(16, 100, 3);
  std::vector<int64_t> ids(p.n);
  for (size_t i = 0; i < p.n; ++i) ids[i] = 1000 + 3 * i;
  std::vector<int64_t> allowed;
  for (size_t i = 0; i < p.n; i += 2) allowed.push_back(ids[i]);
  const IdFilter filter(allowed);
  const size_t k = 5;
  for (bool keep_min : {true, false}) {
    std::vector<uint16_t> hd(k);
    std::vector<int64_t> hi(k);
    if (keep_min) {
      faiss::heap_heapify<faiss::CMax<uint16_t, int64_t>>(k, hd.data(),
                                                          hi.data());
      fastscan_kernel::ScanListFiltered<true>(p.blocks.data(), p.n, ids.data(),
                                              p.m2, p.lut.data(), 0, filter,
                                              k, hd.data(), hi.data());
      faiss::heap_reorder<faiss::CMax<uint16_t, int64_t>>(k, hd.data(),
                                                          hi.data());
    } else {
      faiss::heap_heapify<faiss::CMin<uint16_t, int64_t>>(k, hd.data(),
                                                          hi.data());
      fastscan_kernel::ScanListFiltered<false>(
          p.blocks.data(), p.n, ids.data(), p.m2, p.lut.data(), 0, filter, k,
          hd.data(), hi.data());
      faiss::heap_reorder<faiss::CMin<uint16_t, int64_t>>(k, hd.data(),
                                                          hi.data());
    }
    std::vector<std::pair<uint16_t, int64_t>> expect;
    for (size_t i = 0; i < p.n; i += 2) expect.push_back({Direct(p, i, 0), ids[i]});
    std::stable_sort(expect.begin(), expect.end(), [&](auto& a, auto& b) {
      return keep_min ? a.first < b.first : a.first > b.first;
    });
    for (size_t j = 0; j < k; ++j) {
      EXPECT_EQ(hd[j], expect[j].first) << "keep_min " << keep_min << " j " << j;
      EXPECT_EQ((hi[j] - 1000) % 6, 0) << "id " << hi[j] << " not allowed";
    }
  }
}

// A bitmap filter takes one of two paths: sparse (at most one row in
// IdFilter::kSparseRatio admitted, its count known) tests a block's ids
// first and skips the blocks without any; otherwise the ids of the vectors
// that beat the heap's top are tested. Both keep what the allow-list of
// the same rows keeps, the same ids in the same order, and those are the
// best admitted distances of a direct computation.
TEST(FastScanKernel, SparseAndDenseBitmapsKeepWhatTheirAllowListKeeps) {
  const Packed p = MakePacked(32, 1000, 5);  // 31 full blocks and a part
  constexpr int64_t kFirst = 1000;
  std::vector<int64_t> ids(p.n);
  for (size_t i = 0; i < p.n; ++i) ids[i] = kFirst + 3 * static_cast<int64_t>(i);
  const size_t k = 8;
  for (size_t every : {size_t{1}, size_t{2}, size_t{40}, size_t{300}}) {
    RowBitmap rows(3 * static_cast<int64_t>(p.n));
    std::vector<int64_t> allowed;
    for (size_t i = 0; i < p.n; i += every) {
      rows.Set(ids[i] - kFirst);
      allowed.push_back(ids[i]);
    }
    const IdFilter bitmap = CountedBitmap(rows, kFirst);
    EXPECT_EQ(bitmap.sparse(),
              rows.Count() * IdFilter::kSparseRatio <= rows.size())
        << "every " << every;
    SearchArgs args;
    args.allowed_rows = &rows;
    args.allowed_rows_first = kFirst;
    args.allowed_rows_count = -1;  // not counted: never sparse
    const IdFilter uncounted(args);
    EXPECT_FALSE(uncounted.sparse());
    const IdFilter list(allowed);
    std::vector<std::pair<uint16_t, int64_t>> expect;
    for (size_t i = 0; i < p.n; i += every) {
      expect.push_back({Direct(p, i, 7), ids[i]});
    }
    std::stable_sort(expect.begin(), expect.end(),
                     [](auto& a, auto& b) { return a.first < b.first; });
    using C = faiss::CMax<uint16_t, int64_t>;
    auto scan = [&](const IdFilter& filter) {
      std::vector<uint16_t> hd(k);
      std::vector<int64_t> hi(k);
      faiss::heap_heapify<C>(k, hd.data(), hi.data());
      fastscan_kernel::ScanListFiltered<true>(p.blocks.data(), p.n,
                                              ids.data(), p.m2, p.lut.data(),
                                              7, filter, k, hd.data(),
                                              hi.data());
      faiss::heap_reorder<C>(k, hd.data(), hi.data());
      return std::make_pair(hd, hi);
    };
    const auto from_list = scan(list);
    EXPECT_EQ(scan(bitmap), from_list) << "every " << every;
    EXPECT_EQ(scan(uncounted), from_list) << "every " << every;
    for (size_t j = 0; j < k; ++j) {
      if (j < expect.size()) {
        EXPECT_EQ(from_list.first[j], expect[j].first) << "every " << every;
        EXPECT_TRUE(rows.Test(from_list.second[j] - kFirst));
      } else {
        EXPECT_EQ(from_list.second[j], -1) << "fewer admitted than k";
      }
    }
  }
}

// The scans offering to FAISS's reservoir (what the filtered searches keep
// for k > 20) keep the best admitted distances, as the heap does: at every
// rank the same distance, each id admitted and at its own distance; for the
// whole list under each kind of filter and for a range of dense rows, for
// k below, at and above the admitted count, keeping the smallest or the
// largest.
TEST(FastScanKernel, ReservoirKeepsWhatTheHeapKeeps) {
  const Packed p = MakePacked(16, 1000, 9);
  constexpr int64_t kFirst = 50;
  std::vector<int64_t> ids(p.n);
  for (size_t i = 0; i < p.n; ++i) ids[i] = kFirst + static_cast<int64_t>(i);
  RowBitmap rows(static_cast<int64_t>(p.n));
  std::vector<int64_t> allowed;
  for (size_t i = 0; i < p.n; i += 1 + i % 3) {
    rows.Set(static_cast<int64_t>(i));
    allowed.push_back(ids[i]);
  }
  const IdFilter bitmap = CountedBitmap(rows, kFirst);
  const IdFilter list(allowed);
  std::vector<uint16_t> direct(p.n);
  for (size_t i = 0; i < p.n; ++i) direct[i] = Direct(p, i, 3);
  // The reservoir's content, best first (as FAISS's ReservoirHandler
  // finishes it: cut to k, then sorted by distance).
  auto finish = [](auto& r, bool keep_min) {
    if (r.i > r.n) r.shrink();
    std::vector<std::pair<uint16_t, int64_t>> kept;
    for (size_t j = 0; j < r.i; ++j) kept.push_back({r.vals[j], r.ids[j]});
    std::stable_sort(kept.begin(), kept.end(), [&](auto& a, auto& b) {
      return keep_min ? a.first < b.first : a.first > b.first;
    });
    return kept;
  };
  for (bool keep_min : {true, false}) {
    for (size_t k : {size_t{21}, size_t{100}, size_t{700}, size_t{900}}) {
      const std::string where =
          "keep_min " + std::to_string(keep_min) + " k " + std::to_string(k);
      // The heap's answer, from the allow-list.
      std::vector<uint16_t> hd(k);
      std::vector<int64_t> hi(k);
      if (keep_min) {
        using C = faiss::CMax<uint16_t, int64_t>;
        faiss::heap_heapify<C>(k, hd.data(), hi.data());
        fastscan_kernel::ScanListFiltered<true>(p.blocks.data(), p.n,
                                                ids.data(), p.m2, p.lut.data(),
                                                3, list, k, hd.data(),
                                                hi.data());
        faiss::heap_reorder<C>(k, hd.data(), hi.data());
      } else {
        using C = faiss::CMin<uint16_t, int64_t>;
        faiss::heap_heapify<C>(k, hd.data(), hi.data());
        fastscan_kernel::ScanListFiltered<false>(
            p.blocks.data(), p.n, ids.data(), p.m2, p.lut.data(), 3, list, k,
            hd.data(), hi.data());
        faiss::heap_reorder<C>(k, hd.data(), hi.data());
      }
      const size_t found = std::min(k, allowed.size());
      for (int scan = 0; scan < 3; ++scan) {
        const size_t capacity = (2 * k + 15) & ~size_t{15};
        std::vector<uint16_t> vals(capacity);
        std::vector<int64_t> kept_ids(capacity);
        std::vector<std::pair<uint16_t, int64_t>> kept;
        // 0: the list's scan under the allow-list; 1: under the bitmap; 2:
        // every row of the list (none filtered) as a range of dense rows.
        const IdFilter& filter = scan == 1 ? bitmap : list;
        if (keep_min) {
          fastscan_kernel::ReservoirOf<true> r(k, capacity, vals.data(),
                                               kept_ids.data());
          if (scan < 2) {
            fastscan_kernel::ScanListFiltered<true>(p.blocks.data(), p.n,
                                                    ids.data(), p.m2,
                                                    p.lut.data(), 3, filter, r);
          } else {
            fastscan_kernel::ScanRowsAdmitted<true>(p.blocks.data(), 0, p.n,
                                                    ids.data(), p.m2,
                                                    p.lut.data(), 3, r);
          }
          kept = finish(r, true);
        } else {
          fastscan_kernel::ReservoirOf<false> r(k, capacity, vals.data(),
                                                kept_ids.data());
          if (scan < 2) {
            fastscan_kernel::ScanListFiltered<false>(
                p.blocks.data(), p.n, ids.data(), p.m2, p.lut.data(), 3,
                filter, r);
          } else {
            fastscan_kernel::ScanRowsAdmitted<false>(p.blocks.data(), 0, p.n,
                                                     ids.data(), p.m2,
                                                     p.lut.data(), 3, r);
          }
          kept = finish(r, false);
        }
        const std::string at = where + " scan " + std::to_string(scan);
        if (scan == 2) {  // every row: the best k of all of them
          std::vector<uint16_t> all = direct;
          std::sort(all.begin(), all.end());
          if (!keep_min) std::reverse(all.begin(), all.end());
          ASSERT_EQ(kept.size(), k) << at;
          for (size_t j = 0; j < k; ++j) {
            ASSERT_EQ(kept[j].first, all[j]) << at << " rank " << j;
            ASSERT_EQ(direct[kept[j].second - kFirst], kept[j].first) << at;
          }
          continue;
        }
        ASSERT_EQ(kept.size(), found) << at;
        for (size_t j = 0; j < found; ++j) {
          ASSERT_EQ(kept[j].first, hd[j]) << at << " rank " << j;
          ASSERT_TRUE(rows.Test(kept[j].second - kFirst)) << at;
          ASSERT_EQ(direct[kept[j].second - kFirst], kept[j].first) << at;
        }
      }
    }
  }
}

}  // namespace
}  // namespace knnd
