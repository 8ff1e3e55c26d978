#include "knnd/rpc/shard_front.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "knnd/base/saturating.h"
#include "knnd/index/index_sharding.h"
#include "knnd/rpc/shard_set.h"
#include "spdlog/spdlog.h"

namespace knnd {

using knnd::v1::GetIndexInfoResponse;

// ---------------------------------------------------------------------------
absl::StatusOr<std::unique_ptr<ShardFront>> ShardFront::Create(
    const Options& options, AdmissionGate* gate, Metrics* metrics,
    const TokenAuthenticator* auth, CallHold* hold,
    std::function<void(bool)> serving_changed) {
  if (options.targets.empty() ||
      options.targets.size() > static_cast<size_t>(kMaxShards)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_targets has ", options.targets.size(),
                     " targets; 1 to ", kMaxShards, " are allowed"));
  }
  std::unique_ptr<ShardFront> front(new ShardFront(
      options, gate, metrics, auth, hold, std::move(serving_changed)));
  metrics->AddShardTargets(options.targets);
  for (const std::string& target : options.targets) {
    auto shard = std::make_unique<Shard>();
    shard->target = target;
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(
        options.max_shard_response_bytes, std::numeric_limits<int>::max())));
    args.SetMaxSendMessageSize(-1);
    // A target resolving to several replicas of its shard (a headless
    // Service) spreads calls over all of them.
    args.SetLoadBalancingPolicyName("round_robin");
    // One channel per shard of its own, not one shared by equal targets.
    args.SetInt("knnd.shard_index", static_cast<int>(front->shards_.size()));
    shard->channel = grpc::CreateCustomChannel(
        target,
        options.credentials != nullptr ? options.credentials
                                       : grpc::InsecureChannelCredentials(),
        args);
    shard->stub = knnd::v1::KnnService::NewStub(shard->channel);
    front->shards_.push_back(std::move(shard));
  }
  return front;
}

struct ShardFront::LiveCalls {
  absl::Mutex mu;
  int live ABSL_GUARDED_BY(mu) = 0;
};

ShardFront::ShardFront(const Options& options, AdmissionGate* gate,
                       Metrics* metrics, const TokenAuthenticator* auth,
                       CallHold* hold,
                       std::function<void(bool)> serving_changed)
    : options_(options),
      metrics_(metrics),
      auth_(auth),
      admission_({options.retry_pushback_ms}, gate, metrics, auth, hold),
      serving_changed_(std::move(serving_changed)),
      service_(NewService(this)),
      live_calls_(std::make_shared<LiveCalls>()),
      ready_(absl::UnavailableError("the shards have not been polled yet")) {}

ShardFront::~ShardFront() {
  Stop();
  absl::MutexLock lock(&live_calls_->mu);
  live_calls_->mu.Await(absl::Condition(
      +[](int* live) { return *live == 0; }, &live_calls_->live));
}

std::shared_ptr<ShardFront::LiveCalls> ShardFront::CallBegun() {
  absl::MutexLock lock(&live_calls_->mu);
  ++live_calls_->live;
  return live_calls_;
}

void ShardFront::CallEnded(std::shared_ptr<LiveCalls> calls) {
  absl::MutexLock lock(&calls->mu);
  --calls->live;
}

AsyncService* ShardFront::service() { return service_.get(); }

void ShardFront::AddShardToken(grpc::ClientContext& context,
                               const std::string& token) {
  if (!token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  }
}

void ShardFront::Start() {
  if (poller_.joinable()) return;
  poller_ = std::thread([this] { PollLoop(); });
}

void ShardFront::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (poller_.joinable()) poller_.join();
}

void ShardFront::PollLoop() {
  do {
    PollOnce();
  } while (!stop_.WaitForNotificationWithTimeout(options_.poll_interval));
}

