// RecordReference: where each query of a filtered FastScan scan stands
// (SearchArgs::probe_reference, search_args.h), for the IVF plan's widening
// (index/filtered_search.h). FastScanSearcher calls it after the coarse
// search of each slice of a batch.
//
// Thread-safety: reads the index and tables only.
#ifndef KNND_FAISS_FASTSCAN_REFERENCE_H_
#define KNND_FAISS_FASTSCAN_REFERENCE_H_

#include <cstddef>

#include <faiss/Index.h>

#include "knnd/faiss/fastscan_lut.h"
#include "knnd/faiss/search_args.h"

namespace faiss {
struct IndexIVFPQFastScan;
}  // namespace faiss

namespace knnd {

// The ProbeReference of each of the n queries of a filtered scan: from the
// coarse search's distances (nprobe a query, closest first), and, for
// ref_rank >= 1, the estimated distances of the codes of each query's
// closest list (its probe of rank 0, through the same tables and kernel as
// the scan), of which the ref_k-th and ref_rank-th best are taken (0:
// nearest_kth and nearest_rank are left as they are).
void RecordReference(const faiss::IndexIVFPQFastScan& ivf, size_t n,
                     size_t nprobe, size_t ref_nprobe, size_t ref_k,
                     size_t ref_rank, const fastscan_lut::QuantizedLuts& luts,
                     const faiss::Index::idx_t* coarse_ids,
                     const float* coarse_dis, ProbeReference* reference);

}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_REFERENCE_H_
