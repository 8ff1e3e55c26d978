#include "testing/test_util.h"

#include <netinet/in.h>
#include <omp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <utility>

#include <faiss/IVFlib.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/index_factory.h>
#include <faiss/index_io.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "knnd/config/config.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_sharding.h"
#include "knnd/index/prepared_filter.h"
#include "knnd/lifecycle/index_source.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/payload_file.h"
#include "knnd/text/text_index_writer.h"

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

IndexSpec VersionSpec(int64_t version) {
  IndexSpec spec;
  spec.n = 1000;
  spec.d = 16;
  spec.factory = "IVF16,PQ4x4";
  spec.seed = static_cast<uint32_t>(version);
  spec.first_id = version * kVersionIdStride;
  return spec;
}

int64_t PublishIndex(const TempDir& tmp, const std::string& dir,
                     const IndexSpec& spec) {
  const std::string staging = tmp.path(absl::StrCat("staging.", spec.seed));
  WriteIndex(staging, spec);
  absl::StatusOr<IndexVersion> published = PublishVersion(dir, staging);
  EXPECT_TRUE(published.ok()) << published.status();
  return published.ok() ? published->version : 0;
}

std::vector<float> BuildIndex(const std::string& path, const BuildSpec& spec) {
  SetOpenMpThreadsOfThisThread(1);
  std::vector<float> x =
      spec.rows.empty() ? MakeData(spec.n, spec.d, spec.seed) : spec.rows;
  IndexBuilder::Options options;
  options.dim = spec.d;
  options.metric = spec.metric;
  options.factory = spec.factory;
  auto builder = IndexBuilder::Create(options);
  EXPECT_TRUE(builder.ok()) << builder.status();
  if (!builder.ok()) return x;
  EXPECT_TRUE((*builder)->Train(x.data(), spec.n).ok());
  const int64_t half = spec.n / 2;
  EXPECT_TRUE((*builder)->Add(x.data(), half, nullptr).ok());
  EXPECT_TRUE((*builder)
                  ->Add(x.data() + half * spec.d, spec.n - half, nullptr)
                  .ok());
  if (spec.vectors.has_value()) {
    const std::vector<float> stored =
        spec.metric == Metric::kCosine ? NormalizedRows(x, spec.d) : x;
    absl::Status s =
        WriteVectorsFile(VectorsPath(path), stored, spec.d, *spec.vectors);
    EXPECT_TRUE(s.ok()) << s;
  }
  knnd::v1::IndexMetadata metadata;
  metadata.set_source(
      absl::StrCat("MakeData(", spec.n, ", ", spec.d, ", ", spec.seed, ")"));
  if (!spec.ids.empty()) {
    absl::Status s = WriteIdTable(IdTablePath(path), spec.ids, "spec.ids");
    EXPECT_TRUE(s.ok()) << s;
    metadata.set_id_table(true);
  }
  if (!spec.payloads.empty()) {
    auto writer = PayloadFileWriter::Create(PayloadPath(path));
    EXPECT_TRUE(writer.ok()) << writer.status();
    if (!writer.ok()) return x;
    for (const std::string& line : spec.payloads) {
      absl::Status s = (*writer)->AppendJsonLine(line);
      EXPECT_TRUE(s.ok()) << s;
    }
    absl::Status s = (*writer)->Finish();
    EXPECT_TRUE(s.ok()) << s;
    metadata.set_payloads(true);
  }
  if (!spec.text_field.empty()) {
    auto payloads = PayloadFile::Open(PayloadPath(path), spec.n, false);
    EXPECT_TRUE(payloads.ok()) << payloads.status();
    if (!payloads.ok()) return x;
    const PayloadFile* files[] = {payloads->get()};
    TextIndexOptions text;
    text.field = spec.text_field;
    const TextIndexPart part{TextIndexPath(path), spec.n};
    auto written = WriteTextIndexes(files, text, {&part, 1});
    EXPECT_TRUE(written.ok()) << written.status();
    metadata.set_text_field(spec.text_field);
  }
  if (spec.attributes.has_value()) {
    absl::Status s =
        WriteAttributeStore(AttributeStorePath(path), *spec.attributes);
    EXPECT_TRUE(s.ok()) << s;
    metadata.set_attributes(true);
  }
  absl::Status written = (*builder)->Write(path, 4, metadata);
  EXPECT_TRUE(written.ok()) << written;
  return x;
}