void ShardFront::PollOnce() {
  const size_t n = shards_.size();
  struct Poll {
    grpc::ClientContext context;
    GetIndexInfoResponse response;
    grpc::Status status;
  };
  std::vector<Poll> polls(n);
  // Shared with the callbacks: the last one's unlock runs on a gRPC thread
  // and may still be inside the mutex when this thread, woken by it,
  // returns; the count outlives both.
  struct Done {
    absl::Mutex mu;
    size_t count ABSL_GUARDED_BY(mu) = 0;
    size_t expected = 0;
  };
  auto done = std::make_shared<Done>();
  done->expected = n;
  const absl::Duration timeout =
      std::min(std::max(options_.poll_interval, absl::Milliseconds(200)),
               absl::Seconds(5));
  for (size_t i = 0; i < n; ++i) {
    Poll& poll = polls[i];
    poll.context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    AddShardToken(poll.context, options_.shard_token);
    shards_[i]->stub->async()->GetIndexInfo(
        &poll.context, &empty_info_request_, &poll.response,
        [&poll, done](grpc::Status status) {
          poll.status = std::move(status);
          absl::MutexLock lock(&done->mu);
          ++done->count;
        });
  }
  {
    absl::MutexLock lock(&done->mu);
    done->mu.Await(absl::Condition(
        +[](Done* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu) {
          return d->count == d->expected;
        },
        done.get()));
  }
  bool changed = false;
  bool ready = false;
  std::string why;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < n; ++i) {
      Shard& shard = *shards_[i];
      absl::Status declared =
          polls[i].status.ok()
              ? CheckShardDeclared(polls[i].response,
                                   options_.max_shard_response_bytes)
              : absl::OkStatus();
      if (polls[i].status.ok() && !declared.ok()) {
        // Values no front could count with (a shard claiming payloads of
        // 2^62 bytes): the shard is not ready, and its last good values,
        // if any, stay the ones searches are sized and checked with.
        shard.polled = std::move(declared);
      } else if (polls[i].status.ok()) {
        shard.polled = absl::OkStatus();
        shard.info = std::move(polls[i].response);
        shard.serving_version = shard.info.version();
        // Named in errors only, and only when it is one of the set's.
        if (shard.info.shard().shard_id() < std::min<size_t>(
                                                shard.info.shard().shard_count(), n)) {
          shard.shard_id = static_cast<int>(shard.info.shard().shard_id());
        }
      } else {
        shard.polled = absl::Status(
            static_cast<absl::StatusCode>(polls[i].status.error_code()),
            polls[i].status.error_message());
      }
    }
    UpdateReadiness();
    for (size_t i = 0; i < n; ++i) {
      const Shard& shard = *shards_[i];
      metrics_->SetShardState(
          static_cast<int>(i),
          shard.polled.ok() && shard.info.shard().shard_count() == n,
          shard.polled.ok() ? shard.info.version() : 0);
    }
    ready = ready_.ok();
    why = std::string(ready_.message());
    changed = ready != announced_ready_;
    announced_ready_ = ready;
  }
  if (changed) {
    if (ready) {
      spdlog::info("all {} shards answer, build {}, version {}: SERVING", n,
                   build_id(), set_version());
    } else {
      spdlog::warn("{}", why);
    }
    if (serving_changed_) serving_changed_(ready);
  }
}

void ShardFront::UpdateReadiness() {
  std::vector<PolledShard> polled;
  polled.reserve(shards_.size());
  for (const auto& shard : shards_) {
    polled.push_back({shard->target, &shard->polled, &shard->info});
  }
  ready_ = CheckShardSet(polled);
}

void ShardFront::NoteServingVersion(size_t shard, int64_t version) {
  absl::MutexLock lock(&mu_);
  shards_[shard]->serving_version = version;
}

int64_t ShardFront::SetVersionLocked() const {
  int64_t version = std::numeric_limits<int64_t>::max();
  for (const auto& shard : shards_) {
    if (shard->serving_version <= 0) return 0;
    version = std::min(version, shard->serving_version);
  }
  return version;
}

int64_t ShardFront::set_version() const {
  absl::MutexLock lock(&mu_);
  return SetVersionLocked();
}

// A copy of its own, not a shared reference to ready_'s message: the
// poller replaces ready_ while callers still hold what they were given,
// and the shared count of an absl::Status lives in uninstrumented abseil.
absl::Status ShardFront::ready() const {
  absl::MutexLock lock(&mu_);
  return absl::Status(ready_.code(), ready_.message());
}

