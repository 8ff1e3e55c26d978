// The one file that touches FAISS types for serving. Everything FAISS throws
// is caught here and turned into an absl::Status.
#include "knnd/index_snapshot.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <typeinfo>
#include <vector>

#include <faiss/IndexFlat.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexPreTransform.h>
#include <faiss/VectorTransform.h>
#include <faiss/impl/IDSelector.h>
#include <faiss/index_io.h>
#include <faiss/invlists/OnDiskInvertedLists.h>
#include <faiss/utils/distances.h>
#include <faiss/utils/fp16.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "knnd/index_metadata.h"
#include "knnd/memory_model.h"

namespace knnd {

using idx_t = faiss::Index::idx_t;

const char* MetricName(Metric metric) {
  switch (metric) {
    case Metric::kL2: return "l2";
    case Metric::kInnerProduct: return "inner_product";
    case Metric::kCosine: return "cosine";
  }
  return "unknown";
}

absl::StatusOr<Metric> ParseMetric(absl::string_view name) {
  if (name == "l2") return Metric::kL2;
  if (name == "ip" || name == "inner_product") return Metric::kInnerProduct;
  if (name == "cosine") return Metric::kCosine;
  return absl::InvalidArgumentError(absl::StrCat(
      "metric '", name, "' is not one of l2, ip (inner_product), cosine"));
}

struct IndexSnapshot::Faiss {
  std::unique_ptr<faiss::Index> root;
  const faiss::IndexPreTransform* pre = nullptr;  // null without transform
  const faiss::IndexIVFPQ* ivfpq = nullptr;       // owned by root
};

namespace {

std::string TypeName(const void* object, const std::type_info& type) {
  if (object == nullptr) return "null";
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 ? demangled : type.name();
  free(demangled);
  return name;
}

template <typename T>
std::string TypeOf(const T* object) {
  return object == nullptr ? "null" : TypeName(object, typeid(*object));
}

// Factory-style description of one pre-transform, for logs and GetIndexInfo.
std::string DescribeTransform(const faiss::VectorTransform* vt) {
  if (auto* opq = dynamic_cast<const faiss::OPQMatrix*>(vt)) {
    return absl::StrCat("OPQ", opq->M, "_", opq->d_out);
  }
  if (dynamic_cast<const faiss::PCAMatrix*>(vt)) {
    return absl::StrCat("PCA", vt->d_out);
  }
  if (dynamic_cast<const faiss::RandomRotationMatrix*>(vt)) {
    return absl::StrCat("RR", vt->d_out);
  }
  if (dynamic_cast<const faiss::NormalizationTransform*>(vt)) {
    return "L2norm";
  }
  if (dynamic_cast<const faiss::LinearTransform*>(vt)) {
    // FAISS saves an OPQ matrix as a plain linear transform.
    return absl::StrCat("LT", vt->d_in, "_", vt->d_out);
  }
  return TypeOf(vt);
}

int64_t TransformHeapBytes(const faiss::VectorTransform* vt) {
  if (auto* lt = dynamic_cast<const faiss::LinearTransform*>(vt)) {
    return static_cast<int64_t>((lt->A.size() + lt->b.size()) * sizeof(float));
  }
  return 0;
}

// Explains why a non-IVF-PQ index cannot be served.
absl::Status Unsupported(const std::string& path, const faiss::Index* index) {
  const std::string type = TypeOf(index);
  std::string why;
  if (type.find("FastScan") != std::string::npos) {
    why =
        "FastScan indexes (PQ..x4fs) keep their codes in BlockInvertedLists, "
        "which FAISS 1.7.3 cannot memory-map; rebuild with plain PQ (e.g. "
        "'IVF1024,PQ32')";
  } else if (dynamic_cast<const faiss::IndexIVF*>(index) != nullptr) {
    why =
        "knnd serves IVF-PQ indexes only (compressed codes, memory-mapped "
        "lists); rebuild with a factory string such as 'IVF1024,PQ32'";
  } else {
    why =
        "it is not an inverted-file index, so its vectors would all live on "
        "the heap; knnd serves IVF-PQ indexes (e.g. 'IVF1024,PQ32')";
  }
  return absl::InvalidArgumentError(
      absl::StrCat("index file ", path, " holds a ", type,
                   ", which knnd cannot serve: ", why));
}

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(
      absl::StrCat("index file ", path, " is corrupt: ", what));
}

// The byte FAISS's reader copied from the file into a bool field: a corrupt
// file can leave any value there, and reading it as a bool is undefined.
int FileBoolByte(const bool& field) {
  unsigned char byte;
  std::memcpy(&byte, &field, 1);
  return byte;
}

// The same for an enum field: FAISS's reader copies any 32-bit value from the
// file into a faiss::MetricType, and loading one outside the enum's range is
// undefined, so it is compared as an int before it is used as a metric.
int32_t FileEnumValue(const faiss::MetricType& field) {
  static_assert(sizeof(field) == sizeof(int32_t));
  int32_t value;
  std::memcpy(&value, &field, sizeof(value));
  return value;
}

bool IsServedMetric(int32_t metric) {
  return metric == faiss::METRIC_L2 || metric == faiss::METRIC_INNER_PRODUCT;
}

// Checks the structure FAISS's reader does not check, above all that every
// memory-mapped inverted list lies inside the file: FAISS 1.7.3 computes list
// offsets from sizes stored in the file and a truncated or corrupt file would
// otherwise crash the first search that touches a list past its end.
absl::Status CheckStructure(const std::string& path, int64_t file_bytes,
                            const faiss::IndexIVFPQ& ivf, int d_in) {
  const faiss::ProductQuantizer& pq = ivf.pq;
  const int trained = FileBoolByte(ivf.is_trained);
  const int by_residual = FileBoolByte(ivf.by_residual);
  if (trained > 1 || by_residual > 1) {
    return Corrupt(path, absl::StrFormat(
                             "its flags is_trained=%d, by_residual=%d are not "
                             "0 or 1",
                             trained, by_residual));
  }
  if (trained == 0) return Corrupt(path, "the index is not trained");
  if (ivf.d <= 0 || d_in <= 0) {
    return Corrupt(path, absl::StrCat("dimension ", ivf.d));
  }
  const int32_t metric = FileEnumValue(ivf.metric_type);
  if (!IsServedMetric(metric)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index file ", path, " uses FAISS metric ", metric,
        "; knnd serves L2 and inner-product indexes only"));
  }
  if (ivf.quantizer != nullptr) {
    const int32_t quantizer_metric = FileEnumValue(ivf.quantizer->metric_type);
    if (!IsServedMetric(quantizer_metric)) {
      return Corrupt(path, absl::StrCat("its coarse quantizer's metric is ",
                                        quantizer_metric,
                                        ", not L2 (1) or inner product (0)"));
    }
  }
  if (ivf.quantizer == nullptr || ivf.quantizer->d != ivf.d ||
      ivf.quantizer->ntotal != static_cast<idx_t>(ivf.nlist)) {
    return Corrupt(path, absl::StrFormat(
                             "the coarse quantizer (%s, d=%d, ntotal=%d) does "
                             "not match nlist=%d, d=%d",
                             TypeOf(ivf.quantizer),
                             ivf.quantizer ? ivf.quantizer->d : 0,
                             ivf.quantizer ? ivf.quantizer->ntotal : 0,
                             ivf.nlist, ivf.d));
  }
  if (pq.M == 0 || pq.d != static_cast<size_t>(ivf.d) || pq.d % pq.M != 0 ||
      pq.nbits == 0 || pq.nbits > 16 || pq.code_size != ivf.code_size ||
      pq.centroids.size() != pq.d * pq.ksub) {
    return Corrupt(path, absl::StrFormat(
                             "product quantizer d=%d M=%d nbits=%d "
                             "code_size=%d does not fit index d=%d code_size=%d",
                             pq.d, pq.M, pq.nbits, pq.code_size, ivf.d,
                             ivf.code_size));
  }
  const faiss::InvertedLists* lists = ivf.invlists;
  if (lists == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index file ", path, " has no inverted lists (saved without data)"));
  }
  auto* ondisk = dynamic_cast<const faiss::OnDiskInvertedLists*>(lists);
  if (ondisk == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index file ", path, " has inverted lists of type ", TypeOf(lists),
        ", which cannot be memory-mapped"));
  }
  if (lists->nlist != ivf.nlist || lists->code_size != ivf.code_size) {
    return Corrupt(path, absl::StrFormat(
                             "inverted lists nlist=%d code_size=%d differ from "
                             "the index's nlist=%d code_size=%d",
                             lists->nlist, lists->code_size, ivf.nlist,
                             ivf.code_size));
  }
  if (ondisk->ptr == nullptr ||
      ondisk->totsize != static_cast<size_t>(file_bytes)) {
    return Corrupt(path, "its inverted lists are not mapped from the file");
  }
  const size_t entry_bytes = sizeof(idx_t) + ivf.code_size;
  size_t total_entries = 0;
  for (size_t i = 0; i < ondisk->lists.size(); ++i) {
    const auto& list = ondisk->lists[i];
    const size_t size = list.size;
    if (list.offset > ondisk->totsize ||
        size > (ondisk->totsize - list.offset) / entry_bytes ||
        list.capacity < size) {
      return Corrupt(
          path, absl::StrFormat(
                    "inverted list %d (offset %d, %d entries of %d bytes) "
                    "ends past the end of the file (%d bytes); the file is "
                    "truncated or was overwritten",
                    i, list.offset, size, entry_bytes, ondisk->totsize));
    }
    total_entries += size;
  }
  if (total_entries != static_cast<size_t>(ivf.ntotal)) {
    return Corrupt(path, absl::StrFormat(
                             "inverted lists hold %d vectors but the header "
                             "says ntotal=%d",
                             total_entries, ivf.ntotal));
  }
  return absl::OkStatus();
}

