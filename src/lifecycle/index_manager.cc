#include "knnd/lifecycle/index_manager.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"
#include "knnd/base/units.h"

namespace knnd {
namespace {

void LogServed(const IndexInfo& info) {
  spdlog::info(
      "index {} (version {}): {} | {} vectors x {} dims, {} | nlist {}, PQ "
      "M={} x {} bits ({} B/vector) | file {:.1f} MiB mapped, heap {:.1f} MiB "
      "(precomputed table {:.1f} MiB) | loaded in {:.1f} ms",
      info.path, info.version, info.index_type, info.ntotal, info.dim,
      MetricName(info.metric), info.nlist, info.pq_m, info.pq_nbits,
      info.code_size_bytes, MiB(info.file_bytes), MiB(info.heap_bytes),
      MiB(info.precomputed_table_bytes),
      absl::ToDoubleMilliseconds(info.load_duration));
  if (info.has_vectors) {
    spdlog::info("re-ranking vectors {} ({}, {:.1f} MiB mapped)",
                 info.vectors_path, info.vectors_dtype,
                 MiB(info.vectors_file_bytes));
  } else if (!info.vectors_error.empty()) {
    spdlog::warn("serving {} without re-ranking: {}", info.path,
                 info.vectors_error);
  }
  if (info.has_id_table) {
    spdlog::info("own ids: id table {} ({:.1f} MiB mapped)", info.id_table_path,
                 MiB(info.id_table_file_bytes));
  }
  if (info.has_attributes) {
    spdlog::info("attributes: {} ({:.1f} MiB mapped)", info.attributes_path,
                 MiB(info.attributes_file_bytes));
  }
  if (!info.text_field.empty()) {
    spdlog::info("text index: {} of payload field \"{}\" ({:.1f} MiB mapped)",
                 info.text_path, info.text_field, MiB(info.text_file_bytes));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<IndexManager>> IndexManager::Create(
    const Options& options, IndexHolder* holder, Metrics* metrics,
    Parts parts) {
  if (options.index_path.empty()) {
    return absl::InvalidArgumentError("no index path to serve");
  }
  if (holder == nullptr || metrics == nullptr) {
    return absl::InvalidArgumentError(
        "the index manager needs the holder and the metrics");
  }
  if (options.poll_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("poll interval ", absl::FormatDuration(
                                           options.poll_interval),
                     " is negative"));
  }
  std::unique_ptr<IndexManager> manager(
      new IndexManager(options, holder, metrics, parts));
  manager->thread_ = std::thread([m = manager.get()] { m->Run(); });
  return manager;
}

IndexManager::~IndexManager() {
  {
    absl::MutexLock lock(&mu_);
    reload_.stopping = true;
  }
  verifier_.Cancel();
  thread_.join();
}

absl::StatusOr<IndexManager::Outcome> IndexManager::Reload() {
  return ReloadTo(VersionRequest::Reload());
}

absl::StatusOr<IndexManager::Outcome> IndexManager::ReloadVersion(
    int64_t version) {
  if (version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("version=", version, " must be >= 0 (0: the latest)"));
  }
  return ReloadTo(version == 0 ? VersionRequest::Unpin()
                               : VersionRequest::Pin(version));
}

void IndexManager::RequestReload() {
  absl::MutexLock lock(&mu_);
  reload_.requested = true;
}

absl::StatusOr<IndexManager::Outcome> IndexManager::ReloadTo(
    const VersionRequest& request) {
  using Action = VersionDecision::Action;
  int64_t wanted;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](ReloadState* reload) { return !reload->reloading; }, &reload_));
    reload_.reloading = true;
    wanted = WantedVersion(versions_, request);
  }
  // Outside the lock: the source lists a directory.
  const absl::StatusOr<IndexVersion> found =
      wanted > 0 ? source_.Find(wanted) : source_.Latest();
  VersionRecord before;
  VersionDecision decision;
  std::shared_ptr<const IndexSnapshot> retained;
  {
    absl::MutexLock lock(&mu_);
    before = versions_;
    decision =
        DecideVersion({versions_, retained_.Versions(), request, found});
    if (decision.action == Action::kRepublish) {
      retained = retained_.Find(decision.target);
    }
  }

  const IndexVersion& target = decision.target;
  absl::Status status = decision.status;
  switch (decision.action) {
    case Action::kNoTarget:
      spdlog::warn("index reload: {}", status.ToString());
      break;
    case Action::kKeep:
    case Action::kStillRefused:
      break;
    case Action::kRepublish:
      spdlog::info("index version {} ({}) republished from the retained "
                   "versions, without a load",
                   target.version, target.path);
      metrics_->SetIndexInfo(retained->info());
      {
        absl::MutexLock lock(&mu_);
        metrics_->SetIndexChecksumState(
            retained_.checksum_state(target.version));
      }
      Publish(std::move(retained));
      break;
    case Action::kLoad:
      status = LoadAndPublish(target);
      metrics_->RecordIndexReload(status.ok());
      if (!status.ok()) {
        status = LoadRefusal(target, status, before.serving.version);
        spdlog::error("{}", status.ToString());
      }
      break;
  }

  absl::MutexLock lock(&mu_);
  reload_.reloading = false;
  versions_ = RecordAfter(versions_, request, decision, status);
  if (!status.ok()) return status;
  Outcome outcome;
  outcome.version = target.version;
  outcome.path = target.path;
  outcome.loaded = decision.action == Action::kLoad;
  outcome.previous_version = before.serving.version;
  outcome.pinned_version = versions_.pinned_version;
  return outcome;
}

