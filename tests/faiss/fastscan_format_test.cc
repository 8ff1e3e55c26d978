// knnd's FastScan layout: written from FAISS's FastScan index, read back in
// place, and every damaged file refused with DATA_LOSS naming the file and
// the field instead of crashing.
#include "knnd/faiss/fastscan_format.h"

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/pq4_fast_scan.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/faiss/faiss_builder.h"
#include "knnd/faiss/fastscan_index.h"
#include "knnd/faiss/fastscan_writer.h"
#include "knnd/faiss/mapped_block_lists.h"
#include "testing/fastscan_util.h"

namespace knnd {
namespace {

using ::knnd::testing::FirstNonEmptyList;
using ::knnd::testing::HeaderOf;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::ListOf;
using ::knnd::testing::ReadBytes;
using ::knnd::testing::ReadFaissIndex;
using ::knnd::testing::Reseal;
using ::knnd::testing::SetHeader;
using ::knnd::testing::SetList;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteBytes;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

const faiss::IndexIVFPQFastScan& FastScanOf(const faiss::Index& index) {
  return dynamic_cast<const faiss::IndexIVFPQFastScan&>(index);
}

// One small index, written by FAISS and converted once for the suite.
class FastScanFormatTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    IndexSpec spec;
    spec.factory = "IVF32,PQ16x4fs";
    WriteIndex(dir_->path("faiss.index"), spec);
    faiss_ = ReadFaissIndex(dir_->path("faiss.index")).release();
    ASSERT_TRUE(WriteFastScanFile(*faiss_, dir_->path("base.index")).ok());
    bytes_ = new std::string(ReadBytes(dir_->path("base.index")));
  }
  static void TearDownTestSuite() {
    delete bytes_;
    delete faiss_;
    delete dir_;
  }

  // Writes `bytes`, opens them, expects `code` with a message naming the
  // file and containing `needle`.
  static void ExpectRefused(const std::string& bytes, const std::string& needle,
                            absl::StatusCode code = absl::StatusCode::kDataLoss) {
    const std::string path = dir_->path("bad.index");
    WriteBytes(path, bytes);
    auto opened = FastScanIndex::Open(path);
    ASSERT_FALSE(opened.ok()) << "opened a damaged file (expected: " << needle
                              << ")";
    EXPECT_EQ(opened.status().code(), code) << opened.status();
    EXPECT_THAT(opened.status().message(), HasSubstr(path));
    EXPECT_THAT(opened.status().message(), HasSubstr(needle));
  }

  // The suite's bytes with the header, or list `l`'s table entry, changed
  // by `edit`, and resealed.
  static std::string WithHeader(const std::function<void(FastScanHeader&)>& edit) {
    std::string b = *bytes_;
    FastScanHeader h = HeaderOf(b);
    edit(h);
    SetHeader(b, h);
    Reseal(b);
    return b;
  }
  static std::string WithList(
      uint64_t l, const std::function<void(FastScanListEntry&)>& edit) {
    std::string b = *bytes_;
    FastScanListEntry e = ListOf(b, l);
    edit(e);
    SetList(b, l, e);
    Reseal(b);
    return b;
  }

  static TempDir* dir_;
  static faiss::Index* faiss_;
  static std::string* bytes_;
};
TempDir* FastScanFormatTest::dir_ = nullptr;
faiss::Index* FastScanFormatTest::faiss_ = nullptr;
std::string* FastScanFormatTest::bytes_ = nullptr;