// A shard answering now, else the last answer of any shard: one poll that
// misses its deadline on a busy machine must not make the front forget the
// index's shape and refuse every call as not ready.
const GetIndexInfoResponse* ShardFront::KnownInfoLocked() const {
  const GetIndexInfoResponse* last = nullptr;
  for (const auto& shard : shards_) {
    if (shard->polled.ok()) return &shard->info;
    if (last == nullptr && shard->info.dim() > 0) last = &shard->info;
  }
  return last;
}

int ShardFront::dim() const {
  absl::MutexLock lock(&mu_);
  const GetIndexInfoResponse* info = KnownInfoLocked();
  return info == nullptr ? 0 : static_cast<int>(info->dim());
}

FrontFacts ShardFront::Facts() const {
  absl::MutexLock lock(&mu_);
  FrontFacts facts;
  facts.max_send_message_bytes = options_.max_send_message_bytes;
  const GetIndexInfoResponse* known = KnownInfoLocked();
  if (known == nullptr) return facts;
  facts.dim = known->dim();
  facts.default_refine_factor = known->default_refine_factor();
  ShardBounds stand_in;  // the largest of the shards that answered
  // The lowest of the shards' limits.
  auto lowest = [&facts](int64_t& limit, int64_t value) {
    limit = facts.limits_known ? std::min(limit, value) : value;
  };
  for (const auto& shard : shards_) {
    const GetIndexInfoResponse& info = shard->info;
    if (info.dim() == 0) continue;  // never answered a poll
    lowest(facts.max_k, info.max_k());
    lowest(facts.max_refine_factor, info.max_refine_factor());
    lowest(facts.max_queries_per_request, info.max_queries_per_request());
    lowest(facts.max_filter_depth, info.max_filter_depth());
    lowest(facts.max_get_ids, info.max_get_ids());
    facts.limits_known = true;
    stand_in.max_payload_bytes =
        std::max(stand_in.max_payload_bytes, info.max_payload_bytes());
    stand_in.max_answer_bytes =
        std::max(stand_in.max_answer_bytes, AnswerBytesOf(info));
  }
  for (const auto& shard : shards_) {
    const GetIndexInfoResponse& info = shard->info;
    if (info.dim() == 0) {
      facts.shards.push_back(stand_in);
    } else {
      facts.shards.push_back(
          {info.max_payload_bytes(), AnswerBytesOf(info), info.version()});
    }
  }
  return facts;
}

int64_t ShardFront::AnswerBytesOf(const GetIndexInfoResponse& info) const {
  // A shard too old to report its max_send_message_bytes: the most the
  // front's channel receives.
  return info.max_send_message_bytes() > 0
             ? std::min(info.max_send_message_bytes(),
                        options_.max_shard_response_bytes)
             : options_.max_shard_response_bytes;
}

std::string ShardFront::build_id() const {
  absl::MutexLock lock(&mu_);
  const GetIndexInfoResponse* info = KnownInfoLocked();
  return info == nullptr ? "" : info->shard().build_id();
}

bool ShardFront::ShardIdOf(size_t shard, int* id) const {
  absl::MutexLock lock(&mu_);
  const Shard& s = *shards_[shard];
  if (s.shard_id < 0) return false;
  *id = s.shard_id;
  return true;
}