// Reads and checks the file; fills `faiss` and the structural part of `info`.
absl::Status ReadAndCheck(const std::string& path, bool precompute,
                          IndexSnapshot::Faiss& faiss, IndexInfo& info) {
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
  info.path = path;
  info.file_bytes = st.st_size;

  int flags = faiss::IO_FLAG_MMAP | faiss::IO_FLAG_READ_ONLY;
  if (!precompute) flags |= faiss::IO_FLAG_SKIP_PRECOMPUTE_TABLE;
  try {
    faiss.root.reset(faiss::read_index(path.c_str(), flags));
  } catch (const std::bad_alloc&) {
    return Corrupt(path, "a size in its header asks for more memory than "
                         "there is");
  } catch (const std::exception& e) {
    std::string what = e.what();
    // FAISS messages carry a multi-line "Error in ... at file:line" prefix.
    if (auto pos = what.find("Error: '"); pos != std::string::npos) {
      what = what.substr(pos);
    }
    return absl::DataLossError(absl::StrCat(
        "cannot read index file ", path,
        " (truncated, corrupt or not a FAISS index): ", what));
  }

  const faiss::Index* inner = faiss.root.get();
  std::string prefix;
  if (auto* pre = dynamic_cast<const faiss::IndexPreTransform*>(inner)) {
    faiss.pre = pre;
    info.has_pretransform = true;
    inner = pre->index;
    int d = pre->d;
    for (const faiss::VectorTransform* vt : pre->chain) {
      if (vt == nullptr || vt->d_in != d) {
        return Corrupt(path, "its pre-transform chain has mismatched sizes");
      }
      d = vt->d_out;
      absl::StrAppend(&prefix, DescribeTransform(vt), ",");
      info.heap_bytes += TransformHeapBytes(vt);
    }
    if (inner == nullptr || inner->d != d) {
      return Corrupt(path, "its pre-transform output does not match the index");
    }
  }
  auto* ivfpq = dynamic_cast<const faiss::IndexIVFPQ*>(inner);
  if (ivfpq == nullptr || TypeOf(inner).find("FastScan") != std::string::npos) {
    return Unsupported(path, inner);
  }
  faiss.ivfpq = ivfpq;
  if (absl::Status s = CheckStructure(path, info.file_bytes, *ivfpq,
                                      faiss.root->d);
      !s.ok()) {
    return s;
  }

  // Prefetch threads are started per search by default and made nprobe=32
  // searches 3x slower on these machines (shared/DESIGN.md).
  auto* ondisk = dynamic_cast<faiss::OnDiskInvertedLists*>(
      const_cast<faiss::InvertedLists*>(ivfpq->invlists));
  ondisk->prefetch_nthread = 0;

  const faiss::ProductQuantizer& pq = ivfpq->pq;
  info.dim = faiss.root->d;
  info.metric = ivfpq->metric_type == faiss::METRIC_L2 ? Metric::kL2
                                                        : Metric::kInnerProduct;
  info.ntotal = ivfpq->ntotal;
  info.nlist = static_cast<int64_t>(ivfpq->nlist);
  info.pq_m = static_cast<int>(pq.M);
  info.pq_nbits = static_cast<int>(pq.nbits);
  info.code_size_bytes = static_cast<int64_t>(ivfpq->code_size);
  info.stored_nprobe = static_cast<int>(std::max<size_t>(1, ivfpq->nprobe));
  info.precomputed_table_bytes =
      static_cast<int64_t>(ivfpq->precomputed_table.size() * sizeof(float));
  info.heap_bytes += info.precomputed_table_bytes +
                     static_cast<int64_t>(pq.centroids.size() * sizeof(float));
  if (auto* flat = dynamic_cast<const faiss::IndexFlatCodes*>(ivfpq->quantizer)) {
    info.heap_bytes += static_cast<int64_t>(flat->codes.size());
  }
  info.heap_bytes += static_cast<int64_t>(ivfpq->direct_map.array.size() *
                                          sizeof(idx_t));
  info.mapped_list_bytes =
      info.ntotal * static_cast<int64_t>(ivfpq->code_size + sizeof(idx_t));
  std::string quantizer;
  if (dynamic_cast<const faiss::IndexFlat*>(ivfpq->quantizer) == nullptr) {
    quantizer = absl::StrCat("(", TypeOf(ivfpq->quantizer), ")");
  }
  info.index_type = absl::StrCat(prefix, "IVF", info.nlist, quantizer, ",PQ",
                                 info.pq_m,
                                 info.pq_nbits == 8
                                     ? ""
                                     : absl::StrCat("x", info.pq_nbits));
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

absl::Status RunSearch(const IndexSnapshot::Faiss& faiss, Metric metric,
                       const SearchArgs& args) {
  try {
    const float* x = args.queries;
    std::unique_ptr<const float[]> transformed;
    if (faiss.pre != nullptr) {
      x = faiss.pre->apply_chain(args.num_queries, args.queries);
      if (x != args.queries) transformed.reset(x);
    }
    faiss::SearchParametersIVF params;
    params.nprobe = static_cast<size_t>(args.nprobe);
    SortedIdSelector selector(args.allowed_ids);
    if (!args.allowed_ids.empty()) params.sel = &selector;
    faiss.ivfpq->search(args.num_queries, x, args.k, args.distances, args.ids,
                        &params);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("FAISS search failed: ", e.what()));
  }
  const float pad = metric == Metric::kL2
                        ? std::numeric_limits<float>::infinity()
                        : -std::numeric_limits<float>::infinity();
  const int64_t n = args.num_queries * args.k;
  for (int64_t i = 0; i < n; ++i) {
    if (args.ids[i] < 0) args.distances[i] = pad;
  }
  return absl::OkStatus();
}

