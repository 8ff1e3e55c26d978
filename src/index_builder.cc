// The one file that touches FAISS types for building indexes. Everything
// FAISS throws is caught here and turned into an absl::Status.
#include "knnd/index_builder.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <typeinfo>

#include <faiss/IndexIDMap.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexIVFPQR.h>
#include <faiss/IndexPreTransform.h>
#include <faiss/index_factory.h>
#include <faiss/index_io.h>
#include <faiss/utils/distances.h>

#include "absl/strings/str_cat.h"
#include "knnd/index_metadata.h"

namespace knnd {

struct IndexBuilder::Faiss {
  std::unique_ptr<faiss::Index> root;
  faiss::IndexIVFPQ* ivfpq = nullptr;  // owned by root
};

namespace {

std::string TypeOf(const faiss::Index& index) {
  int status = 0;
  char* demangled =
      abi::__cxa_demangle(typeid(index).name(), nullptr, nullptr, &status);
  std::string name = status == 0 ? demangled : typeid(index).name();
  free(demangled);
  return name;
}

// FAISS messages carry a multi-line "Error in ... at file:line" prefix.
std::string FaissMessage(const std::exception& e) {
  std::string what = e.what();
  if (auto pos = what.find("Error: '"); pos != std::string::npos) {
    what = what.substr(pos);
  }
  return what;
}

// Why the daemon cannot serve `inner` (the index under any pre-transform);
// empty when it can. IndexSnapshot::Load makes the final check on the
// written file; this one refuses before hours of training are spent.
std::string WhyNotServable(const faiss::Index& inner) {
  const std::string type = TypeOf(inner);
  if (typeid(inner) == typeid(faiss::IndexIVFPQ)) return "";
  if (type.find("FastScan") != std::string::npos) {
    return "FastScan indexes (PQ..x4fs) keep their codes in "
           "BlockInvertedLists, which FAISS 1.7.3 cannot memory-map; use "
           "plain PQ, e.g. 'IVF1024,PQ32'";
  }
  if (dynamic_cast<const faiss::IndexIVFPQR*>(&inner) != nullptr) {
    return "the refinement codes of IVF-PQ-R live on the heap, not in the "
           "memory-mapped lists; use plain IVF-PQ, e.g. 'IVF1024,PQ32'";
  }
  if (dynamic_cast<const faiss::IndexIDMap*>(&inner) != nullptr) {
    return "IVF indexes store ids in their lists already; drop 'IDMap' and "
           "pass the ids with --ids";
  }
  if (dynamic_cast<const faiss::IndexIVF*>(&inner) != nullptr) {
    return "knnd serves IVF-PQ only (compressed codes in memory-mapped "
           "lists); use a factory such as 'IVF1024,PQ32'";
  }
  return "it is not an inverted-file index, so all its vectors would live on "
         "the heap; knnd serves IVF-PQ, e.g. 'IVF1024,PQ32'";
}

int64_t FloorPowerOfTwo(int64_t x) {
  int64_t p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}

// Makes a completed rename durable: the directory entry is on disk too.
void SyncDirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

absl::Status SyncFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) close(fd);
    return absl::DataLossError(
        absl::StrCat("cannot sync ", path, ": ", std::strerror(err)));
  }
  close(fd);
  return absl::OkStatus();
}

}  // namespace

int64_t DefaultNlist(int64_t rows) {
  const double target = 4.0 * std::sqrt(static_cast<double>(rows));
  int64_t nlist = FloorPowerOfTwo(std::max<int64_t>(1, std::llround(target)));
  // Round to the nearer power of two, not always down.
  if (target > 1.5 * static_cast<double>(nlist)) nlist *= 2;
  return std::max<int64_t>(1, std::min(nlist, FloorPowerOfTwo(std::max<int64_t>(1, rows / 39))));
}

int DefaultPqM(int dim) {
  for (int m = std::min(64, dim / 4); m > 1; --m) {
    if (dim % m == 0) return m;
  }
  return 1;
}

int64_t DefaultTrainRows(int64_t rows, int64_t nlist) {
  return std::min(rows, std::max<int64_t>(50 * nlist, 65536));
}

int DefaultNprobe(int64_t nlist) {
  return static_cast<int>(std::max<int64_t>(1, nlist / 32));
}

IndexBuilder::IndexBuilder(const Options& options, std::unique_ptr<Faiss> faiss)
    : options_(options), faiss_(std::move(faiss)) {}

IndexBuilder::~IndexBuilder() = default;