absl::Status ShardFront::SetInfo(GetIndexInfoResponse* response) const {
  absl::MutexLock lock(&mu_);
  if (!ready_.ok()) return absl::Status(ready_.code(), ready_.message());
  const GetIndexInfoResponse* first = nullptr;
  int64_t ntotal = 0;
  int64_t file_bytes = 0;
  int64_t heap_bytes = 0;
  int64_t end_id = 0;
  std::vector<std::string> targets;
  for (const auto& shard : shards_) {
    const GetIndexInfoResponse& info = shard->info;
    if (info.shard().shard_id() == 0) first = &info;
    ntotal = SatAdd(ntotal, info.ntotal());
    file_bytes = SatAdd(file_bytes, info.file_bytes());
    heap_bytes = SatAdd(heap_bytes, info.heap_bytes());
    end_id = std::max(end_id, info.shard().end_id());
    targets.push_back(shard->target);
  }
  *response = *first;
  response->clear_retained_versions();
  response->set_ntotal(ntotal);
  response->set_file_bytes(file_bytes);
  response->set_heap_bytes(heap_bytes);
  response->set_path(absl::StrCat("shards: ", absl::StrJoin(targets, ",")));
  response->set_version(SetVersionLocked());
  // The merged answer's limit is the front's own.
  response->set_max_send_message_bytes(options_.max_send_message_bytes);
  // The limits every shard accepts.
  for (const auto& shard : shards_) {
    const GetIndexInfoResponse& info = shard->info;
    response->set_max_k(std::min(response->max_k(), info.max_k()));
    response->set_max_nprobe(std::min(response->max_nprobe(), info.max_nprobe()));
    response->set_max_queries_per_request(std::min(
        response->max_queries_per_request(), info.max_queries_per_request()));
    response->set_max_filter_ids(
        std::min(response->max_filter_ids(), info.max_filter_ids()));
    response->set_max_refine_factor(
        std::min(response->max_refine_factor(), info.max_refine_factor()));
    response->set_max_receive_message_bytes(std::min(
        response->max_receive_message_bytes(), info.max_receive_message_bytes()));
    response->set_has_vectors(response->has_vectors() && info.has_vectors());
    response->set_has_payloads(response->has_payloads() &&
                               info.has_payloads());
    response->set_max_payload_bytes(
        std::max(response->max_payload_bytes(), info.max_payload_bytes()));
    for (const std::string& field : info.payload_fields()) {
      if (std::find(response->payload_fields().begin(),
                    response->payload_fields().end(),
                    field) == response->payload_fields().end()) {
        response->add_payload_fields(field);
      }
    }
    response->set_max_filter_conditions(std::min(
        response->max_filter_conditions(), info.max_filter_conditions()));
    response->set_max_filter_depth(
        std::min(response->max_filter_depth(), info.max_filter_depth()));
    response->set_max_text_bytes(
        std::min(response->max_text_bytes(), info.max_text_bytes()));
    response->set_max_get_ids(
        std::min(response->max_get_ids(), info.max_get_ids()));
  }
  // Every shard's text index scores with the whole corpus's statistics
  // (shard 0's stand); its postings, empty rows and bytes add up, its
  // terms are a lower bound of the set's.
  if (response->has_text()) {
    knnd::v1::TextIndexInfo* text = response->mutable_text();
    int64_t postings = 0, empty = 0, bytes = 0, terms = 0;
    for (const auto& shard : shards_) {
      const knnd::v1::TextIndexInfo& t = shard->info.text();
      postings = SatAdd(postings, t.postings());
      empty = SatAdd(empty, t.empty_rows());
      bytes = SatAdd(bytes, t.file_bytes());
      terms = std::max(terms, t.terms());
    }
    text->set_postings(postings);
    text->set_empty_rows(empty);
    text->set_file_bytes(bytes);
    text->set_terms(terms);
  }
  // Every shard has the columns of one build: rows with a value add up;
  // a shard's distinct keywords are a lower bound of the set's.
  for (knnd::v1::AttributeColumnInfo& column : *response->mutable_attributes()) {
    int64_t rows = 0;
    for (const auto& shard : shards_) {
      for (const knnd::v1::AttributeColumnInfo& c : shard->info.attributes()) {
        if (c.name() != column.name()) continue;
        rows = SatAdd(rows, c.rows_with_value());
        column.set_distinct_keywords(
            std::max(column.distinct_keywords(), c.distinct_keywords()));
      }
    }
    column.set_rows_with_value(rows);
  }
  if (!response->has_payloads()) response->clear_payload_fields();
  knnd::v1::ShardInfo* set = response->mutable_shard();
  set->set_shard_id(0);
  set->set_shard_count(static_cast<uint32_t>(shards_.size()));
  set->set_first_id(0);
  set->set_end_id(end_id);
  return absl::OkStatus();
}

}  // namespace knnd
