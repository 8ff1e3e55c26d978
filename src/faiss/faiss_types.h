// Names and descriptions of FAISS objects for messages, the one rule of
// which FAISS index types knnd serves, and the one way src/faiss/ turns
// FAISS's exceptions into absl::Status. Internal to src/faiss/.
#ifndef KNND_FAISS_FAISS_TYPES_H_
#define KNND_FAISS_FAISS_TYPES_H_

#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <faiss/Index.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexPreTransform.h>
#include <faiss/VectorTransform.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace knnd {
namespace faiss_types {

// The demangled dynamic type of `object`, or "null".
std::string TypeName(const void* object, const std::type_info& type);
template <typename T>
std::string TypeOf(const T* object) {
  return object == nullptr ? "null" : TypeName(object, typeid(*object));
}

// Factory-style description of one pre-transform ("OPQ16_64", "PCA32" ...).
std::string DescribeTransform(const faiss::VectorTransform* vt);
// Heap bytes of a pre-transform's matrices (and a PCA's mean, eigenvalues
// and eigenvectors).
int64_t TransformHeapBytes(const faiss::VectorTransform* vt);

// An index as knnd serves it: an IVF index, alone or under one
// IndexPreTransform. Pointers are borrowed from the root given to
// SplitLayers().
struct IndexLayers {
  const faiss::IndexPreTransform* pre = nullptr;  // null without transform
  const faiss::Index* inner = nullptr;
  std::string prefix;  // factory style with a trailing comma, e.g. "PCA32,"
  int64_t transform_heap_bytes = 0;
};

// Unwraps `root` into `layers`; returns why the pre-transform chain is
// inconsistent (a missing transform, dimensions that do not chain up to the
// inner index), or "" when it is sound.
std::string SplitLayers(const faiss::Index& root, IndexLayers& layers);

// Factory-style name of an IVF index's coarse part: "IVF1024", or with a
// quantizer other than a flat index "IVF1024(faiss::IndexHNSWFlat)".
std::string DescribeIvf(const faiss::IndexIVF& ivf);
// Heap bytes of an IVF index outside its lists and PQ: the coarse
// quantizer's vectors (flat quantizers) and the direct map.
int64_t IvfHeapBytes(const faiss::IndexIVF& ivf);

// Why knnd cannot serve or build `inner` (the index under any
// pre-transform), or "" when it can: IVF-PQ with memory-mappable lists, or
// IVF-PQ FastScan with 32-vector blocks (which knnd converts to its own
// mappable layout when it writes the file; fastscan_format.h).
std::string WhyNotServable(const faiss::Index& inner);

// Checks that `path` is a readable regular file and sets `file_bytes`:
// NOT_FOUND, PERMISSION_DENIED or INVALID_ARGUMENT naming it otherwise.
absl::Status StatIndexFile(const std::string& path, int64_t& file_bytes);

// DATA_LOSS "index file PATH is corrupt: WHAT".
absl::Status CorruptIndexFile(absl::string_view path, absl::string_view what);

// A FAISS exception's message without its multi-line "Error in ... at
// file:line" prefix.
std::string FaissMessage(const std::exception& e);

// Runs fn() (returning absl::Status or void) and returns what it returns;
// an exception thrown inside becomes a status of `code` whose message is
// "<what>: <the exception's message>" (std::bad_alloc: "out of memory").
// The one place src/faiss/ catches FAISS's exceptions.
template <typename Fn>
absl::Status CatchFaiss(absl::StatusCode code, absl::string_view what,
                        Fn&& fn) noexcept {
  try {
    if constexpr (std::is_void_v<decltype(fn())>) {
      std::forward<Fn>(fn)();
      return absl::OkStatus();
    } else {
      return std::forward<Fn>(fn)();
    }
  } catch (const std::bad_alloc&) {
    return absl::Status(code, absl::StrCat(what, ": out of memory"));
  } catch (const std::exception& e) {
    return absl::Status(code, absl::StrCat(what, ": ", FaissMessage(e)));
  } catch (...) {
    return absl::Status(code, absl::StrCat(what, ": unknown exception"));
  }
}

}  // namespace faiss_types
}  // namespace knnd

#endif  // KNND_FAISS_FAISS_TYPES_H_
