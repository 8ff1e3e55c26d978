// Names and descriptions of FAISS objects for messages, and the one rule of
// which FAISS index types knnd serves. Internal to src/faiss/.
#ifndef KNND_FAISS_FAISS_TYPES_H_
#define KNND_FAISS_FAISS_TYPES_H_

#include <cstdint>
#include <exception>
#include <string>
#include <typeinfo>

#include <faiss/Index.h>
#include <faiss/VectorTransform.h>

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
// Heap bytes of a pre-transform's matrices.
int64_t TransformHeapBytes(const faiss::VectorTransform* vt);

// Why knnd cannot serve `inner` (the index under any pre-transform), or ""
// when it can: knnd serves IVF-PQ with memory-mappable lists.
std::string WhyNotServable(const faiss::Index& inner);

// A FAISS exception's message without its multi-line "Error in ... at
// file:line" prefix.
std::string FaissMessage(const std::exception& e);

}  // namespace faiss_types
}  // namespace knnd

#endif  // KNND_FAISS_FAISS_TYPES_H_