void IndexManager::Publish(std::shared_ptr<const IndexSnapshot> snapshot) {
  std::shared_ptr<const IndexSnapshot> replaced = holder_->Pin();
  const IndexSnapshot& published = *snapshot;
  std::vector<std::shared_ptr<const IndexSnapshot>> retained;
  {
    absl::MutexLock lock(&mu_);
    retained_.Replaced(std::move(replaced), published);
    retained = retained_.Snapshots();
  }
  // One step for both, so that a request pinning the version just replaced
  // (a merger of shards does) always finds it, serving or retained.
  holder_->Publish(std::move(snapshot), std::move(retained));
  // The byte budget of the version now serving (a loaded one, or a
  // retained one republished), set after it serves: until then requests
  // run on the one it replaced.
  if (parts_.budget != nullptr) {
    parts_.budget->SetByteBudgetFor(published.info());
  }
  metrics_->SetIndexServing(true);
  if (options_.serving_changed) options_.serving_changed(true);
}

void IndexManager::OnBackgroundCheck(
    const std::shared_ptr<const IndexSnapshot>& snapshot,
    const absl::Status& outcome) {
  if (absl::IsCancelled(outcome)) return;
  const int64_t version = snapshot->info().version;
  bool withdrawn = false;
  std::shared_ptr<const IndexSnapshot> released;
  {
    absl::MutexLock lock(&mu_);
    if (outcome.ok()) {
      retained_.SetChecksumState(version, Metrics::ChecksumState::kVerified);
      if (holder_->Pin() == snapshot) {
        metrics_->SetIndexChecksumState(Metrics::ChecksumState::kVerified);
      }
    } else {
      // Not in the middle of a reload, which may be replacing it.
      mu_.Await(absl::Condition(
          +[](ReloadState* reload) {
            return !reload->reloading || reload->stopping;
          },
          &reload_));
      retained_.SetChecksumState(version, Metrics::ChecksumState::kFailed);
      if (!reload_.stopping && holder_->Pin() == snapshot) {
        metrics_->SetIndexChecksumState(Metrics::ChecksumState::kFailed);
        metrics_->SetIndexServing(false);
        released = holder_->Withdraw(outcome);
        versions_ = RecordAfterWithdrawal(versions_, version, outcome);
        withdrawn = true;
      }
    }
  }
  if (withdrawn) {
    spdlog::error("{}", std::string(outcome.message()));
    if (options_.serving_changed) options_.serving_changed(false);
  } else if (!outcome.ok()) {
    spdlog::error("{} (no longer serving: it was replaced first)",
                  std::string(outcome.message()));
  }
}

absl::Status IndexManager::AwaitBackgroundCheck(absl::Time deadline) const {
  return verifier_.AwaitDone(deadline);
}

absl::StatusOr<std::vector<IndexManager::VersionState>>
IndexManager::ListVersions() const {
  absl::StatusOr<std::vector<IndexVersion>> listed = source_.List();
  if (!listed.ok()) return listed.status();
  absl::MutexLock lock(&mu_);
  const std::vector<IndexVersion> retained = retained_.Versions();
  std::vector<VersionState> states;
  auto add = [&](const IndexVersion& v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    VersionState state;
    state.version = v.version;
    state.path = v.path;
    state.serving = SameVersion(v, versions_.serving);
    state.retained =
        std::any_of(retained.begin(), retained.end(),
                    [&v](const IndexVersion& r) { return SameVersion(r, v); });
    if (v.version == versions_.refused_version) {
      state.refused = true;
      state.refused_reason = std::string(versions_.refused_status.message());
    }
    states.push_back(std::move(state));
  };
  for (const IndexVersion& v : *listed) add(v);
  // Versions in memory whose files are gone: retained ones, and the one
  // serving after a rollback to a retained version.
  auto add_if_missing = [&](const IndexVersion& v)
                            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool listed_already = std::any_of(
        states.begin(), states.end(), [&](const VersionState& s) {
          return s.version == v.version && s.path == v.path;
        });
    if (!listed_already) add(v);
  };
  for (const IndexVersion& r : retained) add_if_missing(r);
  if (versions_.serving.version != 0) add_if_missing(versions_.serving);
  std::sort(states.begin(), states.end(),
            [](const VersionState& a, const VersionState& b) {
              return a.version < b.version;
            });
  return states;
}

