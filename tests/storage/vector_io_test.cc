#include "knnd/storage/vector_io.h"

#include <zlib.h>

#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::TempDir;
using ::testing::HasSubstr;

// A .npy version 1 file with `header` as its dict and `data_bytes` zero
// bytes of data.
void WriteNpy(const std::string& path, const std::string& dict,
              size_t data_bytes) {
  std::string header = dict;
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(header.size() & 0xff));
  out.put(static_cast<char>(header.size() >> 8));
  out << header << std::string(data_bytes, '\0');
}

TEST(ReadVectors, NpyRoundTripsThroughWriteVectors) {
  TempDir dir;
  Matrix m;
  m.rows = 3;
  m.dim = 2;
  m.values = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(WriteVectors(dir.path("m.npy"), m).ok());
  auto read = ReadVectors(dir.path("m.npy"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->rows, 3);
  EXPECT_EQ(read->dim, 2);
  EXPECT_EQ(read->values, m.values);
  ASSERT_TRUE(WriteVectors(dir.path("m.fvecs"), m).ok());
  auto fvecs = ReadVectors(dir.path("m.fvecs"), 2);
  ASSERT_TRUE(fvecs.ok()) << fvecs.status();
  EXPECT_EQ(fvecs->rows, 2);
  EXPECT_EQ(fvecs->values, std::vector<float>({1, 2, 3, 4}));
}

TEST(ReadVectors, NpyErrorsNameTheProblem) {
  TempDir dir;
  struct Case {
    std::string dict;
    size_t data_bytes;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 48,
       "dtype '<f8' is not little-endian float32"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), }", 96,
       "shape (2, 3, 4) is not 2-D (rows, dim)"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", 24,
       "shape (6) is not 2-D"},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24,
       "Fortran order"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20,
       "data is shorter than 2 x 3 float32"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.path("bad.npy");
    WriteNpy(path, c.dict, c.data_bytes);
    auto read = ReadVectors(path);
    ASSERT_FALSE(read.ok()) << c.dict;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(read.status().message(), HasSubstr(c.message)) << c.dict;
    EXPECT_THAT(read.status().message(), HasSubstr(path));
  }
}

TEST(ReadVectors, TruncatedFvecsAndIdxAreRefused) {
  TempDir dir;
  {
    std::ofstream out(dir.path("t.fvecs"), std::ios::binary);
    const int32_t d = 4;
    out.write(reinterpret_cast<const char*>(&d), 4);
    out << std::string(10, '\0');  // 16 bytes of values expected
  }
  EXPECT_THAT(ReadVectors(dir.path("t.fvecs")).status().message(),
              HasSubstr("not a multiple of the row size 20"));
  {
    std::ofstream out(dir.path("t-idx3-ubyte"), std::ios::binary);
    const unsigned char header[] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2};
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    out << std::string(5, '\0');  // 2 x 4 bytes expected
  }
  EXPECT_THAT(ReadVectors(dir.path("t-idx3-ubyte")).status().message(),
              HasSubstr("IDX data is shorter than 2 x 4"));
}

// Gzips `path` into `path`.gz.
void Gzip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  gzFile out = gzopen((path + ".gz").c_str(), "wb");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(out);
}

TEST(VectorReader, RangesInAnyOrderEqualTheWholeFileInEveryFormat) {
  TempDir dir;
  Matrix m;
  m.rows = 257;
  m.dim = 5;
  for (int64_t i = 0; i < m.rows * m.dim; ++i) {
    m.values.push_back(static_cast<float>(i % 97) - 40.5f);
  }
  ASSERT_TRUE(WriteVectors(dir.path("m.npy"), m).ok());
  ASSERT_TRUE(WriteVectors(dir.path("m.fvecs"), m).ok());
  Gzip(dir.path("m.npy"));
  Gzip(dir.path("m.fvecs"));
  struct Range {
    int64_t first;
    int64_t n;
  };
  // Forward, backward (a rewind for .gz), one row, the last rows.
  const std::vector<Range> ranges = {{10, 50}, {3, 4}, {200, 57}, {0, 1},
                                     {100, 100}};
  for (const char* name : {"m.npy", "m.fvecs", "m.npy.gz", "m.fvecs.gz"}) {
    auto reader = VectorReader::Open(dir.path(name));
    ASSERT_TRUE(reader.ok()) << name << ": " << reader.status();
    EXPECT_EQ((*reader)->rows(), m.rows) << name;
    EXPECT_EQ((*reader)->dim(), m.dim) << name;
    for (const Range& r : ranges) {
      std::vector<float> out(static_cast<size_t>(r.n * m.dim));
      ASSERT_TRUE((*reader)->Read(r.first, r.n, out.data()).ok()) << name;
      EXPECT_EQ(out, std::vector<float>(m.row(r.first),
                                        m.row(r.first + r.n)))
          << name << " rows " << r.first;
    }
    std::vector<float> past(2 * m.dim);
    EXPECT_EQ((*reader)->Read(m.rows - 1, 2, past.data()).code(),
              absl::StatusCode::kOutOfRange)
        << name;
  }
}

TEST(ReadIds, ReadsInt64AndInt32NpyAndRefusesFloats) {
  TempDir dir;
  {
    const std::string path = dir.path("ids.npy");
    WriteNpy(path, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", 0);
    std::ofstream out(path, std::ios::binary | std::ios::app);
    const int64_t ids[] = {7, 9, 1ll << 40};
    out.write(reinterpret_cast<const char*>(ids), sizeof ids);
  }
  auto ids = ReadIds(dir.path("ids.npy"));
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->cols, 1);
  EXPECT_EQ(ids->values, std::vector<int64_t>({7, 9, 1ll << 40}));
  {
    const std::string path = dir.path("gt.npy");
    WriteNpy(path, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }", 0);
    std::ofstream out(path, std::ios::binary | std::ios::app);
    const int32_t gt[] = {3, 4, 5, 6};
    out.write(reinterpret_cast<const char*>(gt), sizeof gt);
  }
  auto gt = ReadIds(dir.path("gt.npy"));
  ASSERT_TRUE(gt.ok()) << gt.status();
  EXPECT_EQ(gt->rows, 2);
  EXPECT_EQ(gt->cols, 2);
  EXPECT_EQ(gt->values, std::vector<int64_t>({3, 4, 5, 6}));
  WriteNpy(dir.path("f.npy"),
           "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  EXPECT_THAT(ReadIds(dir.path("f.npy")).status().message(),
              HasSubstr("is not little-endian int64 or int32"));
}

}  // namespace
}  // namespace knnd
