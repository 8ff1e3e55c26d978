// load_gen: an asynchronous gRPC load generator for knnd's Search API (and
// any server speaking it, e.g. bench/python_server.py). One thread drives a
// CompletionQueue, so the client costs little CPU and does not starve the
// server on a small machine; its own CPU time is measured and reported.
//
//   load_gen --target HOST:PORT --queries FILE --d D [--batch 1]
//            [--clients 32 | --rate Q] [--seconds 3] [--warmup_seconds 0.5]
//            [--k 10] [--nprobe 0] [--refine_factor -1] [--channels 0]
//            [--wire f32|f16|bf16]
//
// Closed loop (default): --clients requests are always outstanding; each
// completion sends the next; q/s and latencies are the answers that arrive
// in the measured window. Open loop (--rate R > 0): requests start at a
// fixed rate of R requests per second whatever the server does, and latency
// counts from the scheduled start (no coordinated omission); at most
// --max_outstanding requests are in flight, later ones are counted as
// dropped.
//
// --queries is raw little-endian float32, rows of --d values; request i uses
// rows (i mod R)*batch.. (wrapping), R the distinct requests that fit in
// --request_cache_mib. Each is serialized once and sent again as the same
// bytes (a reference to them), so that the generator's cost per request is
// the transport's and not the copying of the vectors into a message and its
// serialization (twice the request's bytes, newly allocated: at 256 rows of
// Fashion-MNIST, 800 KB each, half of load_gen's CPU); --reserialize builds
// and serializes every request, as an application does. --wire f16 / bf16
// sends the rows rounded to 16 bits (vectors_f16le / vectors_bf16le), half
// the bytes. Prints one JSON
// object on stdout:
//   {"qps", "rps", "p50_ms", "p99_ms", "errors", "dropped", "first_error",
//    "client_cpu_s", "wall_s", "client_cores"}
// where client_cores = this process's user+system CPU seconds / wall seconds
// during the measured window. With --server_pid (a server on this machine)
// also "server_cores" and "server_threads" (its cores by thread name) in the
// same window: how much of the machine the server took for those q/s.
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "knnd/v1/knn_service.grpc.pb.h"
#include "knnd/base/percentile.h"
#include "knnd/faiss/vector_math.h"
#include "knnd/monitoring/process_stats.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "Server address.");
ABSL_FLAG(std::string, queries, "", "Raw float32 query rows.");
ABSL_FLAG(int, d, 0, "Dimension of the query rows.");
ABSL_FLAG(int, batch, 1, "Queries per request.");
ABSL_FLAG(int, clients, 32, "Closed loop: requests kept outstanding.");
ABSL_FLAG(double, rate, 0, "Open loop: requests per second; 0 = closed loop.");
ABSL_FLAG(int, max_outstanding, 4096, "Open loop: in-flight cap.");
ABSL_FLAG(double, seconds, 3.0, "Measured duration.");
ABSL_FLAG(double, warmup_seconds, 0.5, "Unmeasured run before.");
ABSL_FLAG(int, k, 10, "Neighbours per query.");
ABSL_FLAG(int, nprobe, 0, "nprobe per request; 0 = the server's default.");
ABSL_FLAG(int, refine_factor, -1,
          "refine_factor per request (0: no re-ranking); -1 = the server's "
          "default.");
ABSL_FLAG(int, channels, 0,
          "Connections; 0 = one per closed-loop client (at most 64), 8 in "
          "open loop.");
ABSL_FLAG(int, timeout_ms, 30000, "Deadline of each request.");
ABSL_FLAG(bool, results_as_bytes, true,
          "Ask for the results as raw bytes (SearchRequest.results_as_bytes), "
          "as knnd's Python clients do; false: repeated fields.");
ABSL_FLAG(bool, reserialize, false,
          "Build and serialize each request (else each distinct request is "
          "serialized once and its bytes sent again).");
ABSL_FLAG(int, request_cache_mib, 64,
          "Serialized requests kept, in MiB (at least one request).");