TEST_F(FastScanFormatTest, RoundTripMapsEveryListInPlace) {
  auto opened = FastScanIndex::Open(dir_->path("base.index"));
  ASSERT_TRUE(opened.ok()) << opened.status();
  const faiss::IndexIVFPQFastScan& src = FastScanOf(*faiss_);
  const faiss::IndexIVFPQFastScan& dst = FastScanOf((*opened)->faiss_index());
  const auto* lists = dynamic_cast<const MappedBlockLists*>(dst.invlists);
  ASSERT_NE(lists, nullptr) << "the lists were not installed as mapped lists";
  const FastScanHeader h = HeaderOf(*bytes_);
  for (size_t l = 0; l < src.nlist; ++l) {
    const size_t n = src.invlists->list_size(l);
    ASSERT_EQ(lists->list_size(l), n);
    if (n == 0) continue;
    const uint8_t* codes = lists->get_codes(l);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(codes) % 64, 0u) << "list " << l;
    EXPECT_GE(ListOf(*bytes_, l).codes_offset, h.lists_offset);
    EXPECT_EQ(std::memcmp(lists->get_ids(l), src.invlists->get_ids(l),
                          n * sizeof(int64_t)),
              0);
    for (size_t v = 0; v < (n + 31) / 32 * 32; ++v) {
      for (size_t sq = 0; sq < src.M2; ++sq) {
        // The slots of the last block past n are zero.
        const int expect = v < n ? faiss::pq4_get_packed_element(
                                       src.invlists->get_codes(l), 32, src.M2,
                                       v, sq)
                                 : 0;
        ASSERT_EQ(faiss::pq4_get_packed_element(codes, 32, src.M2, v, sq),
                  expect)
            << "list " << l << " vector " << v;
      }
    }
  }
  EXPECT_EQ(dst.nprobe, src.nprobe);
}

TEST_F(FastScanFormatTest, RewritingALoadedIndexGivesTheSameBytes) {
  auto opened = FastScanIndex::Open(dir_->path("base.index"));
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE(
      WriteFastScanFile((*opened)->faiss_index(), dir_->path("again.index"))
          .ok());
  EXPECT_EQ(ReadBytes(dir_->path("again.index")), *bytes_);
}

TEST_F(FastScanFormatTest, ConverterWritesTheSameBytes) {
  ASSERT_TRUE(ConvertFaissFileToFastScan(dir_->path("faiss.index"),
                                         dir_->path("converted.index"))
                  .ok());
  EXPECT_EQ(ReadBytes(dir_->path("converted.index")), *bytes_);
}

