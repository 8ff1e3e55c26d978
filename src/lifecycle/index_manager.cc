#include "knnd/lifecycle/index_manager.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

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
}

}  // namespace

absl::StatusOr<std::unique_ptr<IndexManager>> IndexManager::Create(
    const Options& options, IndexHolder* holder, Metrics* metrics) {
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
      new IndexManager(options, holder, metrics));
  manager->thread_ = std::thread([m = manager.get()] { m->Run(); });
  return manager;
}

IndexManager::~IndexManager() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cancel_.store(true);
  thread_.join();
  // After thread_: a reload on it may have started the check.
  if (checker_.joinable()) checker_.join();
}

absl::StatusOr<IndexManager::Outcome> IndexManager::Reload() {
  return ReloadTo(absl::nullopt);
}

absl::StatusOr<IndexManager::Outcome> IndexManager::ReloadVersion(
    int64_t version) {
  if (version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("version=", version, " must be >= 0 (0: the latest)"));
  }
  return ReloadTo(version);
}

void IndexManager::RequestReload() {
  absl::MutexLock lock(&mu_);
  reload_requested_ = true;
}

absl::StatusOr<IndexManager::Outcome> IndexManager::ReloadTo(
    absl::optional<int64_t> pin) {
  int64_t target_pin;
  int64_t served;
  std::string served_path;
  int dim;
  absl::optional<Metric> metric;
  int64_t refused;
  absl::Status refused_status;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* reloading) { return !*reloading; }, &reloading_));
    reloading_ = true;
    target_pin = pin.value_or(pinned_version_);
    served = served_version_;
    served_path = served_path_;
    dim = dim_;
    metric = metric_;
    refused = refused_version_;
    refused_status = refused_status_;
  }

  // The target: the pinned (or asked for) version, else the latest; a
  // retained snapshot of it is republished instead of loading its file.
  absl::StatusOr<IndexVersion> target;
  std::shared_ptr<const IndexSnapshot> retained;
  if (target_pin > 0) {
    {
      absl::MutexLock lock(&mu_);
      retained = FindRetained(target_pin);
    }
    target = retained != nullptr
                 ? IndexVersion{target_pin, retained->info().path}
                 : source_.Find(target_pin);
  } else {
    target = source_.Latest();
    if (target.ok()) {
      absl::MutexLock lock(&mu_);
      retained = FindRetained(target->version);
      if (retained != nullptr && retained->info().path != target->path) {
        retained = nullptr;
      }
    }
  }
  absl::Status status = target.status();
  bool loaded = false;
  bool republished = false;
  if (!status.ok()) {
    spdlog::warn("index reload: {}", status.ToString());
  } else if (target->version == served && target->path == served_path) {
    // The target already serves: nothing to load.
  } else if (retained != nullptr) {
    spdlog::info("index version {} ({}) republished from the retained "
                 "versions, without a load",
                 target->version, target->path);
    metrics_->SetIndexInfo(retained->info());
    {
      absl::MutexLock lock(&mu_);
      auto it = checksum_states_.find(target->version);
      metrics_->SetIndexChecksumState(
          it != checksum_states_.end() ? it->second
                                       : Metrics::ChecksumState::kUnchecked);
    }
    Publish(std::move(retained));
    republished = true;
  } else if (!pin.has_value() && target->version == refused) {
    status = refused_status;
  } else {
    status = LoadAndPublish(*target, dim, metric);
    metrics_->RecordIndexReload(status.ok());
    if (status.ok()) {
      loaded = true;
    } else {
      status = absl::Status(
          status.code(),
          absl::StrCat("index version ", target->version, " (", target->path,
                       ") refused: ", status.message(),
                       served == 0 ? ""
                                   : absl::StrCat("; still serving version ",
                                                  served)));
      spdlog::error("{}", status.ToString());
    }
  }

  absl::MutexLock lock(&mu_);
  reloading_ = false;
  if (!status.ok()) {
    if (target.ok() && target->version != refused_version_) {
      refused_version_ = target->version;
      refused_status_ = status;
    }
    return status;
  }
  if (loaded || republished) {
    served_version_ = target->version;
    served_path_ = target->path;
    if (refused_version_ == target->version) {
      refused_version_ = 0;
      refused_status_ = absl::OkStatus();
    }
  }
  if (pin.has_value()) pinned_version_ = *pin;
  Outcome outcome;
  outcome.version = target->version;
  outcome.path = target->path;
  outcome.loaded = loaded;
  outcome.previous_version = served;
  outcome.pinned_version = pinned_version_;
  return outcome;
}

