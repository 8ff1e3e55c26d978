#include "testing/test_util.h"

#include <netinet/in.h>
#include <omp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <faiss/IVFlib.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/index_factory.h>
#include <faiss/index_io.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "knnd/config/config.h"

namespace knnd::testing {

std::vector<float> MakeData(int64_t n, int d, uint32_t seed, int clusters) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> centres(static_cast<size_t>(clusters) * d);
  for (float& v : centres) v = 4.0f * normal(rng);
  std::uniform_int_distribution<int> pick(0, clusters - 1);
  std::vector<float> x(static_cast<size_t>(n) * d);
  for (int64_t i = 0; i < n; ++i) {
    const float* c = centres.data() + static_cast<size_t>(pick(rng)) * d;
    for (int j = 0; j < d; ++j) x[i * d + j] = c[j] + normal(rng);
  }
  return x;
}

std::vector<float> WriteIndex(const std::string& path, const IndexSpec& spec) {
  std::vector<float> x = MakeData(spec.n, spec.d, spec.seed);
  std::unique_ptr<faiss::Index> index(faiss::index_factory(
      spec.d, spec.factory.c_str(),
      spec.inner_product ? faiss::METRIC_INNER_PRODUCT : faiss::METRIC_L2));
  faiss::IndexIVF* ivf = faiss::ivflib::extract_index_ivf(index.get());
  if (auto* ivfpq = dynamic_cast<faiss::IndexIVFPQ*>(ivf)) {
    // index_factory turns on polysemous training, which takes over a minute
    // even on tiny data and is of no use to knnd's searches.
    ivfpq->do_polysemous_training = false;
  }
  index->train(spec.n, x.data());
  std::vector<faiss::Index::idx_t> ids(static_cast<size_t>(spec.n));
  for (int64_t i = 0; i < spec.n; ++i) ids[i] = spec.first_id + i;
  index->add_with_ids(spec.n, x.data(), ids.data());
  ivf->nprobe = spec.nprobe;
  faiss::write_index(index.get(), path.c_str());
  return x;
}

std::unique_ptr<faiss::Index> ReadFaissIndex(const std::string& path) {
  return std::unique_ptr<faiss::Index>(faiss::read_index(path.c_str()));
}

void FaissSearch(faiss::Index& index, int nprobe,
                 const std::vector<float>& queries, int k,
                 std::vector<float>* distances, std::vector<int64_t>* ids) {
  faiss::ivflib::extract_index_ivf(&index)->nprobe = nprobe;
  const int64_t n = static_cast<int64_t>(queries.size()) / index.d;
  distances->assign(static_cast<size_t>(n * k), 0);
  ids->assign(static_cast<size_t>(n * k), 0);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  index.search(n, queries.data(), k, distances->data(), ids->data());
  omp_set_num_threads(threads);
}

void ReferenceSearch(const std::string& path, const std::vector<float>& queries,
                     int k, int nprobe, std::vector<float>* distances,
                     std::vector<int64_t>* ids) {
  FaissSearch(*ReadFaissIndex(path), nprobe, queries, k, distances, ids);
}

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl =
      absl::StrCat(base != nullptr ? base : "/tmp", "/knnd_test.XXXXXX");
  char* made = mkdtemp(tmpl.data());
  if (made == nullptr) std::abort();
  dir_ = made;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void FlipByteFromEnd(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-offset, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-offset, std::ios::end);
  f.put(static_cast<char>(c ^ 0x5a));
  ASSERT_TRUE(f.good()) << "cannot change " << path;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

knnd::v1::ServerConfig TestConfig(const std::string& index_path) {
  knnd::v1::ServerConfig config;
  config.set_index_path(index_path);
  config.set_listen_address("127.0.0.1:0");
  config.set_admin_listen_address("127.0.0.1:0");
  config.set_metrics_listen_address(absl::StrCat("127.0.0.1:", FreePort()));
  config.set_num_workers(2);
  config.set_warmup_queries(2);
  config.set_enable_reflection(false);
  return config;
}

RunningServer StartServer(const knnd::v1::ServerConfig& config) {
  RunningServer running;
  absl::Status valid = ValidateConfig(config);
  EXPECT_TRUE(valid.ok()) << valid;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(config);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return running;
  running.server = std::move(*server);
  absl::Status started = running.server->Start();
  EXPECT_TRUE(started.ok()) << started;
  absl::Status loaded = running.server->LoadIndex();
  EXPECT_TRUE(loaded.ok()) << loaded;
  running.address = absl::StrCat("127.0.0.1:", running.server->port());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  running.channel = grpc::CreateCustomChannel(
      running.address, grpc::InsecureChannelCredentials(), args);
  running.stub = knnd::v1::KnnService::NewStub(running.channel);
  return running;
}

void ExpectConfigRefused(const knnd::v1::ServerConfig& config,
                         const std::string& why) {
  const absl::Status refused = ValidateConfig(config);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find(why), absl::string_view::npos) << refused;
}

}  // namespace knnd::testing
