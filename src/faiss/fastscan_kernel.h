// knnd's own 4-bit FastScan distance kernel, for the searches FAISS's
// compiled kernels cannot do: scans that skip ids outside an allow-list.
//
// Contract (FAISS 1.7.3's packed layout, pq4_pack_codes with bbs = 32): a
// list is a sequence of 32-vector blocks of 16 * m2 bytes; inside a block,
// sub-quantizer pair p (sq 2p and 2p+1) takes 32 bytes: byte j (< 16) holds,
// for sub-quantizer 2p, the code of vector perm(j) in its low nibble and of
// vector perm(j) + 16 in its high nibble, with perm(j) = j / 2 + 8 * (j % 2);
// byte 16 + j the same for sub-quantizer 2p + 1.
// A quantized look-up table for one query is m2 tables of 16 uint8 entries
// (table sq at lut + 16 * sq), which is also the packed single-query layout
// (pq4_pack_LUT with nq = 1). A vector's distance is
//   bias + sum over sq of lut[16 * sq + code(v, sq)]   (mod 2^16),
// the value FAISS's kernels produce for the same codes and table.
//
// AVX2 when compiled with it (src/faiss/CMakeLists.txt gives this file the
// SIMD flags of an AVX2 FAISS build), a portable loop otherwise. Internal to
// src/faiss/. Thread-safety: pure functions.
#ifndef KNND_FAISS_FASTSCAN_KERNEL_H_
#define KNND_FAISS_FASTSCAN_KERNEL_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <faiss/utils/ordered_key_value.h>

#include "knnd/faiss/id_filter.h"

// Declared only: simd_result_handlers.h picks its SIMD types by __AVX2__,
// so only the files compiled with the linked FAISS's flags include it
// (src/faiss/CMakeLists.txt), and this header reaches others
// (filtered_lists.cc).
namespace faiss {
namespace simd_result_handlers {
template <class C>
struct ReservoirTopN;
}  // namespace simd_result_handlers
}  // namespace faiss

namespace knnd {
namespace fastscan_kernel {

// The comparator of FAISS's heap of k (distance, id) pairs that the scans
// fill: kKeepMin (L2) keeps the k smallest distances, else the k largest.
template <bool kKeepMin>
using HeapOf = typename std::conditional<kKeepMin,
                                         faiss::CMax<uint16_t, int64_t>,
                                         faiss::CMin<uint16_t, int64_t>>::type;

// FAISS's reservoir of the best k of one query (its ReservoirTopN, in
// which a candidate goes only if it beats the threshold, and a full
// reservoir of capacity > k is cut back to between k and (capacity + k) / 2
// by a partition): what FAISS's scans keep for k > 20 (its
// ReservoirHandler), and the filtered scans too (fastscan_search.cc).
template <bool kKeepMin>
using ReservoirOf =
    faiss::simd_result_handlers::ReservoirTopN<HeapOf<kKeepMin>>;

// The 32 distances of one block, SIMD (AVX2) where compiled for it.
void BlockDistances(const uint8_t* block, size_t m2, const uint8_t* lut,
                    uint16_t bias, uint16_t out[32]);

// Portable reference for BlockDistances (any CPU; used by the tests).
void BlockDistancesScalar(const uint8_t* block, size_t m2, const uint8_t* lut,
                          uint16_t bias, uint16_t out[32]);

// Copies the code of vector `from_v` (< 32) of the block at `from` to vector
// `to_v` of the block at `to`, all m2 sub-quantizers (blocks of 16 * m2
// bytes): what FilteredLists repacks a filter's vectors with.
void CopyPackedCode(const uint8_t* from, size_t from_v, uint8_t* to,
                    size_t to_v, size_t m2);

// Scans the n vectors of one list for one query and offers each one whose
// distance beats the heap's top, and whose id `filter` contains, to the heap.
// The heap is FAISS's (faiss/utils/Heap.h) of k (distance, id) pairs:
// kKeepMin (L2): a CMax<uint16_t, int64_t> heap keeping the k smallest;
// !kKeepMin (inner product): a CMin heap keeping the k largest.
template <bool kKeepMin>
void ScanListFiltered(const uint8_t* codes, size_t n, const int64_t* ids,
                      size_t m2, const uint8_t* lut, uint16_t bias,
                      const IdFilter& filter, size_t k, uint16_t* heap_dis,
                      int64_t* heap_ids);

// Scans vectors [begin, end) of the dense blocks at `codes` (vector r:
// vector r % 32 of block r / 32; a FilteredLists' rows, every one admitted,
// ids[r] its id) for one query, offering each whose distance beats the
// heap's top to the heap (as ScanListFiltered, no id tested).
template <bool kKeepMin>
void ScanRowsAdmitted(const uint8_t* codes, size_t begin, size_t end,
                      const int64_t* ids, size_t m2, const uint8_t* lut,
                      uint16_t bias, size_t k, uint16_t* heap_dis,
                      int64_t* heap_ids);

// The same two scans offering to a reservoir instead of a heap, in the
// same order: a candidate that beats the reservoir's threshold is added.
template <bool kKeepMin>
void ScanListFiltered(const uint8_t* codes, size_t n, const int64_t* ids,
                      size_t m2, const uint8_t* lut, uint16_t bias,
                      const IdFilter& filter, ReservoirOf<kKeepMin>& top);
template <bool kKeepMin>
void ScanRowsAdmitted(const uint8_t* codes, size_t begin, size_t end,
                      const int64_t* ids, size_t m2, const uint8_t* lut,
                      uint16_t bias, ReservoirOf<kKeepMin>& top);

extern template void ScanListFiltered<true>(const uint8_t*, size_t,
                                            const int64_t*, size_t,
                                            const uint8_t*, uint16_t,
                                            const IdFilter&, size_t,
                                            uint16_t*, int64_t*);
extern template void ScanListFiltered<false>(const uint8_t*, size_t,
                                             const int64_t*, size_t,
                                             const uint8_t*, uint16_t,
                                             const IdFilter&, size_t,
                                             uint16_t*, int64_t*);

extern template void ScanRowsAdmitted<true>(const uint8_t*, size_t, size_t,
                                            const int64_t*, size_t,
                                            const uint8_t*, uint16_t, size_t,
                                            uint16_t*, int64_t*);
extern template void ScanListFiltered<true>(const uint8_t*, size_t,
                                            const int64_t*, size_t,
                                            const uint8_t*, uint16_t,
                                            const IdFilter&,
                                            ReservoirOf<true>&);
extern template void ScanListFiltered<false>(const uint8_t*, size_t,
                                             const int64_t*, size_t,
                                             const uint8_t*, uint16_t,
                                             const IdFilter&,
                                             ReservoirOf<false>&);
extern template void ScanRowsAdmitted<true>(const uint8_t*, size_t, size_t,
                                            const int64_t*, size_t,
                                            const uint8_t*, uint16_t,
                                            ReservoirOf<true>&);
extern template void ScanRowsAdmitted<false>(const uint8_t*, size_t, size_t,
                                             const int64_t*, size_t,
                                             const uint8_t*, uint16_t,
                                             ReservoirOf<false>&);
extern template void ScanRowsAdmitted<false>(const uint8_t*, size_t, size_t,
                                             const int64_t*, size_t,
                                             const uint8_t*, uint16_t, size_t,
                                             uint16_t*, int64_t*);

}  // namespace fastscan_kernel
}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_KERNEL_H_
