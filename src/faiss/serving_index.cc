#include "knnd/faiss/serving_index.h"

#include <algorithm>

#include <faiss/IndexIVF.h>

#include "knnd/faiss/fastscan_format.h"
#include "knnd/faiss/fastscan_index.h"
#include "knnd/faiss/faiss_types.h"
#include "knnd/faiss/ivfpq_index.h"

namespace knnd {

int64_t PrecomputedTableBytes(int64_t nlist, int pq_m, int pq_nbits) {
  return nlist * pq_m * (int64_t{1} << pq_nbits) *
         static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<std::unique_ptr<ServingIndex>> ServingIndex::Open(
    const std::string& path) {
  int64_t file_bytes = 0;
  if (absl::Status s = faiss_types::StatIndexFile(path, file_bytes); !s.ok()) {
    return s;
  }
  if (IsFastScanFile(path)) {
    absl::StatusOr<std::unique_ptr<FastScanIndex>> fastscan =
        FastScanIndex::Open(path);
    if (!fastscan.ok()) return fastscan.status();
    return std::unique_ptr<ServingIndex>(std::move(*fastscan));
  }
  absl::StatusOr<std::unique_ptr<IvfPqIndex>> ivfpq =
      IvfPqIndex::Open(path, file_bytes);
  if (!ivfpq.ok()) return ivfpq.status();
  return std::unique_ptr<ServingIndex>(std::move(*ivfpq));
}

absl::Status ServingIndex::Search(const SearchArgs& args) const {
  if (absl::Status s = SearchUnpadded(args); !s.ok()) return s;
  const float pad = MissingDistance(facts_.metric);
  const int64_t n = args.num_queries * args.k;
  for (int64_t i = 0; i < n; ++i) {
    if (args.ids[i] < 0) args.distances[i] = pad;
  }
  return absl::OkStatus();
}

std::vector<int64_t> ServingIndex::SortedIds() const {
  faiss_types::IndexLayers layers;
  faiss_types::SplitLayers(root(), layers);  // checked when opened
  const auto& ivf = dynamic_cast<const faiss::IndexIVF&>(*layers.inner);
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(ivf.ntotal));
  for (size_t l = 0; l < ivf.nlist; ++l) {
    const size_t n = ivf.invlists->list_size(l);
    if (n == 0) continue;
    faiss::InvertedLists::ScopedIds list_ids(ivf.invlists, l);
    ids.insert(ids.end(), list_ids.get(), list_ids.get() + n);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace knnd
