// Helpers of the FastScan tests: knnd FastScan files made from seeded data,
// and reading and editing their bytes to damage them on purpose.
#ifndef KNND_TESTS_FASTSCAN_UTIL_H_
#define KNND_TESTS_FASTSCAN_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "knnd/faiss/fastscan_format.h"
#include "testing/test_util.h"

namespace knnd::testing {

// WriteIndex(faiss_path, spec) (a FastScan factory, written by FAISS), then
// that file converted to knnd's FastScan layout at `path`. Returns the base
// vectors.
std::vector<float> WriteFastScanIndex(const std::string& faiss_path,
                                      const std::string& path,
                                      const IndexSpec& spec);

std::string ReadBytes(const std::string& path);
void WriteBytes(const std::string& path, const std::string& bytes);

// The header and list-table entries of FastScan file bytes, and setters.
FastScanHeader HeaderOf(const std::string& bytes);
void SetHeader(std::string& bytes, const FastScanHeader& header);
FastScanListEntry ListOf(const std::string& bytes, uint64_t list);
void SetList(std::string& bytes, uint64_t list, const FastScanListEntry& entry);
// The first list at or after `from` with vectors.
uint64_t FirstNonEmptyList(const std::string& bytes, uint64_t from = 0);

// Recomputes the meta checksum of FastScan file bytes after a test edited
// them, so that a deeper validation rule is the one that refuses them.
void Reseal(std::string& bytes);

}  // namespace knnd::testing

#endif  // KNND_TESTS_FASTSCAN_UTIL_H_
