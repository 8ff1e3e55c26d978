#include "knnd/lifecycle/retained_versions.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "knnd/lifecycle/version_policy.h"

namespace knnd {
namespace {

IndexVersion VersionOf(const IndexSnapshot& snapshot) {
  return IndexVersion{snapshot.info().version, snapshot.info().path};
}

}  // namespace

void RetainedVersions::Replaced(std::shared_ptr<const IndexSnapshot> replaced,
                                const IndexSnapshot& published) {
  snapshots_.erase(std::remove_if(snapshots_.begin(), snapshots_.end(),
                                  [&published](const auto& r) {
                                    return r.get() == &published;
                                  }),
                   snapshots_.end());
  if (replaced != nullptr && capacity_ > 0) {
    snapshots_.push_front(std::move(replaced));
    while (snapshots_.size() > static_cast<size_t>(capacity_)) {
      snapshots_.pop_back();
    }
  }
  for (auto it = checksum_states_.begin(); it != checksum_states_.end();) {
    const int64_t v = it->first;
    const bool kept =
        v == published.info().version ||
        std::any_of(snapshots_.begin(), snapshots_.end(),
                    [v](const auto& r) { return r->info().version == v; });
    it = kept ? std::next(it) : checksum_states_.erase(it);
  }
}

std::shared_ptr<const IndexSnapshot> RetainedVersions::Find(
    const IndexVersion& version) const {
  for (const auto& r : snapshots_) {
    if (SameVersion(VersionOf(*r), version)) return r;
  }
  return nullptr;
}

std::vector<IndexVersion> RetainedVersions::Versions() const {
  std::vector<IndexVersion> versions;
  versions.reserve(snapshots_.size());
  for (const auto& r : snapshots_) versions.push_back(VersionOf(*r));
  return versions;
}

void RetainedVersions::SetChecksumState(int64_t version,
                                        Metrics::ChecksumState state) {
  checksum_states_[version] = state;
}

Metrics::ChecksumState RetainedVersions::checksum_state(
    int64_t version) const {
  auto it = checksum_states_.find(version);
  return it != checksum_states_.end() ? it->second
                                      : Metrics::ChecksumState::kUnchecked;
}

}  // namespace knnd
