#include "knnd/faiss/ivfpq_index.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/IndexPreTransform.h>
#include <faiss/index_io.h>
#include <faiss/invlists/OnDiskInvertedLists.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/faiss_types.h"
#include "knnd/faiss/id_filter.h"
#include "knnd/faiss/ivfpq_checks.h"

namespace knnd {

using faiss_types::CatchFaiss;
using faiss_types::CorruptIndexFile;
using faiss_types::TypeOf;

namespace {

// FAISS's own 4-byte tag of an IndexIVFPQFastScan at the start of a file.
constexpr char kFaissFastScanFourcc[4] = {'I', 'w', 'P', 'f'};

// A FastScan index as FAISS writes it, lists on the heap.
absl::Status UnconvertedFastScan(const std::string& path) {
  return absl::InvalidArgumentError(absl::StrCat(
      "index file ", path,
      " is a FastScan index written by FAISS (faiss.write_index), whose "
      "lists FAISS 1.7.3 reads onto the heap; convert it to knnd's mappable "
      "FastScan layout with `knnctl convert` and serve the converted file"));
}

bool StartsWithFaissFastScan(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return false;
  char fourcc[sizeof kFaissFastScanFourcc];
  const bool read = std::fread(fourcc, 1, sizeof fourcc, file) == sizeof fourcc;
  std::fclose(file);
  return read && std::equal(fourcc, fourcc + sizeof fourcc,
                            kFaissFastScanFourcc);
}

// What IvfPqIndex::Open reads: the FAISS objects of the file.
struct Read {
  std::unique_ptr<faiss::Index> root;
  const faiss::IndexPreTransform* pre = nullptr;
  faiss::IndexIVFPQ* ivfpq = nullptr;  // owned by root
};

// Reads a FAISS IVF-PQ file (lists mapped, no precomputed table) and checks
// it; fills `objects` and `facts`.
absl::Status ReadAndCheck(const std::string& path, int64_t file_bytes,
                          Read& objects, IndexFacts& facts) {
  facts.path = path;
  facts.file_bytes = file_bytes;
  // Caught before FAISS's reader copies every list of it onto the heap.
  if (StartsWithFaissFastScan(path)) return UnconvertedFastScan(path);
  const int flags = faiss::IO_FLAG_MMAP | faiss::IO_FLAG_READ_ONLY |
                    faiss::IO_FLAG_SKIP_PRECOMPUTE_TABLE;
  if (absl::Status s = CatchFaiss(
          absl::StatusCode::kDataLoss,
          absl::StrCat("cannot read index file ", path,
                       " (truncated, corrupt or not a FAISS index)"),
          [&] { objects.root.reset(faiss::read_index(path.c_str(), flags)); });
      !s.ok()) {
    return s;
  }
  faiss_types::IndexLayers layers;
  if (std::string why = faiss_types::SplitLayers(*objects.root, layers);
      !why.empty()) {
    return CorruptIndexFile(path, why);
  }
  const faiss::Index& inner = *layers.inner;
  if (dynamic_cast<const faiss::IndexIVFPQFastScan*>(&inner) != nullptr) {
    return UnconvertedFastScan(path);
  }
  if (std::string why = faiss_types::WhyNotServable(inner); !why.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("index file ", path, " holds a ", TypeOf(&inner),
                     ", which knnd cannot serve: ", why));
  }
  objects.pre = layers.pre;
  // The index was just read and is not shared yet.
  auto* ivfpq = const_cast<faiss::IndexIVFPQ*>(
      static_cast<const faiss::IndexIVFPQ*>(&inner));
  objects.ivfpq = ivfpq;
  if (absl::Status s = CheckIvfPqStructure(path, file_bytes, *ivfpq,
                                           objects.root->d);
      !s.ok()) {
    return s;
  }

  // Prefetch threads (32) are started per search by default: measured on
  // 2 cores, they made one-query searches at nprobe 32 3x slower (3.0 ms
  // against 1.0 ms without, the time of the same index on the heap).
  static_cast<faiss::OnDiskInvertedLists*>(ivfpq->invlists)->prefetch_nthread =
      0;