ABSL_FLAG(std::string, wire, "f32",
          "Encoding of the query rows on the wire: f32 (vectors_f32le), f16 "
          "(vectors_f16le, each value rounded to a half) or bf16 "
          "(vectors_bf16le, rounded to a bfloat16).");
ABSL_FLAG(int, server_pid, 0,
          "a local server's process id: its CPU in the measured window is "
          "reported too (server_cores, and server_threads by thread name)");
ABSL_FLAG(int, retry_delay_ms, 50,
          "Closed loop: a client whose request failed waits this long before "
          "its next one (knnd's default grpc-retry-pushback-ms).");

namespace {

using knnd::Percentile;
using knnd::v1::KnnService;
using knnd::v1::SearchRequest;
using knnd::v1::SearchResponse;

constexpr char kSearchMethod[] = "/knnd.v1.KnnService/Search";

// One outstanding request; owned by the loop in main, lives until its tag
// comes back from the completion queue. Typed (reserialized requests) or
// generic (serialized bytes sent again; the answer parsed as the typed call
// parses it).
struct Call {
  grpc::ClientContext context;
  SearchResponse response;
  grpc::ByteBuffer response_bytes;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<SearchResponse>> reader;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> generic;
  absl::Time start;  // scheduled (open loop) or actual (closed loop) start

