// knnctl search, info and health: the gRPC client commands of knnd's
// search API (info also reads an index file locally).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "command.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "knnd/base/metric.h"
#include "knnd/base/percentile.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/vector_io.h"
#include "knnd/v1/knn_service.grpc.pb.h"
#include "knnd_client.h"
#include "knnd/base/units.h"

namespace knnd::knnctl {
namespace {

using knnd::v1::KnnService;

struct SearchOptions {
  KnndClient::Options client;
  QueryOptions query;
  int64_t random = 0;
  int nprobe = 0;
  int refine_factor = -1;
  int64_t batch = 256;
  int64_t show = 3;
  std::string texts;   // one text query per line (hybrid retrieval)
  std::string fusion;  // rrf | weighted; empty: the server's default (rrf)
};

struct InfoOptions {
  KnndClient::Options client;
  std::string index;
};

struct HealthOptions {
  KnndClient::Options client;
  std::string service;
  double wait_s = 0;  // poll until SERVING for at most this long
};

// MetricName()'s name of the metric a response reports.
const char* MetricOf(knnd::v1::Metric metric) {
  switch (metric) {
    case knnd::v1::METRIC_L2:
      return MetricName(Metric::kL2);
    case knnd::v1::METRIC_INNER_PRODUCT:
      return MetricName(Metric::kInnerProduct);
    case knnd::v1::METRIC_COSINE:
      return MetricName(Metric::kCosine);
    default:
      return "unspecified";
  }
}

// --queries, or --random seeded normal vectors of the served dim; none
// (0 rows) for texts alone.
absl::StatusOr<Matrix> SearchQueries(const SearchOptions& options, int dim) {
  if (!options.query.queries.empty()) {
    return ReadVectors(options.query.queries, options.query.limit);
  }
  if (options.random <= 0 && !options.texts.empty()) return Matrix();
  if (options.random <= 0) {
    return absl::InvalidArgumentError(
        "search needs --queries FILE, --random N or --texts FILE");
  }
  Matrix queries;
  queries.rows = options.random;
  queries.dim = dim;
  queries.values.resize(static_cast<size_t>(queries.rows) * queries.dim);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& v : queries.values) v = normal(rng);
  return queries;
}

int Search(const SearchOptions& options) {
  absl::StatusOr<std::unique_ptr<KnndClient>> client =
      KnndClient::Create(options.client);
  if (!client.ok()) return Fail(client.status());
  auto stub = KnnService::NewStub((*client)->channel());
  knnd::v1::GetIndexInfoResponse info;
  {
    grpc::ClientContext context;
    (*client)->Prepare(context);
    grpc::Status s = stub->GetIndexInfo(&context, {}, &info);
    if (!s.ok()) return FailRpc("GetIndexInfo", s);
  }
  absl::StatusOr<Matrix> read =
      SearchQueries(options, static_cast<int>(info.dim()));
  if (!read.ok()) return Fail(read.status());
  const Matrix& queries = *read;
  std::vector<std::string> texts;
  if (!options.texts.empty()) {
    std::ifstream in(options.texts);
    if (!in) return Fail(absl::StrCat("cannot read --texts ", options.texts));
    for (std::string line; std::getline(in, line);) texts.push_back(line);
    if (queries.rows > 0 &&
        static_cast<int64_t>(texts.size()) != queries.rows) {
      return Fail(absl::StrCat("--texts holds ", texts.size(),
                               " lines but there are ", queries.rows,
                               " query vectors: give one text per vector"));
    }
  }
  knnd::v1::FusionMethod fusion = knnd::v1::FUSION_UNSPECIFIED;
  if (options.fusion == "weighted") {
    fusion = knnd::v1::FUSION_WEIGHTED;
  } else if (options.fusion == "rrf") {
    fusion = knnd::v1::FUSION_RRF;
  } else if (!options.fusion.empty()) {
    return Fail(
        absl::StrCat("--fusion=", options.fusion, " is not rrf or weighted"));
  }
  const int64_t rows =
      queries.rows > 0 ? queries.rows : static_cast<int64_t>(texts.size());
  const int64_t batch = std::max<int64_t>(1, options.batch);
  std::vector<double> latencies_ms;
  const absl::Time start = absl::Now();
  int64_t shown = 0;
  for (int64_t begin = 0; begin < rows; begin += batch) {
    const int64_t end = std::min(rows, begin + batch);
    knnd::v1::SearchRequest request;
    request.set_dim(static_cast<uint32_t>(queries.dim));
    request.set_k(options.query.k);
    if (!texts.empty()) {
      for (int64_t q = begin; q < end; ++q) request.add_texts(texts[q]);
      if (queries.rows > 0) request.set_fusion(fusion);
    }
    if (options.refine_factor >= 0) {
      request.set_refine_factor(static_cast<uint32_t>(options.refine_factor));
    }
    if (options.nprobe > 0) {
      request.set_nprobe(static_cast<uint32_t>(options.nprobe));
    }
    if (queries.rows > 0) {
      request.set_vectors_f32le(
          reinterpret_cast<const char*>(queries.row(begin)),
          static_cast<size_t>(end - begin) * queries.dim * sizeof(float));
    }
    knnd::v1::SearchResponse response;
    grpc::ClientContext context;
    (*client)->Prepare(context);
    const absl::Time t0 = absl::Now();
    grpc::Status s = stub->Search(&context, request, &response);
    latencies_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    if (!s.ok()) return FailRpc("Search", s);
    for (int64_t q = 0; q < end - begin && shown < options.show; ++q, ++shown) {
      std::printf("query %lld:", static_cast<long long>(begin + q));
      for (int j = 0; j < response.k(); ++j) {
        const int idx = static_cast<int>(q * response.k() + j);
        std::printf(" %lld(%.4g)", static_cast<long long>(response.ids(idx)),
                    response.distances(idx));
        if (response.text_ranks_size() > idx) {
          // Where each retriever put it: v<rank> t<rank>, 0 = not found.
          std::printf("[v%u t%u]",
                      response.vector_ranks_size() > idx
                          ? response.vector_ranks(idx)
                          : 0u,
                      response.text_ranks(idx));
        }
      }
      std::printf("\n");
    }
    if (begin == 0) {
      std::printf(
          "index version %lld, metric %s, nprobe %u, refine_factor "
          "%u\n",
          static_cast<long long>(response.index_version()),
          MetricOf(response.metric()), response.nprobe(),
          response.refine_factor());
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf(
      "%lld queries in %zu requests of <= %lld: %.1f ms total, %.0f queries/s; "
      "request latency p50 %.2f ms, p99 %.2f ms\n",
      static_cast<long long>(rows), latencies_ms.size(),
      static_cast<long long>(batch), seconds * 1e3, rows / seconds,
      Percentile(latencies_ms, 0.5), Percentile(latencies_ms, 0.99));
  return kExitOk;
}

// An index file read locally, as knnd would load it.
int InfoOfFile(const std::string& path) {
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> snapshot =
      IndexSnapshot::Load(path, {});
  if (!snapshot.ok()) return Fail(snapshot.status());
  const IndexInfo& i = (*snapshot)->info();
  std::printf(
      "path:            %s\ntype:            %s\nvectors:         %lld\n"
      "dim:             %d\nmetric:          %s\nnlist:           %lld\n"
      "pq:              M=%d x %d bits, %lld bytes/vector\n"
      "stored nprobe:   %d\nfile:            %.1f MiB (mapped lists %.1f MiB)\n"
      "heap:            %.1f MiB (precomputed table %.1f MiB, filter cache "
      "%.1f MiB)\n"
      "load:            %.1f ms\n",
      i.path.c_str(), i.index_type.c_str(), static_cast<long long>(i.ntotal),
      i.dim, MetricName(i.metric), static_cast<long long>(i.nlist), i.pq_m,
      i.pq_nbits, static_cast<long long>(i.code_size_bytes), i.stored_nprobe,
      MiB(i.file_bytes), MiB(i.mapped_list_bytes),
      MiB(i.heap_bytes), MiB(i.precomputed_table_bytes),
      MiB(i.filter_cache_bytes), absl::ToDoubleMilliseconds(i.load_duration));
  if (i.has_vectors) {
    std::printf("raw vectors:     %s (%s, %.1f MiB) for refine_factor > 0\n",
                i.vectors_path.c_str(), i.vectors_dtype.c_str(),
                MiB(i.vectors_file_bytes));
  } else if (!i.vectors_error.empty()) {
    std::printf("raw vectors:     not usable: %s\n", i.vectors_error.c_str());
  }
  if (i.has_id_table) {
    std::printf("ids:             its own, through %s (%.1f MiB)\n",
                i.id_table_path.c_str(), MiB(i.id_table_file_bytes));
  }
  if (i.has_payloads) {
    std::printf("payloads:        %s (%.1f MiB, largest row %lld bytes), "
                "fields: %s\n",
                i.payloads_path.c_str(), MiB(i.payloads_file_bytes),
                static_cast<long long>(i.max_payload_json_bytes),
                absl::StrJoin(i.payload_fields, ", ").c_str());
  }
  if (const TextIndex* text = (*snapshot)->text(); text != nullptr) {
    const TextIndexStats& t = text->stats();
    std::printf(
        "text:            %s (%.1f MiB): BM25 of payload field \"%s\" "
        "(k1 %g, b %g; %s), %lld terms, %lld postings, %lld empty "
        "rows; corpus %lld rows of %.1f terms on average\n",
        i.text_path.c_str(), MiB(i.text_file_bytes), t.field.c_str(), t.k1, t.b,
        text->analyzer().Describe().c_str(), static_cast<long long>(t.terms),
        static_cast<long long>(t.postings),
        static_cast<long long>(t.empty_rows),
        static_cast<long long>(t.corpus_rows), t.corpus_average_length);
  }
  if (const AttributeStore* attributes = (*snapshot)->attributes();
      attributes != nullptr) {
    std::printf("attributes:      %s (%.1f MiB)\n", i.attributes_path.c_str(),
                MiB(i.attributes_file_bytes));
    for (const AttributeStore::Column& column : attributes->columns()) {
      std::printf("  %-14s %s, %lld %s\n", column.name.c_str(),
                  AttributeTypeName(column.type),
                  static_cast<long long>(column.count),
                  IsNumeric(column.type) ? "rows with a value"
                                         : "distinct keywords");
    }
  }
  return kExitOk;
}

int Info(const InfoOptions& options) {
  if (!options.index.empty()) return InfoOfFile(options.index);
  absl::StatusOr<std::unique_ptr<KnndClient>> client =
      KnndClient::Create(options.client);
  if (!client.ok()) return Fail(client.status());
  auto stub = KnnService::NewStub((*client)->channel());
  knnd::v1::GetIndexInfoResponse info;
  grpc::ClientContext context;
  (*client)->Prepare(context);
  grpc::Status s = stub->GetIndexInfo(&context, {}, &info);
  if (!s.ok()) return FailRpc("GetIndexInfo", s);
  std::printf("%s", info.DebugString().c_str());
  return kExitOk;
}

int Health(const HealthOptions& options) {
  using grpc::health::v1::HealthCheckResponse;
  if (!(options.wait_s >= 0 && options.wait_s <= 86400)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--wait=", options.wait_s, " is outside [0, 86400] seconds")));
  }
  absl::StatusOr<std::unique_ptr<KnndClient>> client =
      KnndClient::Create(options.client);
  if (!client.ok()) return Fail(client.status());
  auto stub = grpc::health::v1::Health::NewStub((*client)->channel());
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(options.service);
  // With --wait, a knnd not listening yet or still loading is asked again
  // every 200 ms until it serves or the wait is over; the last answer (or
  // error) is the one printed.
  const absl::Time give_up = absl::Now() + absl::Seconds(options.wait_s);
  for (;;) {
    HealthCheckResponse response;
    grpc::ClientContext context;
    (*client)->Prepare(context);
    grpc::Status s = stub->Check(&context, request, &response);
    const bool serving =
        s.ok() && response.status() == HealthCheckResponse::SERVING;
    if (serving || absl::Now() + absl::Milliseconds(200) > give_up) {
      if (!s.ok()) {
        FailRpc("health check", s);
        return kExitNotServing;
      }
      std::printf(
          "%s\n",
          HealthCheckResponse::ServingStatus_Name(response.status()).c_str());
      return serving ? kExitOk : kExitNotServing;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

}  // namespace

std::function<int()> DefineSearch(FlagSet& flags) {
  auto options = std::make_shared<SearchOptions>();
  AddQueryFlags(flags, options->query);
  flags.Add("random", &options->random, "N",
            "Send N seeded random queries of the served dim instead of "
            "--queries.");
  flags.Add("nprobe", &options->nprobe, "N",
            "Lists each request visits; 0 = the server's default_nprobe.");
  flags.Add("refine_factor", &options->refine_factor, "R",
            "Exact re-ranking of R * k candidates per request; -1 = the "
            "server's default_refine_factor, 0 = off.");
  flags.Add("texts", &options->texts, "FILE",
            "Hybrid retrieval (docs/hybrid.md): one text query per line, "
            "searched by BM25 alone, or with --queries/--random fused with "
            "query i's vector (one line per vector). Results then show "
            "[v<rank> t<rank>]: each retriever's rank, 0 = not found.");
  flags.Add("fusion", &options->fusion, "rrf|weighted",
            "With --texts and vectors: how the two results fuse. Default: "
            "the server's (rrf).");
  flags.Add("batch", &options->batch, "N", "Queries per request.");
  flags.Add("show", &options->show, "N",
            "Print the neighbours of the first N queries.");
  KnndClient::AddFlags(KnndClient::Api::kSearch, flags, options->client);
  return [options] { return Search(*options); };
}

std::function<int()> DefineInfo(FlagSet& flags) {
  auto options = std::make_shared<InfoOptions>();
  flags.Add("index", &options->index, "FILE",
            "Read this index file locally (as knnd loads it) instead of "
            "asking knnd: sizes, lists, heap, vectors file.");
  KnndClient::AddFlags(KnndClient::Api::kSearch, flags, options->client);
  return [options] { return Info(*options); };
}

std::function<int()> DefineHealth(FlagSet& flags) {
  auto options = std::make_shared<HealthOptions>();
  flags.Add("service", &options->service, "NAME",
            "grpc.health.v1 service name to check; empty = the server as a "
            "whole.");
  flags.Add("wait", &options->wait_s, "S",
            "Ask again every 200 ms, while knnd is not listening yet or not "
            "serving, for up to S seconds (0 to 86400); 0 = ask once.");
  KnndClient::AddFlags(KnndClient::Api::kSearch, flags, options->client);
  return [options] { return Health(*options); };
}

}  // namespace knnd::knnctl