// Status <-> pipe bytes for the probe child: 1 byte code, then the message.
void WriteStatus(int fd, const absl::Status& status) {
  std::string out(1, static_cast<char>(status.code()));
  out.append(status.message().data(), status.message().size());
  const char* p = out.data();
  size_t left = out.size();
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// The probe runs in a new process image: the program's own executable,
// started by posix_spawn as `kProbeFlag PATH` with a pipe on kProbeFd for
// its answer, where RunIndexProbeIfAsked (first thing in main()) takes over.
// A bare fork() of the serving process would run FAISS's reader in a copy
// of a multi-threaded process, where a lock that another thread held at the
// fork (gRPC's, or an allocator's under the sanitizers) stays locked for
// ever; a fresh image inherits none of them.
constexpr char kProbeFlag[] = "--knnd_internal_index_probe";
constexpr int kProbeFd = 3;

// Reads the file in a new process (see kProbeFlag), runs one search there,
// and reports how it went. The parent learns of a corrupt file that
// crashes FAISS's reader (e.g. a division by a zero field) from the child's
// signal, and stays up.
absl::Status ProbeInSubprocess(const std::string& path,
                               absl::Duration timeout) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  // dup2 onto itself would leave close-on-exec set: move the write end off
  // kProbeFd first.
  if (fds[1] == kProbeFd) {
    const int moved = fcntl(fds[1], F_DUPFD_CLOEXEC, kProbeFd + 1);
    close(fds[1]);
    if (moved < 0) {
      close(fds[0]);
      return absl::InternalError(absl::StrCat("fcntl: ", strerror(errno)));
    }
    fds[1] = moved;
  }
  // Everything the child gets is built here: posix_spawn runs no code of
  // ours between its clone and the exec.
  char arg0[] = "knnd-index-probe";
  std::string flag = kProbeFlag;
  std::string file = path;
  char* argv[] = {arg0, flag.data(), file.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], kProbeFd);
  // Not the caller's blocked signals or ignored SIGPIPE: the child dies of
  // SIGTERM, or of SIGPIPE when the parent has gone.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int err =
      posix_spawn(&pid, "/proc/self/exe", &actions, &attr, argv, environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (err != 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat(
        "cannot start the index probe process (/proc/self/exe): ",
        strerror(err), "; probe_index_in_subprocess: false reads ", path,
        " without it"));
  }
  std::string reply;
  char buf[4096];
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  int poll_error = 0;
  for (;;) {
    const int64_t wait_ms =
        absl::ToInt64Milliseconds(absl::Ceil(deadline - absl::Now(),
                                             absl::Milliseconds(1)));
    if (wait_ms <= 0) {
      timed_out = true;
      break;
    }
    pollfd readable = {fds[0], POLLIN, 0};
    const int ready =
        poll(&readable, 1, static_cast<int>(std::min<int64_t>(wait_ms, 60000)));
    if (ready < 0 && errno != EINTR) {
      poll_error = errno;
      break;
    }
    if (ready <= 0) continue;
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      reply.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close(fds[0]);
  if (timed_out || poll_error != 0) kill(pid, SIGKILL);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the index probe process for ", path, " gave no answer within ",
        absl::FormatDuration(timeout),
        " and was killed (a hung or very slow filesystem?); "
        "index_probe_timeout_s sets the limit"));
  }
  if (poll_error != 0) {
    return absl::InternalError(absl::StrCat(
        "waiting for the index probe process for ", path, ": ",
        strerror(poll_error)));
  }
  if (WIFSIGNALED(wstatus)) {
    return Corrupt(path, absl::StrCat("reading it crashed a probe process (",
                                      strsignal(WTERMSIG(wstatus)), ")"));
  }
  if (reply.empty()) {
    // A sanitizer's report of a memory error in the reader ends here too.
    return absl::InternalError(absl::StrCat(
        "the probe process for ", path, " exited with status ",
        WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1,
        " without an answer (a program that loads indexes with the probe on "
        "must call knnd::RunIndexProbeIfAsked first in main)"));
  }
  return absl::Status(static_cast<absl::StatusCode>(reply[0]),
                      reply.substr(1));
}

