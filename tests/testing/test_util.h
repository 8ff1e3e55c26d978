// Shared helpers of knnd's tests: seeded data, small IVF-PQ files written
// with FAISS itself, temporary directories and an in-process server.
#ifndef KNND_TESTS_TEST_UTIL_H_
#define KNND_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <faiss/Index.h>
#include <grpcpp/grpcpp.h>

#include "knnd/server.h"
#include "knnd/v1/config.pb.h"
#include "knnd/v1/knn_service.grpc.pb.h"

namespace knnd::testing {

// n x d standard-normal float32 values from a fixed seed, row-major,
// grouped around `clusters` centres so that IVF lists are uneven, as in
// real data.
std::vector<float> MakeData(int64_t n, int d, uint32_t seed, int clusters = 32);

struct IndexSpec {
  int64_t n = 5000;
  int d = 32;
  std::string factory = "IVF32,PQ8";
  bool inner_product = false;
  int nprobe = 4;  // saved in the file
  uint32_t seed = 1234;
  // The vectors get ids first_id .. first_id + n - 1 (FAISS's own numbering
  // when 0), e.g. to tell which index answered.
  int64_t first_id = 0;
};

// Trains and fills an index as described, writes it to `path` with FAISS's
// writer and returns the base vectors.
std::vector<float> WriteIndex(const std::string& path, const IndexSpec& spec);

// FAISS's own reading of `path` into memory (no mmap), for reference
// searches.
std::unique_ptr<faiss::Index> ReadFaissIndex(const std::string& path);

// FAISS's own search of `index` with its IVF nprobe set to `nprobe`, on one
// OpenMP thread (FAISS splits batches by thread count): the reference that
// knnd's answers are compared with.
void FaissSearch(faiss::Index& index, int nprobe,
                 const std::vector<float>& queries, int k,
                 std::vector<float>* distances, std::vector<int64_t>* ids);

// FaissSearch of `path` read by ReadFaissIndex.
void ReferenceSearch(const std::string& path, const std::vector<float>& queries,
                     int k, int nprobe, std::vector<float>* distances,
                     std::vector<int64_t>* ids);

// A fresh directory under the test's temp dir, removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// A config for an in-process server on a free loopback port.
knnd::v1::ServerConfig TestConfig(const std::string& index_path);

// Expects the config check to refuse `config` with INVALID_ARGUMENT whose
// message contains `why`.
void ExpectConfigRefused(const knnd::v1::ServerConfig& config,
                         const std::string& why);

// A started, loaded in-process server and a stub connected to it.
struct RunningServer {
  std::unique_ptr<Server> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<knnd::v1::KnnService::Stub> stub;
  std::string address;
};
RunningServer StartServer(const knnd::v1::ServerConfig& config);

// XORs the byte `offset` bytes before the end of `path` with 0x5a. Near the
// end of an IVF-PQ file that is a stored code or id: the file stays
// structurally valid, and only its CRC-32 tells.
void FlipByteFromEnd(const std::string& path, int64_t offset);

// A free TCP port on 127.0.0.1 (bound then released; racy only in theory).
int FreePort();

}  // namespace knnd::testing

#endif  // KNND_TESTS_TEST_UTIL_H_