TEST_F(FastScanFormatTest, ConverterRefusesOtherIndexesNamingTheInput) {
  IndexSpec spec;
  spec.factory = "IVF16,PQ8";
  WriteIndex(dir_->path("ivfpq.index"), spec);
  const absl::Status s = ConvertFaissFileToFastScan(dir_->path("ivfpq.index"),
                                                    dir_->path("never.index"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(dir_->path("ivfpq.index")));
  EXPECT_THAT(s.message(), HasSubstr("IndexIVFPQFastScan"));
  const absl::Status missing =
      ConvertFaissFileToFastScan("/nonexistent/x.index", dir_->path("n.index"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("/nonexistent/x.index"));
}

TEST_F(FastScanFormatTest, WriterRefusesBlocksOfOtherThan32Vectors) {
  IndexSpec spec;
  spec.factory = "IVF16,PQ8x4fs_64";
  WriteIndex(dir_->path("bbs64.index"), spec);
  auto index = ReadFaissIndex(dir_->path("bbs64.index"));
  const absl::Status s = WriteFastScanFile(*index, dir_->path("x.index"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("bbs 64"));
}

TEST_F(FastScanFormatTest, ReadingPrintsNoWarning) {
  ::testing::internal::CaptureStderr();
  auto opened = FastScanIndex::Open(dir_->path("base.index"));
  const std::string printed = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(printed, "");
}

TEST_F(FastScanFormatTest, EmptyFileIsRefused) {
  ExpectRefused("", "empty");
}

TEST_F(FastScanFormatTest, TruncatedAnywhereIsRefused) {
  const FastScanHeader h = HeaderOf(*bytes_);
  const FastScanListEntry e = ListOf(*bytes_, FirstNonEmptyList(*bytes_));
  for (size_t cut : std::vector<size_t>{
           8, 64, kFastScanHeaderBytes - 1, kFastScanHeaderBytes,
           kFastScanHeaderBytes + 30, h.blob_offset,
           h.blob_offset + h.blob_bytes / 2, h.lists_offset,
           e.codes_offset + 10, e.ids_offset + 4, bytes_->size() / 2,
           bytes_->size() - 1}) {
    SCOPED_TRACE(cut);
    ExpectRefused(bytes_->substr(0, cut),
                  cut < kFastScanHeaderBytes ? "shorter than" : "file_bytes");
  }
  ExpectRefused(*bytes_ + std::string(64, '\0'), "file_bytes");
}

TEST_F(FastScanFormatTest, EveryHeaderByteIsChecked) {
  for (size_t i = 0; i < kFastScanHeaderBytes; ++i) {
    SCOPED_TRACE(i);
    std::string b = *bytes_;
    b[i] ^= 0x40;
    const std::string path = dir_->path("flip.index");
    WriteBytes(path, b);
    auto opened = FastScanIndex::Open(path);
    ASSERT_FALSE(opened.ok());
    EXPECT_THAT(opened.status().message(), HasSubstr(path));
  }
}

TEST_F(FastScanFormatTest, OtherFormatVersionIsFailedPrecondition) {
  ExpectRefused(WithHeader([](FastScanHeader& h) { h.format_version = 2; }),
                "format_version 2 is not supported",
                absl::StatusCode::kFailedPrecondition);
}

TEST_F(FastScanFormatTest, DamagedTableOrBlobFailsTheChecksum) {
  std::string b = *bytes_;
  b[kFastScanHeaderBytes + 9] ^= 1;  // list 0's codes_offset
  ExpectRefused(b, "meta_checksum");
  b = *bytes_;
  b[HeaderOf(b).blob_offset + 100] ^= 1;
  ExpectRefused(b, "meta_checksum");
}

TEST_F(FastScanFormatTest, MisalignedCodes) {
  ExpectRefused(WithList(FirstNonEmptyList(*bytes_),
                         [](FastScanListEntry& e) {
                           e.codes_offset += 32;
                           e.ids_offset += 32;
                         }),
                "not 64-byte aligned");
}

TEST_F(FastScanFormatTest, IdsNotRightAfterThePaddedCodes) {
  ExpectRefused(WithList(FirstNonEmptyList(*bytes_),
                         [](FastScanListEntry& e) { e.ids_offset -= 8; }),
                "ids_offset");
}

TEST_F(FastScanFormatTest, ListPastTheEndOfTheFile) {
  uint64_t last = 0;
  for (uint64_t l = 0; l < HeaderOf(*bytes_).nlist; ++l) {
    if (ListOf(*bytes_, l).n > 0) last = l;
  }
  ExpectRefused(WithList(last,
                         [](FastScanListEntry& e) {
                           e.n += 64;
                           e.ids_offset = e.codes_offset +
                                          FastScanPaddedCodeBytes(e.n, 8);
                         }),
                "past the end");
  // A huge n does not overflow the checks.
  ExpectRefused(
      WithList(last, [](FastScanListEntry& e) { e.n = ~uint64_t{0} / 2; }),
      "exceeds the file size");
}

TEST_F(FastScanFormatTest, OverlappingLists) {
  const uint64_t first = FirstNonEmptyList(*bytes_);
  const FastScanListEntry e1 = ListOf(*bytes_, first);
  ExpectRefused(WithList(FirstNonEmptyList(*bytes_, first + 1),
                         [&](FastScanListEntry& e2) {
                           e2.ids_offset = e1.codes_offset +
                                           (e2.ids_offset - e2.codes_offset);
                           e2.codes_offset = e1.codes_offset;
                         }),
                "overlaps");
  const uint64_t shift =
      e1.codes_offset - HeaderOf(*bytes_).blob_offset / 64 * 64;
  ExpectRefused(WithList(first,
                         [&](FastScanListEntry& e) {  // into the blob
                           e.codes_offset -= shift;
                           e.ids_offset -= shift;
                         }),
                "overlaps");
}

TEST_F(FastScanFormatTest, EmptyListWithOffsets) {
  ExpectRefused(WithList(FirstNonEmptyList(*bytes_),
                         [](FastScanListEntry& e) { e.n = 0; }),
                "is empty but has codes_offset");
}

TEST_F(FastScanFormatTest, ListSizesMustAddUpToNtotal) {
  ExpectRefused(WithHeader([](FastScanHeader& h) { h.ntotal += 1; }),
                "ntotal");
}

TEST_F(FastScanFormatTest, HeaderMustAgreeWithTheFaissBlob) {
  // The blob says L2, and dimension 32.
  ExpectRefused(WithHeader([](FastScanHeader& h) { h.metric = 0; }), "metric");
  ExpectRefused(WithHeader([](FastScanHeader& h) { h.dim += 1; }), "dim");
}

TEST_F(FastScanFormatTest, DamagedBlobIsDataLossNotACrash) {
  std::string b = *bytes_;
  std::memcpy(b.data() + HeaderOf(b).blob_offset, "ZZZZ", 4);  // unknown tag
  Reseal(b);
  ExpectRefused(b, "FAISS blob");
  // The regions consistent, the index cut short.
  ExpectRefused(WithHeader([](FastScanHeader& h) { h.blob_bytes = 200; }),
                "FAISS blob");
}

TEST_F(FastScanFormatTest, MappedListsAreReadOnly) {
  auto opened = FastScanIndex::Open(dir_->path("base.index"));
  ASSERT_TRUE(opened.ok()) << opened.status();
  faiss::InvertedLists* lists =
      FastScanOf((*opened)->faiss_index()).invlists;
  const faiss::Index::idx_t id = 1;
  uint8_t code[8] = {};
  EXPECT_THROW(lists->add_entries(0, 1, &id, code), faiss::FaissException);
}

// knnd's accessors read back every code FAISS's pq4_pack_codes packed, for
// every sub-quantizer (FAISS 1.7.3's own getter is wrong from 16 on, which
// made split shards' codes garbage), and a set changes only its element.
TEST(PackedCodes, AccessorsMatchFaissPackingForEverySubQuantizer) {
  for (const size_t m : {16, 32, 64, 196}) {
    for (const size_t n : {1, 31, 32, 33, 70}) {
      const size_t code_size = (m + 1) / 2;
      const size_t padded = (n + 31) / 32 * 32;
      std::vector<uint8_t> codes(n * code_size);
      for (size_t i = 0; i < codes.size(); ++i) {
        codes[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
      }
      std::vector<uint8_t> blocks(padded * m / 2);
      faiss::pq4_pack_codes(codes.data(), n, m, padded, 32, m, blocks.data());
      int wrong = 0;
      for (size_t v = 0; v < n; ++v) {
        for (size_t sq = 0; sq < m; ++sq) {
          const uint8_t want = (codes[v * code_size + sq / 2] >> (4 * (sq % 2))) & 15;
          wrong += GetPackedCode(blocks.data(), m, v, sq) != want;
        }
      }
      EXPECT_EQ(wrong, 0) << "M " << m << ", " << n << " vectors";
      // Setting one element changes that element only.
      std::vector<uint8_t> changed = blocks;
      const size_t v = n - 1;
      const size_t sq = m - 1;
      const uint8_t code = GetPackedCode(blocks.data(), m, v, sq) ^ 9;
      SetPackedCode(changed.data(), m, v, sq, code);
      for (size_t u = 0; u < padded; ++u) {
        for (size_t q = 0; q < m; ++q) {
          const uint8_t expected = u == v && q == sq
                                       ? code
                                       : GetPackedCode(blocks.data(), m, u, q);
          ASSERT_EQ(GetPackedCode(changed.data(), m, u, q), expected)
              << "M " << m << " vector " << u << " sq " << q;
        }
      }
    }
  }
}

}  // namespace
}  // namespace knnd