// Applies the metadata sidecar of `path`, if it has one, to `info`: the
// sidecar must describe this file (checksum, dim, ntotal, FAISS metric).
absl::Status ApplyMetadata(const std::string& path, bool verify_checksum,
                           IndexInfo& info) {
  const std::string sidecar = MetadataPath(path);
  absl::StatusOr<knnd::v1::IndexMetadata> meta = ReadIndexMetadata(sidecar);
  if (absl::IsNotFound(meta.status())) return absl::OkStatus();
  if (!meta.ok()) return meta.status();
  if (verify_checksum) {
    if (absl::Status s = VerifyIndexChecksum(path, *meta); !s.ok()) return s;
  }
  absl::StatusOr<Metric> metric = ParseMetric(meta->metric());
  if (!metric.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(sidecar, ": ", metric.status().message()));
  }
  const Metric file_metric =
      *metric == Metric::kCosine ? Metric::kInnerProduct : *metric;
  if (meta->dim() != static_cast<uint32_t>(info.dim) ||
      meta->ntotal() != info.ntotal || file_metric != info.metric ||
      (*metric == Metric::kCosine && !meta->normalized())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s (dim=%d ntotal=%d metric=%s normalized=%s) does not describe "
        "index file %s (dim=%d ntotal=%d metric=%s)",
        sidecar, meta->dim(), meta->ntotal(), meta->metric(),
        meta->normalized() ? "true" : "false", path, info.dim, info.ntotal,
        MetricName(info.metric)));
  }
  info.metric = *metric;
  info.has_metadata = true;
  info.sidecar_crc32 = meta->crc32();
  info.sidecar_file_bytes = meta->file_bytes();
  info.normalized = meta->normalized();
  info.factory = meta->factory();
  info.source = meta->source();
  info.created = meta->created();
  return absl::OkStatus();
}