  const faiss::ProductQuantizer& pq = ivfpq->pq;
  facts.has_pretransform = layers.pre != nullptr;
  facts.dim = objects.root->d;
  facts.ivf_dim = ivfpq->d;
  facts.metric = ivfpq->metric_type == faiss::METRIC_L2 ? Metric::kL2
                                                         : Metric::kInnerProduct;
  facts.ntotal = ivfpq->ntotal;
  facts.nlist = static_cast<int64_t>(ivfpq->nlist);
  facts.pq_m = static_cast<int>(pq.M);
  facts.pq_nbits = static_cast<int>(pq.nbits);
  facts.code_size_bytes = static_cast<int64_t>(ivfpq->code_size);
  facts.by_residual = ivfpq->by_residual;
  facts.stored_nprobe = static_cast<int>(std::max<size_t>(1, ivfpq->nprobe));
  facts.heap_bytes = layers.transform_heap_bytes +
                     faiss_types::IvfHeapBytes(*ivfpq) +
                     static_cast<int64_t>(pq.centroids.size() * sizeof(float));
  facts.mapped_list_bytes = facts.ntotal * static_cast<int64_t>(
                                               ivfpq->code_size + sizeof(int64_t));
  facts.index_type = absl::StrCat(
      layers.prefix, faiss_types::DescribeIvf(*ivfpq), ",PQ", facts.pq_m,
      facts.pq_nbits == 8 ? "" : absl::StrCat("x", facts.pq_nbits));
  return absl::OkStatus();
}

}  // namespace

IvfPqIndex::IvfPqIndex() = default;
IvfPqIndex::~IvfPqIndex() = default;

absl::StatusOr<std::unique_ptr<IvfPqIndex>> IvfPqIndex::Open(
    const std::string& path, int64_t file_bytes) {
  Read read;
  std::unique_ptr<IvfPqIndex> index(new IvfPqIndex());
  if (absl::Status s = ReadAndCheck(path, file_bytes, read, index->facts_);
      !s.ok()) {
    return s;
  }
  index->root_ = std::move(read.root);
  index->pre_ = read.pre;
  index->ivfpq_ = read.ivfpq;
  return index;
}

int64_t IvfPqIndex::PlannedTableBytes() const {
  const faiss::IndexIVFPQ& ivfpq = *ivfpq_;
  if (!ivfpq.by_residual || ivfpq.quantizer == nullptr ||
      ivfpq.quantizer->metric_type == faiss::METRIC_INNER_PRODUCT) {
    return 0;
  }
  const int64_t bytes = PrecomputedTableBytes(
      static_cast<int64_t>(ivfpq.nlist), static_cast<int>(ivfpq.pq.M),
      static_cast<int>(ivfpq.pq.nbits));
  if (bytes > static_cast<int64_t>(faiss::precomputed_table_max_bytes)) {
    return 0;
  }
  return bytes;
}

absl::Status IvfPqIndex::BuildPrecomputedTable() {
  if (PlannedTableBytes() == 0) return absl::OkStatus();
  if (absl::Status s = CatchFaiss(
          absl::StatusCode::kResourceExhausted,
          absl::StrCat("cannot build the precomputed table of index file ",
                       facts_.path),
          [&] { ivfpq_->precompute_table(); });
      !s.ok()) {
    return s;
  }
  facts_.precomputed_table_bytes =
      static_cast<int64_t>(ivfpq_->precomputed_table.size() * sizeof(float));
  facts_.heap_bytes += facts_.precomputed_table_bytes;
  return absl::OkStatus();
}

absl::Status IvfPqIndex::SearchUnpadded(const SearchArgs& args) const {
  const int64_t nprobe =
      std::min<int64_t>(args.nprobe, static_cast<int64_t>(ivfpq_->nlist));
  if (args.skip_probes < 0 || args.skip_probes >= nprobe) {
    return absl::InvalidArgumentError(absl::StrCat(
        "search of ", facts_.path, ": skip_probes=", args.skip_probes,
        " is outside [0, ", nprobe, ") (nprobe)"));
  }
  IdFilter filter(args);  // SearchParameters takes it non-const
  return CatchFaiss(absl::StatusCode::kInternal, "FAISS search failed", [&] {
    const float* x = args.queries;
    std::unique_ptr<const float[]> transformed;
    if (pre_ != nullptr) {
      x = pre_->apply_chain(args.num_queries, args.queries);
      if (x != args.queries) transformed.reset(x);
    }
    faiss::SearchParametersIVF params;
    params.nprobe = static_cast<size_t>(args.nprobe);
    if (filter.active()) params.sel = &filter;
    if (args.skip_probes == 0 &&
        (args.probe_reference == nullptr || !filter.active())) {
      ivfpq_->search(args.num_queries, x, args.k, args.distances, args.ids,
                     &params);
      return;
    }
    SearchPreassigned(args, x, params);
  });
}

