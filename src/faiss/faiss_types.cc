#include "knnd/faiss/faiss_types.h"

#include <cxxabi.h>

#include <cstdlib>

#include <faiss/IndexIDMap.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexIVFPQ.h>
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
  if (auto* lt = dynamic_cast<const faiss::LinearTransform*>(vt)) {
    return static_cast<int64_t>((lt->A.size() + lt->b.size()) * sizeof(float));
  }
  return 0;
}

std::string WhyNotServable(const faiss::Index& inner) {
  const std::string type = TypeOf(&inner);
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
    return "knnd serves IVF-PQ indexes only (compressed codes in "
           "memory-mapped lists); use a factory such as 'IVF1024,PQ32'";
  }
  return "it is not an inverted-file index, so all its vectors would live on "
         "the heap; knnd serves IVF-PQ, e.g. 'IVF1024,PQ32'";
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
