#include "knnd/faiss/faiss_index.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <new>

#include <faiss/IndexFlat.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexPreTransform.h>
#include <faiss/impl/IDSelector.h>
#include <faiss/index_io.h>
#include <faiss/invlists/OnDiskInvertedLists.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/faiss_types.h"
#include "knnd/faiss/ivfpq_checks.h"

namespace knnd {

using idx_t = faiss::Index::idx_t;
using faiss_types::TypeOf;

struct FaissIndex::Objects {
  std::unique_ptr<faiss::Index> root;
  const faiss::IndexPreTransform* pre = nullptr;  // null without transform
  faiss::IndexIVFPQ* ivfpq = nullptr;             // owned by root
};

namespace {

absl::Status Unsupported(const std::string& path, const faiss::Index& inner) {
  return absl::InvalidArgumentError(absl::StrCat(
      "index file ", path, " holds a ", TypeOf(&inner),
      ", which knnd cannot serve: ", faiss_types::WhyNotServable(inner)));
}

absl::Status StatFile(const std::string& path, int64_t& file_bytes) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("index file ", path, " does not exist"));
    }
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot stat index file ", path, ": ", strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("index path ", path, " is not a regular file"));
  }
  if (access(path.c_str(), R_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot read index file ", path, ": ", strerror(errno)));
  }
  file_bytes = st.st_size;
  return absl::OkStatus();
}

// Reads the file (lists mapped, no precomputed table) and checks it; fills
// `objects` and `facts`.
absl::Status ReadAndCheck(const std::string& path, FaissIndex::Objects& objects,
                          IndexFacts& facts) {
  facts.path = path;
  if (absl::Status s = StatFile(path, facts.file_bytes); !s.ok()) return s;
  const int flags = faiss::IO_FLAG_MMAP | faiss::IO_FLAG_READ_ONLY |
                    faiss::IO_FLAG_SKIP_PRECOMPUTE_TABLE;
  try {
    objects.root.reset(faiss::read_index(path.c_str(), flags));
  } catch (const std::bad_alloc&) {
    return CorruptIndexFile(path, "a size in its header asks for more memory "
                                  "than there is");
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(
        "cannot read index file ", path,
        " (truncated, corrupt or not a FAISS index): ",
        faiss_types::FaissMessage(e)));
  }

  faiss::Index* inner = objects.root.get();
  std::string prefix;
  if (auto* pre = dynamic_cast<faiss::IndexPreTransform*>(inner)) {
    objects.pre = pre;
    facts.has_pretransform = true;
    inner = pre->index;
    int d = pre->d;
    for (const faiss::VectorTransform* vt : pre->chain) {
      if (vt == nullptr || vt->d_in != d) {
        return CorruptIndexFile(path,
                                "its pre-transform chain has mismatched sizes");
      }
      d = vt->d_out;
      absl::StrAppend(&prefix, faiss_types::DescribeTransform(vt), ",");
      facts.heap_bytes += faiss_types::TransformHeapBytes(vt);
    }
    if (inner == nullptr || inner->d != d) {
      return CorruptIndexFile(
          path, "its pre-transform output does not match the index");
    }
  }
  if (!faiss_types::WhyNotServable(*inner).empty()) {
    return Unsupported(path, *inner);
  }
  auto* ivfpq = static_cast<faiss::IndexIVFPQ*>(inner);
  objects.ivfpq = ivfpq;
  if (absl::Status s = CheckIvfPqStructure(path, facts.file_bytes, *ivfpq,
                                           objects.root->d);
      !s.ok()) {
    return s;
  }

  // Prefetch threads are started per search by default and made nprobe=32
  // searches 3x slower on these machines (shared/DESIGN.md).
  static_cast<faiss::OnDiskInvertedLists*>(ivfpq->invlists)->prefetch_nthread =
      0;

  const faiss::ProductQuantizer& pq = ivfpq->pq;
  facts.dim = objects.root->d;
  facts.metric = ivfpq->metric_type == faiss::METRIC_L2 ? Metric::kL2
                                                         : Metric::kInnerProduct;
  facts.ntotal = ivfpq->ntotal;
  facts.nlist = static_cast<int64_t>(ivfpq->nlist);
  facts.pq_m = static_cast<int>(pq.M);
  facts.pq_nbits = static_cast<int>(pq.nbits);
  facts.code_size_bytes = static_cast<int64_t>(ivfpq->code_size);
  facts.stored_nprobe = static_cast<int>(std::max<size_t>(1, ivfpq->nprobe));
  facts.heap_bytes += static_cast<int64_t>(pq.centroids.size() * sizeof(float));
  if (auto* flat =
          dynamic_cast<const faiss::IndexFlatCodes*>(ivfpq->quantizer)) {
    facts.heap_bytes += static_cast<int64_t>(flat->codes.size());
  }
  facts.heap_bytes +=
      static_cast<int64_t>(ivfpq->direct_map.array.size() * sizeof(idx_t));
  facts.mapped_list_bytes =
      facts.ntotal * static_cast<int64_t>(ivfpq->code_size + sizeof(idx_t));
  std::string quantizer;
  if (dynamic_cast<const faiss::IndexFlat*>(ivfpq->quantizer) == nullptr) {
    quantizer = absl::StrCat("(", TypeOf(ivfpq->quantizer), ")");
  }
  facts.index_type = absl::StrCat(
      prefix, "IVF", facts.nlist, quantizer, ",PQ", facts.pq_m,
      facts.pq_nbits == 8 ? "" : absl::StrCat("x", facts.pq_nbits));
  return absl::OkStatus();
}