void IndexManager::Publish(std::shared_ptr<const IndexSnapshot> snapshot) {
  std::shared_ptr<const IndexSnapshot> replaced = holder_->Pin();
  const IndexSnapshot* published = snapshot.get();
  holder_->Publish(std::move(snapshot));
  {
    absl::MutexLock lock(&mu_);
    retained_.erase(std::remove_if(retained_.begin(), retained_.end(),
                                   [published](const auto& r) {
                                     return r.get() == published;
                                   }),
                    retained_.end());
    if (replaced != nullptr && options_.keep_previous_versions > 0) {
      retained_.push_front(std::move(replaced));
      while (retained_.size() >
             static_cast<size_t>(options_.keep_previous_versions)) {
        retained_.pop_back();
      }
    }
    for (auto it = checksum_states_.begin(); it != checksum_states_.end();) {
      const int64_t v = it->first;
      const bool kept =
          v == published->info().version ||
          std::any_of(retained_.begin(), retained_.end(),
                      [v](const auto& r) { return r->info().version == v; });
      it = kept ? std::next(it) : checksum_states_.erase(it);
    }
  }
  metrics_->SetIndexServing(true);
  if (options_.serving_changed) options_.serving_changed(true);
}

void IndexManager::CheckInBackground(
    std::shared_ptr<const IndexSnapshot> snapshot) {
  const IndexInfo& info = snapshot->info();
  const absl::Time start = absl::Now();
  absl::Status status = snapshot->VerifyChecksums(&cancel_);
  {
    absl::MutexLock lock(&mu_);
    background_read_done_ = true;  // a reload waiting for it may go on
  }
  if (status.ok()) {
    spdlog::info("index version {} ({}): checksums verified in the "
                 "background in {:.1f} ms",
                 info.version, info.path,
                 absl::ToDoubleMilliseconds(absl::Now() - start));
  } else if (!absl::IsCancelled(status)) {
    status = absl::Status(
        status.code(),
        absl::StrCat("index version ", info.version, " (", info.path,
                     ") withdrawn: it served from start-up until its "
                     "checksum check failed: ",
                     status.message()));
  }
  bool withdrawn = false;
  std::shared_ptr<const IndexSnapshot> released;
  {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && !absl::IsCancelled(status)) {
      // Not in the middle of a reload, which may be replacing it.
      mu_.Await(absl::Condition(
          +[](IndexManager* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(m->mu_) {
            return !m->reloading_ || m->stopping_;
          },
          this));
      checksum_states_[info.version] = Metrics::ChecksumState::kFailed;
      if (!stopping_ && holder_->Pin() == snapshot) {
        metrics_->SetIndexChecksumState(Metrics::ChecksumState::kFailed);
        metrics_->SetIndexServing(false);
        released = holder_->Withdraw(status);
        served_version_ = 0;
        served_path_.clear();
        refused_version_ = info.version;
        refused_status_ = status;
        withdrawn = true;
      }
    } else if (status.ok()) {
      checksum_states_[info.version] = Metrics::ChecksumState::kVerified;
      if (holder_->Pin() == snapshot) {
        metrics_->SetIndexChecksumState(Metrics::ChecksumState::kVerified);
      }
    }
    background_done_ = true;
    background_status_ = status;
  }
  if (withdrawn) {
    spdlog::error("{}", std::string(status.message()));
    if (options_.serving_changed) options_.serving_changed(false);
  } else if (!status.ok() && !absl::IsCancelled(status)) {
    spdlog::error("{} (no longer serving: it was replaced first)",
                  std::string(status.message()));
  }
}

absl::Status IndexManager::AwaitBackgroundCheck(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !background_started_ || background_done_;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError(
        "the background checksum check is still running");
  }
  return background_status_;
}

std::shared_ptr<const IndexSnapshot> IndexManager::FindRetained(
    int64_t version) {
  for (const auto& r : retained_) {
    if (r->info().version == version) return r;
  }
  return nullptr;
}