// Opens VectorsPath(path) as `options.vectors` asks; a file refused under
// kOptional leaves the reason in info.vectors_error and returns null.
absl::StatusOr<std::unique_ptr<VectorsFile>> OpenVectors(
    const std::string& path, const LoadOptions& options, IndexInfo& info) {
  if (options.vectors == VectorsPolicy::kIgnore) return nullptr;
  absl::StatusOr<std::unique_ptr<VectorsFile>> vectors = VectorsFile::Open(
      VectorsPath(path), info.dim, info.ntotal, options.verify_checksum);
  if (!vectors.ok()) {
    if (options.vectors == VectorsPolicy::kRequired) {
      return absl::Status(
          vectors.status().code(),
          absl::StrCat(vectors.status().message(),
                       " (re-ranking vectors are required: "
                       "require_vectors=true)"));
    }
    if (!absl::IsNotFound(vectors.status())) {
      info.vectors_error = std::string(vectors.status().message());
    }
    return nullptr;
  }
  info.has_vectors = true;
  info.vectors_path = (*vectors)->path();
  info.vectors_dtype = VectorsDtypeName((*vectors)->dtype());
  info.vectors_file_bytes = (*vectors)->file_bytes();
  return vectors;
}

// Exact distance of `query` to row `id` of `vectors`; `scratch` holds dim
// floats for decoding float16 rows.
float ExactDistance(const VectorsFile& vectors, Metric metric,
                    const float* query, int64_t id, float* scratch) {
  const size_t d = static_cast<size_t>(vectors.dim());
  const float* row;
  if (vectors.dtype() == VectorsDtype::kFloat16) {
    const auto* half = static_cast<const uint16_t*>(vectors.row(id));
    for (size_t j = 0; j < d; ++j) scratch[j] = faiss::decode_fp16(half[j]);
    row = scratch;
  } else {
    row = static_cast<const float*>(vectors.row(id));
  }
  return metric == Metric::kL2 ? faiss::fvec_L2sqr(query, row, d)
                               : faiss::fvec_inner_product(query, row, d);
}

