#include "testing/fastscan_util.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "knnd/faiss/faiss_builder.h"

namespace knnd::testing {

std::vector<float> WriteFastScanIndex(const std::string& faiss_path,
                                      const std::string& path,
                                      const IndexSpec& spec) {
  std::vector<float> base = WriteIndex(faiss_path, spec);
  const absl::Status converted = ConvertFaissFileToFastScan(faiss_path, path);
  EXPECT_TRUE(converted.ok()) << converted;
  return base;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

FastScanHeader HeaderOf(const std::string& bytes) {
  FastScanHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  return h;
}

void SetHeader(std::string& bytes, const FastScanHeader& header) {
  std::memcpy(bytes.data(), &header, sizeof header);
}

FastScanListEntry ListOf(const std::string& bytes, uint64_t list) {
  FastScanListEntry e;
  std::memcpy(&e, bytes.data() + kFastScanHeaderBytes + list * sizeof e,
              sizeof e);
  return e;
}

void SetList(std::string& bytes, uint64_t list, const FastScanListEntry& entry) {
  std::memcpy(bytes.data() + kFastScanHeaderBytes + list * sizeof entry,
              &entry, sizeof entry);
}

uint64_t FirstNonEmptyList(const std::string& bytes, uint64_t from) {
  const uint64_t nlist = HeaderOf(bytes).nlist;
  for (uint64_t l = from; l < nlist; ++l) {
    if (ListOf(bytes, l).n > 0) return l;
  }
  ADD_FAILURE() << "no list with vectors from list " << from;
  return 0;
}

void Reseal(std::string& bytes) {
  FastScanHeader h = HeaderOf(bytes);
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  absl::Span<const uint8_t> all(data, bytes.size());
  const uint64_t table_end = h.table_offset + h.nlist * kFastScanListEntryBytes;
  absl::Span<const uint8_t> table, blob;
  if (table_end <= bytes.size()) {
    table = all.subspan(h.table_offset, table_end - h.table_offset);
  }
  if (h.blob_offset + h.blob_bytes <= bytes.size()) {
    blob = all.subspan(h.blob_offset, h.blob_bytes);
  }
  h.meta_checksum = FastScanMetaChecksum(h, table, blob);
  SetHeader(bytes, h);
}

}  // namespace knnd::testing
