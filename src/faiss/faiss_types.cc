#include "knnd/faiss/faiss_types.h"

#include <cxxabi.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <faiss/IndexFlat.h>
#include <faiss/IndexFlatCodes.h>
#include <faiss/IndexIDMap.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/IndexIVFPQR.h>

#include "absl/strings/str_cat.h"

namespace knnd {
namespace faiss_types {

std::string TypeName(const void* object, const std::type_info& type) {
  if (object == nullptr) return "null";
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 ? demangled : type.name();
  std::free(demangled);
  return name;
}

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
  size_t floats = 0;
  if (auto* lt = dynamic_cast<const faiss::LinearTransform*>(vt)) {
    floats += lt->A.size() + lt->b.size();
  }
  if (auto* pca = dynamic_cast<const faiss::PCAMatrix*>(vt)) {
    floats += pca->mean.size() + pca->eigenvalues.size() + pca->PCAMat.size();
  }
  return static_cast<int64_t>(floats * sizeof(float));
}

std::string SplitLayers(const faiss::Index& root, IndexLayers& layers) {
  layers = IndexLayers();
  layers.inner = &root;
  auto* pre = dynamic_cast<const faiss::IndexPreTransform*>(&root);
  if (pre == nullptr) return "";
  layers.pre = pre;
  layers.inner = pre->index;
  int d = pre->d;
  for (const faiss::VectorTransform* vt : pre->chain) {
    if (vt == nullptr || vt->d_in != d) {
      return "its pre-transform chain has mismatched sizes";
    }
    d = vt->d_out;
    absl::StrAppend(&layers.prefix, DescribeTransform(vt), ",");
    layers.transform_heap_bytes += TransformHeapBytes(vt);
  }
  if (layers.inner == nullptr || layers.inner->d != d) {
    return "its pre-transform output does not match the index";
  }
  return "";
}

std::string DescribeIvf(const faiss::IndexIVF& ivf) {
  std::string name = absl::StrCat("IVF", ivf.nlist);
  if (dynamic_cast<const faiss::IndexFlat*>(ivf.quantizer) == nullptr) {
    absl::StrAppend(&name, "(", TypeOf(ivf.quantizer), ")");
  }
  return name;
}

int64_t IvfHeapBytes(const faiss::IndexIVF& ivf) {
  int64_t bytes = static_cast<int64_t>(ivf.direct_map.array.size() *
                                       sizeof(faiss::Index::idx_t));
  if (auto* flat = dynamic_cast<const faiss::IndexFlatCodes*>(ivf.quantizer)) {
    bytes += static_cast<int64_t>(flat->codes.size());
  }
  return bytes;
}

std::string WhyNotServable(const faiss::Index& inner) {
  const std::string type = TypeOf(&inner);
  if (typeid(inner) == typeid(faiss::IndexIVFPQ)) return "";
  if (typeid(inner) == typeid(faiss::IndexIVFPQFastScan)) {
    const int bbs = static_cast<const faiss::IndexIVFPQFastScan&>(inner).bbs;
    if (bbs == 32) return "";
    return absl::StrCat("FastScan with bbs=", bbs,
                        " is not supported: knnd maps 32-vector blocks only; "
                        "drop the '_", bbs, "', e.g. 'IVF1024,PQ64x4fs'");
  }
  if (type.find("FastScan") != std::string::npos) {
    return "knnd serves IVF-PQ FastScan ('IVF<nlist>,PQ<M>x4fs'), not other "
           "FastScan indexes";
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
    return "knnd serves IVF-PQ indexes only (compressed codes in "
           "memory-mapped lists); use a factory such as 'IVF1024,PQ32'";
  }
  return "it is not an inverted-file index, so all its vectors would live on "
         "the heap; knnd serves IVF-PQ, e.g. 'IVF1024,PQ32'";
}

absl::Status StatIndexFile(const std::string& path, int64_t& file_bytes) {
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

absl::Status CorruptIndexFile(absl::string_view path, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("index file ", path, " is corrupt: ", what));
}

std::string FaissMessage(const std::exception& e) {
  std::string what = e.what();
  if (auto pos = what.find("Error: '"); pos != std::string::npos) {
    what = what.substr(pos);
  }
  return what;
}

}  // namespace faiss_types
}  // namespace knnd