// Re-ranks `kc` candidates per query (ids -1 are missing ones) into the k
// best by exact distance, closest first, ties by id; pads with -1.
void Rerank(const VectorsFile& vectors, Metric metric, const float* queries,
            int64_t num_queries, int kc, const int64_t* candidates, int k,
            float* distances, int64_t* ids) {
  const bool ascending = metric == Metric::kL2;
  const float pad = ascending ? std::numeric_limits<float>::infinity()
                              : -std::numeric_limits<float>::infinity();
  const int dim = vectors.dim();
  std::vector<float> scratch(static_cast<size_t>(dim));
  std::vector<std::pair<float, int64_t>> scored;
  scored.reserve(static_cast<size_t>(kc));
  for (int64_t q = 0; q < num_queries; ++q) {
    const float* query = queries + q * dim;
    scored.clear();
    for (int j = 0; j < kc; ++j) {
      const int64_t id = candidates[q * kc + j];
      if (id < 0 || id >= vectors.count()) continue;
      scored.emplace_back(
          ExactDistance(vectors, metric, query, id, scratch.data()), id);
    }
    const size_t keep = std::min(scored.size(), static_cast<size_t>(k));
    auto closer = [ascending](const std::pair<float, int64_t>& a,
                              const std::pair<float, int64_t>& b) {
      if (a.first != b.first) {
        return ascending ? a.first < b.first : a.first > b.first;
      }
      return a.second < b.second;
    };
    std::partial_sort(scored.begin(), scored.begin() + keep, scored.end(),
                      closer);
    for (int j = 0; j < k; ++j) {
      const bool have = static_cast<size_t>(j) < keep;
      distances[q * k + j] = have ? scored[j].first : pad;
      ids[q * k + j] = have ? scored[j].second : -1;
    }
  }
}