AttributeColumns MakeAttributes(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t rows = static_cast<size_t>(n);
  AttributeColumns out;
  out.rows = n;
  AttributeColumn& u = out.columns.emplace_back();
  u.name = "u";
  u.type = AttributeType::kInteger;
  u.present.assign(rows, true);
  for (size_t r = 0; r < rows; ++r) u.ints.push_back(rng() % 100000);
  for (const char* name : {"genre", "tags"}) {
    AttributeColumn& c = out.columns.emplace_back();
    c.name = name;
    const bool list = c.name == "tags";
    c.type = list ? AttributeType::kKeywordList : AttributeType::kKeyword;
    c.dictionary = list ? std::vector<std::string>{"t0", "t1", "t2", "t3", "t4",
                                                   "t5", "t6", "t7", "t8", "t9"}
                        : std::vector<std::string>{"news", "sport", "arts",
                                                   "tech"};
    c.offsets.push_back(0);
    for (size_t r = 0; r < rows; ++r) {
      const size_t held = list ? rng() % 4 : (r % 7 == 0 ? 0 : 1);
      for (size_t i = 0; i < held; ++i) {
        c.codes.push_back(static_cast<uint32_t>(rng() % c.dictionary.size()));
      }
      c.present.push_back(held > 0);
      c.offsets.push_back(static_cast<int64_t>(c.codes.size()));
    }
  }
  AttributeColumn& score = out.columns.emplace_back();
  score.name = "score";
  score.type = AttributeType::kFloat;
  std::uniform_real_distribution<double> unit(0, 1);
  for (size_t r = 0; r < rows; ++r) {
    score.present.push_back(r % 5 != 0);
    score.floats.push_back(r % 5 != 0 ? unit(rng) : 0);
  }
  AttributeColumn& ts = out.columns.emplace_back();
  ts.name = "ts";
  ts.type = AttributeType::kTimestamp;
  ts.present.assign(rows, true);
  const int64_t start = int64_t{1577836800} * 1000000;  // 2020-01-01
  for (size_t r = 0; r < rows; ++r) {
    ts.ints.push_back(start + static_cast<int64_t>(r) * 86400 * 1000000);
  }
  return out;
}