// An id filter over a sorted id list: no allocation per search, O(log n)
// per candidate.
struct SortedIdSelector : faiss::IDSelector {
  explicit SortedIdSelector(absl::Span<const int64_t> ids) : ids(ids) {}
  bool is_member(idx_t id) const override {
    return std::binary_search(ids.begin(), ids.end(), id);
  }
  absl::Span<const int64_t> ids;
};

}  // namespace

int64_t PrecomputedTableBytes(int64_t nlist, int pq_m, int pq_nbits) {
  return nlist * pq_m * (int64_t{1} << pq_nbits) *
         static_cast<int64_t>(sizeof(float));
}

FaissIndex::FaissIndex(std::unique_ptr<Objects> objects, IndexFacts facts)
    : objects_(std::move(objects)), facts_(std::move(facts)) {}

FaissIndex::~FaissIndex() = default;

absl::StatusOr<std::unique_ptr<FaissIndex>> FaissIndex::Open(
    const std::string& path) {
  auto objects = std::make_unique<Objects>();
  IndexFacts facts;
  if (absl::Status s = ReadAndCheck(path, *objects, facts); !s.ok()) return s;
  return std::unique_ptr<FaissIndex>(
      new FaissIndex(std::move(objects), std::move(facts)));
}

// The bytes FAISS 1.7.3's IndexIVFPQ::precompute_table() allocates: a table
// only for residual encoding with an L2 coarse quantizer, of nlist * M *
// ksub floats, skipped above faiss::precomputed_table_max_bytes (and
// smaller for a multi-index quantizer, counted here as the plain size).
int64_t FaissIndex::PlannedTableBytes() const {
  const faiss::IndexIVFPQ& ivfpq = *objects_->ivfpq;
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

absl::Status FaissIndex::BuildPrecomputedTable() {
  if (PlannedTableBytes() == 0) return absl::OkStatus();
  faiss::IndexIVFPQ& ivfpq = *objects_->ivfpq;
  try {
    ivfpq.precompute_table();
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot build the precomputed table of index file ",
                     facts_.path, ": ", faiss_types::FaissMessage(e)));
  }
  facts_.precomputed_table_bytes =
      static_cast<int64_t>(ivfpq.precomputed_table.size() * sizeof(float));
  facts_.heap_bytes += facts_.precomputed_table_bytes;
  return absl::OkStatus();
}

absl::Status FaissIndex::Search(const FaissSearchArgs& args) const {
  try {
    const float* x = args.queries;
    std::unique_ptr<const float[]> transformed;
    if (objects_->pre != nullptr) {
      x = objects_->pre->apply_chain(args.num_queries, args.queries);
      if (x != args.queries) transformed.reset(x);
    }
    faiss::SearchParametersIVF params;
    params.nprobe = static_cast<size_t>(args.nprobe);
    SortedIdSelector selector(args.allowed_ids);
    if (!args.allowed_ids.empty()) params.sel = &selector;
    objects_->ivfpq->search(args.num_queries, x, args.k, args.distances,
                            args.ids, &params);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("FAISS search failed: ", e.what()));
  }
  const float pad = MissingDistance(facts_.metric);
  const int64_t n = args.num_queries * args.k;
  for (int64_t i = 0; i < n; ++i) {
    if (args.ids[i] < 0) args.distances[i] = pad;
  }
  return absl::OkStatus();
}

}  // namespace knnd