  // The answer as a typed call has it (status set to INTERNAL when the
  // generic call's bytes are not a SearchResponse).
  void ParseAnswer() {
    if (generic == nullptr || !status.ok()) return;
    if (!grpc::GenericDeserialize<grpc::ProtoBufferReader, SearchResponse>(
             &response_bytes, &response)
             .ok()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL,
                            "answer is not a SearchResponse");
    }
  }
};

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int d = absl::GetFlag(FLAGS_d);
  const int batch = absl::GetFlag(FLAGS_batch);
  const double rate = absl::GetFlag(FLAGS_rate);
  const bool open_loop = rate > 0;
  const int clients = absl::GetFlag(FLAGS_clients);
  std::ifstream in(absl::GetFlag(FLAGS_queries), std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)),
                  std::istreambuf_iterator<char>());
  const size_t row_bytes = static_cast<size_t>(d) * sizeof(float);
  if (d <= 0 || batch <= 0 || raw.size() < row_bytes * batch) {
    std::fprintf(stderr, "load_gen: need --d > 0 and --queries with at least "
                         "--batch rows of --d float32\n");
    return 2;
  }
  const int64_t rows = static_cast<int64_t>(raw.size() / row_bytes);
  const std::string wire = absl::GetFlag(FLAGS_wire);
  if (wire != "f32" && wire != "f16" && wire != "bf16") {
    std::fprintf(stderr, "load_gen: --wire=%s is not f32, f16 or bf16\n",
                 wire.c_str());
    return 2;
  }
  // The rows as sent: float32 as read, or each value rounded to 16 bits
  // once here (to nearest, ties to even), little-endian.
  size_t wire_row_bytes = row_bytes;
  if (wire != "f32") {
    const size_t n = raw.size() / sizeof(float);
    std::string halves(n * 2, '\0');
    for (size_t i = 0; i < n; ++i) {
      float value;
      std::memcpy(&value, raw.data() + i * sizeof(float), sizeof(value));
      uint16_t h;
      if (wire == "f16") {
        h = knnd::FloatToHalf(value);
      } else {
        uint32_t bits;
        std::memcpy(&bits, &value, sizeof(bits));
        h = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
      }
      halves[2 * i] = static_cast<char>(h & 0xff);
      halves[2 * i + 1] = static_cast<char>(h >> 8);
    }
    raw = std::move(halves);
    wire_row_bytes = row_bytes / 2;
  }

  int channels = absl::GetFlag(FLAGS_channels);
  if (channels <= 0) channels = open_loop ? 8 : std::min(clients, 64);
  std::vector<std::unique_ptr<KnnService::Stub>> stubs;
  std::vector<std::unique_ptr<grpc::GenericStub>> generic_stubs;
  for (int c = 0; c < channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c);  // a distinct connection each
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(-1);
    auto channel = grpc::CreateCustomChannel(
        absl::GetFlag(FLAGS_target), grpc::InsecureChannelCredentials(), args);
    stubs.push_back(KnnService::NewStub(channel));
    generic_stubs.push_back(std::make_unique<grpc::GenericStub>(channel));
  }

  const bool reserialize = absl::GetFlag(FLAGS_reserialize);
  const size_t request_bytes = static_cast<size_t>(batch) * wire_row_bytes;
  const int64_t distinct = std::max<int64_t>(
      1, std::min<int64_t>(rows - batch + 1,
                           (int64_t{absl::GetFlag(FLAGS_request_cache_mib)}
                            << 20) / static_cast<int64_t>(request_bytes)));
  auto request_of = [&](int64_t i) {
    SearchRequest request;
    request.set_k(absl::GetFlag(FLAGS_k));
    // The answer's ids and distances as raw bytes, as knnd's clients ask.
    request.set_results_as_bytes(absl::GetFlag(FLAGS_results_as_bytes));
    if (absl::GetFlag(FLAGS_nprobe) > 0) request.set_nprobe(absl::GetFlag(FLAGS_nprobe));
    if (absl::GetFlag(FLAGS_refine_factor) >= 0) {
      request.set_refine_factor(absl::GetFlag(FLAGS_refine_factor));
    }
    const int64_t row = ((i % distinct) * batch) % (rows - batch + 1);
    const char* rows_at = raw.data() + row * wire_row_bytes;
    if (wire == "f32") {
      request.set_vectors_f32le(rows_at, request_bytes);
    } else if (wire == "f16") {
      request.set_vectors_f16le(rows_at, request_bytes);
    } else {
      request.set_vectors_bf16le(rows_at, request_bytes);
    }
    return request;
  };
  std::vector<grpc::ByteBuffer> serialized;  // request i % distinct's bytes
  if (!reserialize) {
    for (int64_t i = 0; i < distinct; ++i) {
      grpc::Slice bytes(request_of(i).SerializeAsString());
      serialized.emplace_back(&bytes, 1);
    }
  }

  grpc::CompletionQueue cq;
  int64_t sent = 0;
  auto send = [&](absl::Time start) {
    auto* call = new Call;
    call->start = start;
    call->context.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
    const int channel = static_cast<int>(sent % channels);
    if (reserialize) {
      call->reader = stubs[channel]->AsyncSearch(&call->context,
                                                 request_of(sent), &cq);
      call->reader->Finish(&call->response, &call->status, call);
    } else {
      call->generic = generic_stubs[channel]->PrepareUnaryCall(
          &call->context, kSearchMethod, serialized[sent % distinct], &cq);
      call->generic->StartCall();
      call->generic->Finish(&call->response_bytes, &call->status, call);
    }
    ++sent;
  };

  const absl::Time begin = absl::Now();
  const absl::Time measure_from = begin + absl::Seconds(absl::GetFlag(FLAGS_warmup_seconds));
  const absl::Time end = measure_from + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  const absl::Duration interval = open_loop ? absl::Seconds(1.0 / rate) : absl::ZeroDuration();
  absl::Time next_send = begin;
  int64_t outstanding = 0, errors = 0, dropped = 0, done = 0;
  std::string first_error;
  std::vector<double> latencies_ms;
  double cpu_at_start = -1;
  const int server_pid = absl::GetFlag(FLAGS_server_pid);
  std::map<std::string, double> server_at_start;

  if (!open_loop) {
    for (int c = 0; c < clients; ++c, ++outstanding) send(absl::Now());
  }
  std::deque<absl::Time> delayed;  // closed loop: clients backing off
  const absl::Duration retry_delay = absl::Milliseconds(absl::GetFlag(FLAGS_retry_delay_ms));
  while (true) {
    const absl::Time now = absl::Now();
    if (cpu_at_start < 0 && now >= measure_from) {
      cpu_at_start = CpuSeconds();
      server_at_start = knnd::ThreadCpuSecondsByName("/proc", server_pid);
    }
    if (now >= end) break;
    while (!delayed.empty() && delayed.front() <= now) {
      delayed.pop_front();
      send(now);
      ++outstanding;
    }
    if (open_loop) {
      while (next_send <= now && next_send < end) {
        if (outstanding < absl::GetFlag(FLAGS_max_outstanding)) {
          send(next_send);
          ++outstanding;
        } else if (next_send >= measure_from) {
          ++dropped;
        }
        next_send += interval;
      }
    }
    void* tag = nullptr;
    bool ok = false;
    absl::Time wait_until = open_loop ? std::min(next_send, end) : end;
    if (!delayed.empty()) wait_until = std::min(wait_until, delayed.front());
    const auto status = cq.AsyncNext(&tag, &ok, absl::ToChronoTime(wait_until));
    if (status != grpc::CompletionQueue::GOT_EVENT) continue;
    std::unique_ptr<Call> call(static_cast<Call*>(tag));
    call->ParseAnswer();
    --outstanding;
    const absl::Time finished = absl::Now();
    // Closed loop: every answer in the window counts, whenever its request
    // left (the requests in flight at both edges would otherwise be lost:
    // one latency in each client's window, ~1% of 2 s at 4 clients of
    // 256-row requests). Open loop: the requests scheduled in the window.
    const bool counted = open_loop ? call->start >= measure_from
                                   : finished >= measure_from;
    if (counted && finished < end) {
      if (call->status.ok()) {
        ++done;
        latencies_ms.push_back(absl::ToDoubleMilliseconds(finished - call->start));
      } else {
        ++errors;
        if (first_error.empty()) {
          first_error = absl::StrCat(call->status.error_code(), ": ",
                                     call->status.error_message());
        }
      }
    }
    if (!open_loop && finished < end) {
      if (call->status.ok()) {
        send(finished);
        ++outstanding;
      } else {
        delayed.push_back(finished + retry_delay);
      }
    }
  }
  const double cpu = CpuSeconds() - cpu_at_start;
  const std::map<std::string, double> server_at_end =
      knnd::ThreadCpuSecondsByName("/proc", server_pid);
  const double wall = absl::ToDoubleSeconds(absl::Now() - measure_from);
  std::string server;  // the server's cores in the window, by thread name
  if (server_pid > 0) {
    double total = 0;
    std::string threads;
    for (const auto& [name, seconds] : server_at_end) {
      const auto before = server_at_start.find(name);
      const double used =
          seconds - (before == server_at_start.end() ? 0.0 : before->second);
      total += used;
      absl::StrAppend(&threads, threads.empty() ? "" : ", ", "\"",
                      JsonEscape(name), "\": ", absl::StrFormat("%.3f", used / wall));
    }
    server = absl::StrFormat(", \"server_cores\": %.3f, \"server_threads\": {%s}",
                             total / wall, threads);
  }
  // Let the stragglers finish (or cancel them) so the process exits cleanly.
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) delete static_cast<Call*>(tag);

  const double p50 = Percentile(latencies_ms, 0.50);
  const double p99 = Percentile(latencies_ms, 0.99);
  std::printf(
      "{\"qps\": %.1f, \"rps\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, "
      "\"errors\": %lld, \"dropped\": %lld, \"first_error\": \"%s\", "
      "\"client_cpu_s\": %.3f, \"wall_s\": %.3f, \"client_cores\": %.3f%s}\n",
      done * batch / wall, done / wall, p50, p99, static_cast<long long>(errors),
      static_cast<long long>(dropped), JsonEscape(first_error).c_str(), cpu,
      wall, cpu / wall, server.c_str());
  return 0;
}