absl::Status WriteVectorsFile(const std::string& path,
                              const std::vector<float>& x, int dim,
                              VectorsDtype dtype) {
  auto writer = VectorsFileWriter::Create(path, dim, dtype);
  if (!writer.ok()) return writer.status();
  const int64_t rows = static_cast<int64_t>(x.size()) / dim;
  if (absl::Status s = (*writer)->Append(x.data(), rows / 2); !s.ok()) return s;
  if (absl::Status s = (*writer)->Append(x.data() + rows / 2 * dim,
                                         rows - rows / 2);
      !s.ok()) {
    return s;
  }
  return (*writer)->Finish();
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

std::unique_ptr<IndexSnapshot> LoadSnapshot(const std::string& path,
                                            const LoadOptions& options) {
  auto loaded = IndexSnapshot::Load(path, options);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? std::move(*loaded) : nullptr;
}

SearchResults SearchPrepared(const IndexSnapshot& snapshot,
                             const std::vector<float>& queries, int k,
                             int nprobe, int refine_factor,
                             const PreparedFilter* filter,
                             absl::Span<const int64_t> allowed_ids) {
  const int64_t n = static_cast<int64_t>(queries.size()) / snapshot.info().dim;
  SearchResults results;
  results.distances.resize(n * k);
  results.ids.resize(n * k);
  SearchArgs args;
  args.queries = queries.data();
  args.num_queries = n;
  args.k = k;
  args.nprobe = nprobe;
  args.allowed_ids = allowed_ids;
  args.distances = results.distances.data();
  args.ids = results.ids.data();
  args.refine_factor = refine_factor;
  absl::Status status = snapshot.Search(args, filter);
  EXPECT_TRUE(status.ok()) << status;
  return results;
}

SearchResults SearchSnapshot(const IndexSnapshot& snapshot,
                             const std::vector<float>& queries, int k,
                             int nprobe, int refine_factor,
                             absl::Span<const int64_t> allowed_ids,
                             const RowBitmap* allowed_rows,
                             const ColumnRange* allowed_range) {
  const int64_t n = static_cast<int64_t>(queries.size()) / snapshot.info().dim;
  // The filter prepared as the handler prepares it (its plan chosen for
  // this shape).
  std::optional<PreparedFilter> filter;
  const FilteredSearchShape shape{n, k, nprobe, refine_factor};
  if (allowed_rows != nullptr) {
    filter =
        PrepareRows(snapshot, std::make_shared<const RowBitmap>(*allowed_rows),
                    nullptr, shape);
  } else if (allowed_range != nullptr) {
    filter = PrepareRange(snapshot, *allowed_range, shape);
  }
  return SearchPrepared(snapshot, queries, k, nprobe, refine_factor,
                        filter.has_value() ? &*filter : nullptr, allowed_ids);
}

std::vector<float> NormalizedRows(std::vector<float> x, int dim) {
  for (size_t i = 0; i < x.size(); i += dim) {
    double norm = 0;
    for (int j = 0; j < dim; ++j) norm += double{x[i + j]} * x[i + j];
    for (int j = 0; j < dim; ++j) {
      x[i + j] = static_cast<float>(x[i + j] / std::sqrt(norm));
    }
  }
  return x;
}

double ReferenceDistance(Metric metric, const float* q, const float* v,
                         int dim) {
  double dot = 0, l2 = 0, qn = 0;
  for (int j = 0; j < dim; ++j) {
    dot += double{q[j]} * v[j];
    l2 += (double{q[j]} - v[j]) * (double{q[j]} - v[j]);
    qn += double{q[j]} * q[j];
  }
  if (metric == Metric::kL2) return l2;
  return metric == Metric::kCosine ? dot / std::sqrt(qn) : dot;
}

std::vector<int64_t> BruteForceNeighbors(const std::vector<float>& base,
                                         const std::vector<float>& queries,
                                         int dim, int k, Metric metric) {
  const int64_t nb = static_cast<int64_t>(base.size()) / dim;
  const int64_t nq = static_cast<int64_t>(queries.size()) / dim;
  // Sorted ascending: the distance itself where smaller is closer, its
  // negation otherwise.
  const double sign = SmallerIsCloser(metric) ? 1 : -1;
  std::vector<int64_t> out;
  for (int64_t q = 0; q < nq; ++q) {
    std::vector<std::pair<double, int64_t>> all;
    for (int64_t b = 0; b < nb; ++b) {
      all.emplace_back(sign * ReferenceDistance(metric, &queries[q * dim],
                                                &base[b * dim], dim),
                       b);
    }
    std::partial_sort(all.begin(), all.begin() + k, all.end());
    for (int j = 0; j < k; ++j) out.push_back(all[j].second);
  }
  return out;
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

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& contents) {
  const std::filesystem::path parent =
      std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  EXPECT_TRUE(out.good()) << "cannot write " << path;
}

void PokeByte(const std::string& path, int64_t offset, char byte) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  f.put(byte);
  ASSERT_TRUE(f.good()) << "cannot change " << path;
}

void FlipByteFromEnd(const std::string& path, int64_t offset) {
  const std::string bytes = ReadFile(path);
  ASSERT_LE(offset, static_cast<int64_t>(bytes.size())) << path;
  const int64_t at = static_cast<int64_t>(bytes.size()) - offset;
  PokeByte(path, at, static_cast<char>(bytes[at] ^ 0x5a));
}

int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) {
    output->append(buf, n);
  }
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return child;
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