// The bytes FAISS 1.7.3's IndexIVFPQ::precompute_table() will allocate: a
// table only for residual encoding with an L2 coarse quantizer, of nlist * M
// * ksub floats, skipped above faiss::precomputed_table_max_bytes (and
// smaller for a multi-index quantizer, counted here as the plain size).
int64_t PlannedTableBytes(const faiss::IndexIVFPQ& ivfpq) {
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

}  // namespace

int SetCoarseBlockRowsUnder(int64_t mmap_threshold_bytes) {
  if (mmap_threshold_bytes > 0) {
    // Half the threshold: room for the allocator's header and rounding.
    const int64_t block = mmap_threshold_bytes / 2;
    const int64_t rows =
        block / (int64_t{faiss::distance_compute_blas_database_bs} * 4);
    faiss::distance_compute_blas_query_bs =
        static_cast<int>(std::clamp<int64_t>(rows, 20, 4096));
  }
  return faiss::distance_compute_blas_query_bs;
}

void RunIndexProbeIfAsked(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[1], kProbeFlag) != 0) return;
  struct stat st;
  if (fstat(kProbeFd, &st) != 0 || !S_ISFIFO(st.st_mode)) return;
  // A crash in the reader must reach the parent as the signal it is, not
  // as whatever the program installed (libFuzzer would save a crash).
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    signal(sig, SIG_DFL);
  }
  IndexSnapshot::Faiss faiss;
  IndexInfo info;
  absl::Status status =
      ReadAndCheck(argv[2], /*precompute=*/false, faiss, info);
  if (status.ok()) {
    std::vector<float> query(static_cast<size_t>(info.dim), 0.0f);
    float distance;
    int64_t id;
    SearchArgs args{query.data(), 1, 1, 1, {}, &distance, &id};
    status = RunSearch(faiss, info.metric, args);
  }
  WriteStatus(kProbeFd, status);
  _exit(0);
}

IndexSnapshot::IndexSnapshot(std::unique_ptr<Faiss> faiss, IndexInfo info,
                             std::unique_ptr<VectorsFile> vectors)
    : faiss_(std::move(faiss)),
      info_(std::move(info)),
      vectors_(std::move(vectors)) {}

IndexSnapshot::~IndexSnapshot() {
  faiss_.reset();
  // A version's heap (centroids, codebooks, the precomputed table: up to
  // gigabytes) is freed in a few large blocks that glibc may keep in its
  // arenas rather than return; give them back so that anonymous memory
  // falls to its level before the swap (issue: no growth across versions).
  malloc_trim(0);
}

