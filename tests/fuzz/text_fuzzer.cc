// Fuzzes the text path: the first byte picks the analyzer (arbitrary bytes
// as a text: every term it makes is non-empty and at most kMaxTermBytes)
// or the
// text index reader (the bytes as an INDEX.text file, opened for the rows
// its header claims, then searched): each must return, never crash or read
// outside the file.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "knnd/text/analyzer.h"
#include "knnd/text/text_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    static const auto* analyzer =
        knnd::Analyzer::Create(knnd::AnalyzerOptions()).value().release();
    for (const std::string& term : analyzer->Tokenize(bytes)) {
      if (term.empty() || term.size() > knnd::kMaxTermBytes) std::abort();
    }
    return 0;
  }
  static const std::string path = knnd::fuzz::ScratchDir() + "/input.text";
  knnd::fuzz::WriteFileOrDie(path, data + 1, size - 1);
  uint64_t rows = 0;
  if (bytes.size() >= 24) std::memcpy(&rows, bytes.data() + 16, 8);
  absl::StatusOr<std::unique_ptr<knnd::TextIndex>> index =
      knnd::TextIndex::Open(path, static_cast<int64_t>(rows & 0xffffff),
                            /*verify_checksum=*/false);
  if (!index.ok()) return 0;
  std::vector<uint32_t> terms;
  for (uint32_t t = 0; t < 8; ++t) terms.push_back(t);
  terms.push_back(0xffffffffu);
  std::vector<float> scratch;
  std::vector<knnd::TextHit> hits;
  (*index)->Search(terms, nullptr, 10, &scratch, &hits);
  (*index)->FindTerm("a");
  (*index)->QueryTerms("fuzz 中文");
  return 0;
}
