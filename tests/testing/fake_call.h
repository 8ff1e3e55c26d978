// FakeCall: a ServerCall (rpc/server_call.h) with no protocol under it, for
// tests of the code that handlers share (SearchAdmission): it carries an
// authorization value and a deadline, and records the trailers added and
// the answers given. Not thread-safe.
#ifndef KNND_TESTING_FAKE_CALL_H_
#define KNND_TESTING_FAKE_CALL_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/optional.h"
#include "knnd/rpc/server_call.h"
#include "knnd/rpc/token_auth.h"

namespace knnd::testing {

class FakeCall : public ServerCallBase {
 public:
  Metrics::Protocol protocol() const override {
    return Metrics::Protocol::kGrpc;
  }
  std::string peer() const override { return "fake"; }
  absl::Time deadline() const override { return deadline_; }
  bool cancelled() const override { return false; }
  absl::Status Authorize(const TokenAuthenticator& auth,
                         absl::string_view method) const override {
    return auth.Check(method, authorization_);
  }
  void AddTrailer(const std::string& key, const std::string& value) override {
    trailers_.emplace_back(key, value);
  }
  void OnCancel(std::function<void()> /*on_cancel*/) override {}
  void OnDone(std::function<void()> /*on_done*/) override {}
  void Answer(const absl::Status& status) override {
    answers_.push_back(status);
  }

  void set_authorization(std::string value) {
    authorization_ = std::move(value);
  }
  void set_deadline(absl::Time deadline) { deadline_ = deadline; }
  const std::vector<std::pair<std::string, std::string>>& trailers() const {
    return trailers_;
  }
  const std::vector<absl::Status>& answers() const { return answers_; }

 private:
  absl::optional<std::string> authorization_;
  absl::Time deadline_ = absl::InfiniteFuture();
  std::vector<std::pair<std::string, std::string>> trailers_;
  std::vector<absl::Status> answers_;
};

}  // namespace knnd::testing

#endif  // KNND_TESTING_FAKE_CALL_H_
