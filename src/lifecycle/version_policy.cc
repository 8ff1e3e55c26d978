#include "knnd/lifecycle/version_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace knnd {
namespace {

using Action = VersionDecision::Action;

// The most recently retained version numbered `version`, or null.
const IndexVersion* FirstRetained(const std::vector<IndexVersion>& retained,
                                  int64_t version) {
  auto it = std::find_if(
      retained.begin(), retained.end(),
      [version](const IndexVersion& r) { return r.version == version; });
  return it == retained.end() ? nullptr : &*it;
}

}  // namespace

bool SameVersion(const IndexVersion& a, const IndexVersion& b) {
  return a.version == b.version && a.path == b.path;
}

int64_t WantedVersion(const VersionRecord& record,
                      const VersionRequest& request) {
  return request.pin.value_or(record.pinned_version);
}

VersionDecision DecideVersion(const VersionPolicyInput& input) {
  const int64_t wanted = WantedVersion(input.record, input.request);
  // A pinned version is found among the retained ones by its number alone:
  // its files may be gone. The latest is retained only as the same file.
  const IndexVersion* retained = nullptr;
  if (wanted > 0) {
    retained = FirstRetained(input.retained, wanted);
  } else if (input.found.ok()) {
    retained = FirstRetained(input.retained, input.found->version);
    if (retained != nullptr && retained->path != input.found->path) {
      retained = nullptr;
    }
  }
  VersionDecision decision;
  if (retained == nullptr && !input.found.ok()) {
    decision.action = Action::kNoTarget;
    decision.status = input.found.status();
    return decision;
  }
  decision.target = retained != nullptr ? *retained : *input.found;
  if (SameVersion(decision.target, input.record.serving)) {
    decision.action = Action::kKeep;
  } else if (retained != nullptr) {
    decision.action = Action::kRepublish;
  } else if (!input.request.pin.has_value() &&
             decision.target.version == input.record.refused_version) {
    decision.action = Action::kStillRefused;
    decision.status = input.record.refused_status;
  } else {
    decision.action = Action::kLoad;
  }
  return decision;
}

absl::Status LoadRefusal(const IndexVersion& target,
                         const absl::Status& load_status,
                         int64_t serving_version) {
  return absl::Status(
      load_status.code(),
      absl::StrCat("index version ", target.version, " (", target.path,
                   ") refused: ", load_status.message(),
                   serving_version == 0
                       ? ""
                       : absl::StrCat("; still serving version ",
                                      serving_version)));
}

VersionRecord RecordAfter(const VersionRecord& before,
                          const VersionRequest& request,
                          const VersionDecision& decision,
                          const absl::Status& result) {
  VersionRecord after = before;
  if (!result.ok()) {
    // The first reason a version was refused is the one kept.
    if (decision.action != Action::kNoTarget &&
        decision.target.version != before.refused_version) {
      after.refused_version = decision.target.version;
      after.refused_status = result;
    }
    return after;
  }
  if (decision.action == Action::kRepublish ||
      decision.action == Action::kLoad) {
    after.serving = decision.target;
    if (after.refused_version == decision.target.version) {
      after.refused_version = 0;
      after.refused_status = absl::OkStatus();
    }
  }
  if (request.pin.has_value()) after.pinned_version = *request.pin;
  return after;
}

VersionRecord RecordAfterWithdrawal(const VersionRecord& before,
                                    int64_t version,
                                    const absl::Status& reason) {
  VersionRecord after = before;
  after.serving = IndexVersion{};
  after.refused_version = version;
  after.refused_status = reason;
  return after;
}

}  // namespace knnd