void IvfPqIndex::SearchPreassigned(
    const SearchArgs& args, const float* x,
    const faiss::SearchParametersIVF& params) const {
  // What IndexIVF::search does (the coarse search, then the lists), with
  // the first skip_probes lists of each query left out, the coarse result
  // kept for the reference, and the closest lists searched again without
  // the filter.
  const int64_t n = args.num_queries;
  const int64_t nprobe =
      std::min<int64_t>(args.nprobe, static_cast<int64_t>(ivfpq_->nlist));
  const int64_t skip = args.skip_probes;
  std::vector<faiss::Index::idx_t> lists(static_cast<size_t>(n * nprobe));
  std::vector<float> coarse(lists.size());
  ivfpq_->quantizer->search(n, x, nprobe, coarse.data(), lists.data());
  const int64_t scanned = nprobe - skip;
  std::vector<faiss::Index::idx_t> scan_lists(static_cast<size_t>(n * scanned));
  std::vector<float> scan_coarse(scan_lists.size());
  for (int64_t q = 0; q < n; ++q) {
    std::copy_n(lists.data() + q * nprobe + skip, scanned,
                scan_lists.data() + q * scanned);
    std::copy_n(coarse.data() + q * nprobe + skip, scanned,
                scan_coarse.data() + q * scanned);
  }
  faiss::SearchParametersIVF part = params;
  part.nprobe = static_cast<size_t>(scanned);
  ivfpq_->search_preassigned(n, x, args.k, scan_lists.data(),
                             scan_coarse.data(), args.distances, args.ids,
                             false, &part);
  if (args.probe_reference == nullptr) return;
  const int64_t anchor = std::min<int64_t>(args.reference_nprobe, nprobe) - 1;
  for (int64_t q = 0; q < n; ++q) {
    args.probe_reference[q].frontier = coarse[q * nprobe + nprobe - 1];
    args.probe_reference[q].anchor = coarse[q * nprobe + anchor];
  }
  if (args.reference_rank < 1) return;
  std::vector<faiss::Index::idx_t> closest(static_cast<size_t>(n));
  std::vector<float> closest_coarse(closest.size());
  for (int64_t q = 0; q < n; ++q) {
    closest[q] = lists[q * nprobe];
    closest_coarse[q] = coarse[q * nprobe];
  }
  const int64_t rank = args.reference_rank;
  std::vector<float> dis(static_cast<size_t>(n * rank));
  std::vector<faiss::Index::idx_t> ids(dis.size());
  faiss::SearchParametersIVF plain;
  plain.nprobe = 1;
  ivfpq_->search_preassigned(n, x, rank, closest.data(), closest_coarse.data(),
                             dis.data(), ids.data(), false, &plain);
  // The distance of the r-th best, or of the last one found.
  const auto at = [&](int64_t q, int64_t r) {
    for (int64_t j = r; j-- > 0;) {
      if (ids[q * rank + j] >= 0) return dis[q * rank + j];
    }
    return MissingDistance(facts_.metric);
  };
  for (int64_t q = 0; q < n; ++q) {
    args.probe_reference[q].nearest_kth = at(q, args.reference_k);
    args.probe_reference[q].nearest_rank = at(q, rank);
  }
}

absl::Status IvfPqIndex::WritePart(const std::string&, int64_t,
                                   int64_t) const {
  return absl::InvalidArgumentError(absl::StrCat(
      "cannot split ", facts_.path, ": it is an 8-bit IVF-PQ index (",
      facts_.index_type, "); only FastScan indexes (knnctl build's "
      "default recipe) are split into shards"));
}

}  // namespace knnd