absl::StatusOr<std::unique_ptr<IndexSnapshot>> IndexSnapshot::Load(
    const std::string& path, const LoadOptions& options) {
  const absl::Time start = absl::Now();
  if (options.probe_in_subprocess) {
    if (absl::Status s = ProbeInSubprocess(path, options.probe_timeout);
        !s.ok()) {
      return s;
    }
  }
  auto faiss = std::make_unique<Faiss>();
  IndexInfo info;
  // Read without the precomputed table first (the lists are mapped, so this
  // allocates only centroids and codebooks), check the planned heap, then
  // build the table, the part that can be large.
  if (absl::Status s = ReadAndCheck(path, /*precompute=*/false, *faiss, info);
      !s.ok()) {
    return s;
  }
  const int64_t table_bytes =
      options.use_precomputed_table ? PlannedTableBytes(*faiss->ivfpq) : 0;
  if (options.check_heap) {
    IndexInfo planned = info;
    planned.precomputed_table_bytes = table_bytes;
    planned.heap_bytes += table_bytes;
    if (absl::Status s = options.check_heap(planned); !s.ok()) return s;
  }
  if (table_bytes > 0) {
    // Ours alone until Load returns; FAISS needs a mutable index to build it.
    auto* ivfpq = const_cast<faiss::IndexIVFPQ*>(faiss->ivfpq);
    try {
      ivfpq->precompute_table();
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot build the precomputed table of index file ", path, ": ",
          e.what()));
    }
    info.precomputed_table_bytes =
        static_cast<int64_t>(ivfpq->precomputed_table.size() * sizeof(float));
    info.heap_bytes += info.precomputed_table_bytes;
  }
  if (absl::Status s = ApplyMetadata(path, options.verify_checksum, info);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<VectorsFile>> vectors =
      OpenVectors(path, options, info);
  if (!vectors.ok()) return vectors.status();
  info.version = options.version;
  info.load_time = absl::Now();
  info.load_duration = info.load_time - start;
  return std::unique_ptr<IndexSnapshot>(new IndexSnapshot(
      std::move(faiss), std::move(info), std::move(*vectors)));
}

absl::Status IndexSnapshot::VerifyChecksums(
    const std::atomic<bool>* cancel) const {
  if (info_.has_metadata) {
    knnd::v1::IndexMetadata recorded;
    recorded.set_file_bytes(info_.sidecar_file_bytes);
    recorded.set_crc32(info_.sidecar_crc32);
    if (absl::Status s = VerifyIndexChecksum(info_.path, recorded, cancel);
        !s.ok()) {
      return s;
    }
  }
  if (vectors_ != nullptr) return vectors_->VerifyChecksum(cancel);
  return absl::OkStatus();
}

absl::Status IndexSnapshot::Search(const SearchArgs& args) const {
  if (args.rerank_time != nullptr) *args.rerank_time = absl::ZeroDuration();
  if (args.refine_factor > 0 && vectors_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refine_factor=", args.refine_factor, " needs the raw-vectors file ",
        VectorsPath(info_.path), ", which is not loaded",
        info_.vectors_error.empty() ? ""
                                    : absl::StrCat(": ", info_.vectors_error)));
  }
  SearchArgs copy = args;
  std::vector<float> normalized;
  if (info_.metric == Metric::kCosine) {
    // The indexed vectors were normalised at build time, so inner products
    // are cosines only if the queries are normalised too. A copy: the
    // caller's buffer is the request message's.
    normalized.assign(args.queries,
                      args.queries + args.num_queries * info_.dim);
    faiss::fvec_renorm_L2(static_cast<size_t>(info_.dim),
                          static_cast<size_t>(args.num_queries),
                          normalized.data());
    copy.queries = normalized.data();
  }
  if (args.refine_factor <= 0) return RunSearch(*faiss_, info_.metric, copy);

  // refine_factor * k candidates from IVF-PQ, then the k best by exact
  // distance (memory_model.h counts these buffers).
  const int kc = args.k * args.refine_factor;
  const size_t n = static_cast<size_t>(args.num_queries) * kc;
  std::vector<float> candidate_distances(n);
  std::vector<int64_t> candidate_ids(n);
  copy.k = kc;
  copy.distances = candidate_distances.data();
  copy.ids = candidate_ids.data();
  if (absl::Status s = RunSearch(*faiss_, info_.metric, copy); !s.ok()) {
    return s;
  }
  const absl::Time start = absl::Now();
  Rerank(*vectors_, info_.metric, copy.queries, args.num_queries, kc,
         candidate_ids.data(), args.k, args.distances, args.ids);
  if (args.rerank_time != nullptr) *args.rerank_time = absl::Now() - start;
  return absl::OkStatus();
}

}  // namespace knnd