int64_t IndexManager::pinned_version() const {
  absl::MutexLock lock(&mu_);
  return versions_.pinned_version;
}

absl::Status IndexManager::LoadAndPublish(const IndexVersion& target) {
  using ChecksumCheck = Options::ChecksumCheck;
  verifier_.AwaitRead();
  bool defer;  // the first version under kBackground: verified after
  ServedShape expected;
  {
    absl::MutexLock lock(&mu_);
    expected = shape_;
    defer = options_.checksum_check == ChecksumCheck::kBackground &&
            shape_.dim == 0 && !verifier_.started();
  }
  LoadOptions load = options_.load;
  if (parts_.budget != nullptr && !load.check_heap) {
    MemoryBudget* budget = parts_.budget;
    load.check_heap = [budget](const IndexInfo& planned) {
      return budget->CheckHeap(planned);
    };
  }
  load.version = target.version;
  load.verify_checksum =
      options_.checksum_check != ChecksumCheck::kOff && !defer;
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> loaded =
      IndexSnapshot::Load(target.path, load);
  if (!loaded.ok()) return loaded.status();
  std::shared_ptr<const IndexSnapshot> snapshot = std::move(*loaded);
  const IndexInfo& info = snapshot->info();
  if (expected.dim != 0 && info.dim != expected.dim) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "its dim=%d differs from dim=%d of the index served since start-up; "
        "clients send %d-dim queries",
        info.dim, expected.dim, expected.dim));
  }
  if (expected.metric.has_value() && info.metric != *expected.metric) {
    return absl::FailedPreconditionError(absl::StrCat(
        "its metric ", MetricName(info.metric), " differs from metric ",
        MetricName(*expected.metric),
        " of the index served since start-up; distances would change meaning"));
  }
  if (parts_.preparation != nullptr) {
    if (absl::Status s = parts_.preparation->Prepare(*snapshot); !s.ok()) {
      return s;
    }
  }
  if (options_.prepare) {
    if (absl::Status s = options_.prepare(*snapshot); !s.ok()) return s;
  }
  LogServed(info);
  metrics_->SetIndexInfo(info);
  const bool checkable =
      info.has_metadata || info.has_vectors || info.has_id_table ||
      info.has_attributes;
  const Metrics::ChecksumState checksum =
      !checkable             ? Metrics::ChecksumState::kUnchecked
      : defer                ? Metrics::ChecksumState::kPending
      : load.verify_checksum ? Metrics::ChecksumState::kVerified
                             : Metrics::ChecksumState::kUnchecked;
  {
    absl::MutexLock lock(&mu_);
    if (shape_.dim == 0) shape_ = ServedShape{info.dim, info.metric};
    retained_.SetChecksumState(info.version, checksum);
    metrics_->SetIndexChecksumState(checksum);
  }
  Publish(snapshot);
  if (defer && checkable) {
    verifier_.Start(snapshot, [this, snapshot](const absl::Status& outcome) {
      OnBackgroundCheck(snapshot, outcome);
    });
  }
  return absl::OkStatus();
}

void IndexManager::Run() {
  const bool poll =
      options_.poll_interval > absl::ZeroDuration() && source_.IsDirectory();
  if (poll) {
    spdlog::info("polling {} for new index versions every {}",
                 source_.path(), absl::FormatDuration(options_.poll_interval));
  }
  for (;;) {
    bool requested;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return reload_.requested || reload_.stopping;
      };
      if (poll) {
        mu_.AwaitWithTimeout(absl::Condition(&woken), options_.poll_interval);
      } else {
        mu_.Await(absl::Condition(&woken));
      }
      if (reload_.stopping) return;
      requested = reload_.requested;
      reload_.requested = false;
    }
    absl::StatusOr<Outcome> outcome = Reload();
    if (requested && outcome.ok() && !outcome->loaded) {
      spdlog::info("index reload: version {} ({}) is already serving",
                   outcome->version, outcome->path);
    }
  }
}

}  // namespace knnd
