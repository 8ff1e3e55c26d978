#include "knnd/faiss/fastscan_checks.h"

#include "absl/strings/str_cat.h"
#include "knnd/faiss/fastscan_format.h"

namespace knnd {
namespace {

// FAISS 1.7.3's kernels take at most 24 queries per group
// (pq4_preferred_qbs).
constexpr size_t kMaxQueryGroup = 24;

}  // namespace

std::string CheckFastScanIndex(const faiss::Index& index,
                               FastScanParts& parts) {
  parts = FastScanParts();
  if (std::string why = faiss_types::SplitLayers(index, parts.layers);
      !why.empty()) {
    return why;
  }
  const faiss::Index* inner = parts.layers.inner;
  const auto* ivf = dynamic_cast<const faiss::IndexIVFPQFastScan*>(inner);
  if (ivf == nullptr) {
    return absl::StrCat("the IVF index is a ", faiss_types::TypeOf(inner),
                        ", not a faiss::IndexIVFPQFastScan (factory "
                        "'IVF<nlist>,PQ<M>x4fs')");
  }
  parts.ivf = ivf;
  if (ivf->metric_type != faiss::METRIC_L2 &&
      ivf->metric_type != faiss::METRIC_INNER_PRODUCT) {
    return absl::StrCat("metric ", ivf->metric_type,
                        " (knnd serves L2 and inner product)");
  }
  if (ivf->bbs != static_cast<int>(kFastScanBlockVectors)) {
    return absl::StrCat("bbs ", ivf->bbs,
                        " (knnd maps 32-vector blocks: factory PQ<M>x4fs "
                        "without _<bbs>)");
  }
  const faiss::ProductQuantizer& pq = ivf->pq;
  if (pq.nbits != 4 || ivf->nbits != 4 || ivf->ksub != 16 || pq.ksub != 16) {
    return absl::StrCat("a PQ of ", pq.nbits, " bits (FastScan is 4-bit)");
  }
  if (ivf->M != pq.M || pq.M == 0 || ivf->M2 != (pq.M + 1) / 2 * 2 ||
      ivf->code_size != ivf->M2 / 2) {
    return absl::StrCat("inconsistent M ", ivf->M, ", pq.M ", pq.M, ", M2 ",
                        ivf->M2, ", code_size ", ivf->code_size);
  }
  if (pq.d != static_cast<size_t>(ivf->d) ||
      pq.centroids.size() != pq.M * pq.ksub * pq.dsub) {
    return absl::StrCat("a PQ of d=", pq.d, " with ", pq.centroids.size(),
                        " centroid floats for an index of d=", ivf->d);
  }
  if (!ivf->is_trained || ivf->nlist == 0 || ivf->quantizer == nullptr ||
      ivf->quantizer->ntotal != static_cast<faiss::Index::idx_t>(ivf->nlist) ||
      ivf->quantizer->d != ivf->d) {
    return absl::StrCat("untrained, or a coarse quantizer of ",
                        ivf->quantizer ? ivf->quantizer->ntotal : -1,
                        " vectors for nlist=", ivf->nlist);
  }
  if (ivf->qbs2 > kMaxQueryGroup) {
    return absl::StrCat("qbs2=", ivf->qbs2, " exceeds FAISS's ",
                        kMaxQueryGroup, " queries per group");
  }
  if (ivf->use_precomputed_table == 1 &&
      ivf->precomputed_table.size() != ivf->nlist * pq.M * pq.ksub) {
    return absl::StrCat("a precomputed table of ",
                        ivf->precomputed_table.size(),
                        " floats, expected nlist * M * 16");
  }
  return "";
}

}  // namespace knnd