absl::StatusOr<std::vector<IndexManager::VersionState>>
IndexManager::ListVersions() const {
  absl::StatusOr<std::vector<IndexVersion>> listed = source_.List();
  if (!listed.ok()) return listed.status();
  absl::MutexLock lock(&mu_);
  std::vector<VersionState> states;
  auto add = [&](int64_t version, const std::string& path) {
    VersionState state;
    state.version = version;
    state.path = path;
    state.serving = version == served_version_ && path == served_path_;
    for (const auto& r : retained_) {
      if (r->info().version == version && r->info().path == path) {
        state.retained = true;
      }
    }
    if (version == refused_version_) {
      state.refused = true;
      state.refused_reason = std::string(refused_status_.message());
    }
    states.push_back(std::move(state));
  };
  for (const IndexVersion& v : *listed) add(v.version, v.path);
  // Versions in memory whose files are gone: retained ones, and the one
  // serving after a rollback to a retained version.
  auto add_if_missing = [&](int64_t version, const std::string& path) {
    const bool listed_already = std::any_of(
        states.begin(), states.end(), [&](const VersionState& v) {
          return v.version == version && v.path == path;
        });
    if (!listed_already) add(version, path);
  };
  for (const auto& r : retained_) {
    add_if_missing(r->info().version, r->info().path);
  }
  if (served_version_ != 0) add_if_missing(served_version_, served_path_);
  std::sort(states.begin(), states.end(),
            [](const VersionState& a, const VersionState& b) {
              return a.version < b.version;
            });
  return states;
}

int64_t IndexManager::pinned_version() const {
  absl::MutexLock lock(&mu_);
  return pinned_version_;
}

absl::Status IndexManager::LoadAndPublish(
    const IndexVersion& target, int expected_dim,
    absl::optional<Metric> expected_metric) {
  using ChecksumCheck = Options::ChecksumCheck;
  bool defer;  // the first version under kBackground: verified after
  {
    absl::MutexLock lock(&mu_);
    // A load waits for the background check's read: one whole-file read of
    // an index at a time, so that a reload does not compete with it for the
    // disk and page cache.
    mu_.Await(absl::Condition(
        +[](IndexManager* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(m->mu_) {
          return !m->background_started_ || m->background_read_done_ ||
                 m->stopping_;
        },
        this));
    defer = options_.checksum_check == ChecksumCheck::kBackground &&
            dim_ == 0 && !background_started_;
  }
  LoadOptions load = options_.load;
  load.version = target.version;
  load.verify_checksum =
      options_.checksum_check != ChecksumCheck::kOff && !defer;
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> loaded =
      IndexSnapshot::Load(target.path, load);
  if (!loaded.ok()) return loaded.status();
  std::shared_ptr<const IndexSnapshot> snapshot = std::move(*loaded);
  const IndexInfo& info = snapshot->info();
  if (expected_dim != 0 && info.dim != expected_dim) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "its dim=%d differs from dim=%d of the index served since start-up; "
        "clients send %d-dim queries",
        info.dim, expected_dim, expected_dim));
  }
  if (expected_metric.has_value() && info.metric != *expected_metric) {
    return absl::FailedPreconditionError(absl::StrCat(
        "its metric ", MetricName(info.metric), " differs from metric ",
        MetricName(*expected_metric),
        " of the index served since start-up; distances would change meaning"));
  }
  if (options_.prepare) {
    if (absl::Status s = options_.prepare(*snapshot); !s.ok()) return s;
  }
  LogServed(info);
  metrics_->SetIndexInfo(info);
  const bool checkable = info.has_metadata || info.has_vectors;
  const Metrics::ChecksumState checksum =
      !checkable             ? Metrics::ChecksumState::kUnchecked
      : defer                ? Metrics::ChecksumState::kPending
      : load.verify_checksum ? Metrics::ChecksumState::kVerified
                             : Metrics::ChecksumState::kUnchecked;
  {
    absl::MutexLock lock(&mu_);
    if (dim_ == 0) {
      dim_ = info.dim;
      metric_ = info.metric;
    }
    checksum_states_[info.version] = checksum;
    metrics_->SetIndexChecksumState(checksum);
  }
  Publish(snapshot);
  if (defer && checkable) {
    spdlog::info("index version {} serves before its checksums are "
                 "verified; reading {} in the background to verify them",
                 info.version,
                 info.has_vectors
                     ? absl::StrCat(info.path, " and ", info.vectors_path)
                     : info.path);
    absl::MutexLock lock(&mu_);
    background_started_ = true;
    checker_ = std::thread([this, snapshot] { CheckInBackground(snapshot); });
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
        return reload_requested_ || stopping_;
      };
      if (poll) {
        mu_.AwaitWithTimeout(absl::Condition(&woken), options_.poll_interval);
      } else {
        mu_.Await(absl::Condition(&woken));
      }
      if (stopping_) return;
      requested = reload_requested_;
      reload_requested_ = false;
    }
    absl::StatusOr<Outcome> outcome = Reload();
    if (requested && outcome.ok() && !outcome->loaded) {
      spdlog::info("index reload: version {} ({}) is already serving",
                   outcome->version, outcome->path);
    }
  }
}

}  // namespace knnd