std::unique_ptr<Metrics> IdleMetrics() {
  Metrics::Options options;
  options.listen_address = "127.0.0.1:0";
  auto none = [] { return int64_t{0}; };
  absl::StatusOr<std::unique_ptr<Metrics>> metrics =
      Metrics::Create(options, {none, none, none, none});
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? std::move(*metrics) : nullptr;
}

knnd::v1::ServerConfig FrontConfig(const std::vector<std::string>& targets) {
  knnd::v1::ServerConfig config = TestConfig("");
  config.clear_index_path();
  for (const std::string& t : targets) config.add_shard_targets(t);
  config.set_shard_poll_interval_ms(100);
  config.set_admin_listen_address("");
  return config;
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

bool WaitReady(const RunningServer& front) {
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (absl::Now() < end) {
    grpc::ClientContext context;
    knnd::v1::GetIndexInfoResponse info;
    if (front.stub->GetIndexInfo(&context, {}, &info).ok()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

ServedShardSet ServeShardSet(const std::string& index, int count) {
  ServedShardSet set;
  absl::StatusOr<std::vector<ShardSpec>> split =
      ShardIndexFile(index, count, index, "test");
  EXPECT_TRUE(split.ok()) << split.status();
  set.whole = StartServer(TestConfig(index));
  std::vector<std::string> targets;
  for (int s = 0; s < count; ++s) {
    set.shards.push_back(StartServer(TestConfig(ShardPath(index, s, count))));
    targets.push_back(set.shards.back().address);
  }
  set.front = StartServer(FrontConfig(targets));
  EXPECT_TRUE(WaitReady(set.front));
  return set;
}

std::shared_ptr<grpc::Channel> FreshChannel(const std::string& address,
                                            grpc::ChannelArguments args) {
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

absl::StatusOr<Listener> ServeOnLoopback(AsyncService* service, int queues,
                                         int poll_us, const char* thread_name,
                                         std::function<bool()> may_poll) {
  ListenerSpec spec;
  spec.address = "127.0.0.1:0";
  spec.credentials = grpc::InsecureServerCredentials();
  spec.queues = queues;
  spec.poll_us = poll_us;
  spec.thread_name = thread_name;
  spec.may_poll = std::move(may_poll);
  spec.services.push_back(service);
  return BuildListener(spec);
}

void MoveResultsToBytes(knnd::v1::SearchResponse& r) {
  r.set_ids_i64le(std::string(reinterpret_cast<const char*>(r.ids().data()),
                              r.ids_size() * sizeof(int64_t)));
  r.set_distances_f32le(
      std::string(reinterpret_cast<const char*>(r.distances().data()),
                  r.distances_size() * sizeof(float)));
  r.set_approx_distances_f32le(
      std::string(reinterpret_cast<const char*>(r.approx_distances().data()),
                  r.approx_distances_size() * sizeof(float)));
  r.clear_ids();
  r.clear_distances();
  r.clear_approx_distances();
}

knnd::v1::SearchRequest MakeSearchRequest(const std::vector<float>& queries,
                                          int k) {
  knnd::v1::SearchRequest request;
  *request.mutable_vectors() = {queries.begin(), queries.end()};
  request.set_k(k);
  return request;
}

grpc::Status CallSearch(knnd::v1::KnnService::Stub& stub,
                        const knnd::v1::SearchRequest& request,
                        knnd::v1::SearchResponse* response,
                        grpc::ClientContext* context) {
  grpc::ClientContext local_context;
  knnd::v1::SearchResponse local_response;
  return stub.Search(context != nullptr ? context : &local_context, request,
                     response != nullptr ? response : &local_response);
}

grpc::health::v1::HealthCheckResponse::ServingStatus CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
    absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status =
      grpc::health::v1::Health::NewStub(channel)->Check(&context, request,
                                                        &response);
  return status.ok() ? response.status()
                     : grpc::health::v1::HealthCheckResponse::UNKNOWN;
}

void ExpectConfigRefused(const knnd::v1::ServerConfig& config,
                         const std::string& why) {
  const absl::Status refused = ValidateConfig(config);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find(why), absl::string_view::npos) << refused;
}

}  // namespace knnd::testing
