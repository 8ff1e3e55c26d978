// The unfiltered FastScan scan of one inverted list for a group of queries
// (FAISS's pq4_accumulate_loop_qbs: the packed 4-bit codes against the
// queries' look-up tables, each block of 32 distances handed to a FAISS
// result handler), with knnd's own AVX-512 kernel where the CPU has AVX-512
// F and BW; fastscan_search.cc calls FAISS's AVX2 one otherwise.
//
// FAISS 1.7.3's kernel looks up one pair of sub-quantizers per 256-bit
// shuffle, from tables it first packs per group of queries. knnd's looks up
// two pairs per 512-bit shuffle: the 64 code bytes of two pairs against the
// four tables of those sub-quantizers, which are 64 consecutive bytes of the
// query's unpacked tables, so nothing is packed per group. It folds the two
// halves of its sums once per block and hands the handler the same 16-bit
// distances, bit for bit (sums modulo 2^16 do not depend on their order).
// It is built only in the AVX2 FAISS build (whose handler types it uses)
// and chosen at run time; a CPU without AVX-512 runs FAISS's.
//
// Internal to src/faiss/. The header names no FAISS type, so any file may
// include it; AccumulateAvx512's handlers are FAISS's, instantiated in
// fastscan_qbs.cc for the ones fastscan_search.cc uses. Thread-safety: pure
// functions over the caller's handler.
#ifndef KNND_FAISS_FASTSCAN_QBS_H_
#define KNND_FAISS_FASTSCAN_QBS_H_

#include <cstddef>
#include <cstdint>

namespace knnd {
namespace fastscan_qbs {

// Whether the unfiltered scans run knnd's AVX-512 kernel here: this build
// has it, the CPU runs AVX-512 F and BW, and KNND_FASTSCAN_AVX512 is not
// "0".
bool UsesAvx512();

// knnd's AVX-512 kernel in place of FAISS's pq4_pack_LUT_qbs_q_map and
// pq4_accumulate_loop_qbs: `qbs` as FAISS packs it (pq4_preferred_qbs),
// `ntotal2` the list's size rounded up to 32, `nsq` the sub-quantizers
// rounded up to 2 (ivf.M2), `codes` as pq4_pack_codes packs them. The
// queries' tables are not packed: query i of the group (in qbs's order) has
// its nsq tables of 16 entries at tables + 16 * nsq * rows[i]. Call only
// where UsesAvx512().
template <class Handler>
void AccumulateAvx512(int qbs, size_t ntotal2, int nsq, const uint8_t* codes,
                      const uint8_t* tables, const int* rows, Handler& handler);

}  // namespace fastscan_qbs
}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_QBS_H_