absl::StatusOr<std::unique_ptr<IndexBuilder>> IndexBuilder::Create(
    const Options& options) {
  if (options.dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dim=", options.dim, " must be positive"));
  }
  auto faiss = std::make_unique<Faiss>();
  const faiss::MetricType metric = options.metric == Metric::kL2
                                       ? faiss::METRIC_L2
                                       : faiss::METRIC_INNER_PRODUCT;
  try {
    faiss->root.reset(
        faiss::index_factory(options.dim, options.factory.c_str(), metric));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("factory '", options.factory, "' for dim=", options.dim,
                     " is not valid: ", FaissMessage(e)));
  }
  faiss::Index* inner = faiss->root.get();
  if (auto* pre = dynamic_cast<faiss::IndexPreTransform*>(inner)) {
    inner = pre->index;
  }
  if (std::string why = WhyNotServable(*inner); !why.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("factory '", options.factory, "' makes a ",
                     TypeOf(*inner), ", which knnd cannot serve: ", why));
  }
  faiss->ivfpq = static_cast<faiss::IndexIVFPQ*>(inner);
  // index_factory turns on polysemous training (a PQ centroid reordering for
  // Hamming-distance filtering, which knnd never uses); with M=56 on
  // Fashion-MNIST it took over 10 minutes of a 20-second build.
  faiss->ivfpq->do_polysemous_training = false;
  faiss->ivfpq->cp.seed = static_cast<int>(options.seed);
  faiss->ivfpq->pq.cp.seed = static_cast<int>(options.seed);
  return std::unique_ptr<IndexBuilder>(
      new IndexBuilder(options, std::move(faiss)));
}

int64_t IndexBuilder::nlist() const {
  return static_cast<int64_t>(faiss_->ivfpq->nlist);
}

int IndexBuilder::pq_m() const { return static_cast<int>(faiss_->ivfpq->pq.M); }

int64_t IndexBuilder::ntotal() const { return faiss_->root->ntotal; }

std::vector<float> IndexBuilder::NormalizedCopy(const float* vectors,
                                                int64_t rows) const {
  if (options_.metric != Metric::kCosine) return {};
  std::vector<float> copy(vectors, vectors + rows * options_.dim);
  faiss::fvec_renorm_L2(static_cast<size_t>(options_.dim),
                        static_cast<size_t>(rows), copy.data());
  return copy;
}

absl::Status IndexBuilder::Train(const float* vectors, int64_t rows) {
  const std::vector<float> normalized = NormalizedCopy(vectors, rows);
  try {
    faiss_->root->train(rows, normalized.empty() ? vectors : normalized.data());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("training on ", rows, " rows failed: ", FaissMessage(e)));
  }
  return absl::OkStatus();
}

absl::Status IndexBuilder::Add(const float* vectors, int64_t rows,
                               const int64_t* ids) {
  const std::vector<float> normalized = NormalizedCopy(vectors, rows);
  const float* x = normalized.empty() ? vectors : normalized.data();
  try {
    if (ids != nullptr) {
      faiss_->root->add_with_ids(rows, x, ids);
    } else {
      faiss_->root->add(rows, x);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("adding ", rows, " rows failed: ", FaissMessage(e)));
  }
  return absl::OkStatus();
}

absl::Status IndexBuilder::Write(const std::string& path, int nprobe,
                                 knnd::v1::IndexMetadata metadata) const {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  auto fail = [&tmp](absl::Status status) {
    std::remove(tmp.c_str());
    return status;
  };
  // The builder owns this index alone; no search shares its nprobe.
  faiss_->ivfpq->nprobe = static_cast<size_t>(std::max(1, nprobe));
  try {
    faiss::write_index(faiss_->root.get(), tmp.c_str());
  } catch (const std::exception& e) {
    return fail(absl::PermissionDeniedError(
        absl::StrCat("cannot write ", tmp, ": ", FaissMessage(e))));
  }
  if (absl::Status s = SyncFile(tmp); !s.ok()) return fail(s);
  LoadOptions check;
  check.use_precomputed_table = false;
  check.probe_in_subprocess = false;
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> loaded =
      IndexSnapshot::Load(tmp, check);
  if (!loaded.ok()) {
    return fail(absl::InternalError(absl::StrCat(
        "the written index does not load in knnd, so ", path,
        " was left as it was: ", loaded.status().message())));
  }
  const IndexInfo& info = (*loaded)->info();
  absl::StatusOr<std::string> crc = FileCrc32(tmp);
  if (!crc.ok()) return fail(crc.status());
  metadata.set_format_version(kIndexMetadataFormatVersion);
  metadata.set_dim(static_cast<uint32_t>(info.dim));
  metadata.set_metric(MetricName(options_.metric));
  metadata.set_normalized(options_.metric == Metric::kCosine);
  metadata.set_ntotal(info.ntotal);
  metadata.set_factory(options_.factory);
  metadata.set_file_bytes(info.file_bytes);
  metadata.set_crc32(*crc);
  loaded->reset();
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(absl::PermissionDeniedError(absl::StrCat(
        "cannot rename ", tmp, " to ", path, ": ", std::strerror(errno))));
  }
  SyncDirectoryOf(path);
  if (absl::Status s = WriteIndexMetadata(MetadataPath(path), metadata);
      !s.ok()) {
    return s;
  }
  SyncDirectoryOf(path);
  return absl::OkStatus();
}

}  // namespace knnd
