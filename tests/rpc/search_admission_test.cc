// SearchAdmission: the steps both Search front doors share, each with what
// the caller sees (status, pushback trailer) and what is counted, on a
// FakeCall (the protocols' calls are tested with their listeners).
#include "knnd/rpc/search_admission.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_call.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using knnd::testing::FindSample;
using knnd::testing::Scrape;

constexpr const char* kReasons[] = {"queue_full", "draining", "deadline",
                                    "invalid", "not_ready"};

class SearchAdmissionTest : public ::testing::Test {
 protected:
  // One exposer for the suite (stopping one takes a while): each test reads
  // what its own calls added to the counters.
  static void SetUpTestSuite() {
    metrics_ = knnd::testing::IdleMetrics().release();
    ASSERT_NE(metrics_, nullptr);
    ASSERT_TRUE(metrics_->StartExposer().ok());
  }
  static void TearDownTestSuite() { delete metrics_; }

  void SetUp() override {
    for (const char* reason : kReasons) before_[reason] = Count(reason);
    absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth =
        TokenAuthenticator::Create({});
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = std::move(*auth);
    AdmissionGate::Options gate;
    gate.max_inflight_queries = 10;
    gate_ = std::make_unique<AdmissionGate>(gate);
    admission_ = std::make_unique<SearchAdmission>(
        SearchAdmission::Options{77}, gate_.get(), metrics_, auth_.get(),
        &hold_);
  }

  // Records every answer given.
  SearchAdmission::Answer Recorder() {
    return [this](const absl::Status& status) { answers_.push_back(status); };
  }

  static double Count(const std::string& reason) {
    return FindSample(Scrape(metrics_->port()), "knnd_search_rejected_total",
                      {{"reason", reason}})
        .value_or(-1);
  }
  // Refusals counted under `reason` since the test began.
  double Rejected(const std::string& reason) {
    return Count(reason) - before_[reason];
  }

  static Metrics* metrics_;
  std::map<std::string, double> before_;
  std::unique_ptr<TokenAuthenticator> auth_;
  std::unique_ptr<AdmissionGate> gate_;
  CallHold hold_;
  std::unique_ptr<SearchAdmission> admission_;
  std::vector<absl::Status> answers_;
};

Metrics* SearchAdmissionTest::metrics_ = nullptr;

TEST_F(SearchAdmissionTest, AdmitsWithinTheGateWithoutAnswering) {
  knnd::testing::FakeCall call;
  const absl::Time now = absl::Now();
  absl::StatusOr<AdmissionGate::Ticket> ticket = admission_->Admit(
      call, now, now + absl::Seconds(1), {4, 100, 0}, Recorder());
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  EXPECT_TRUE(answers_.empty());
  EXPECT_EQ(gate_->queries_in_flight(), 4);
  ticket->Release();
  EXPECT_EQ(gate_->queries_in_flight(), 0);
}

TEST_F(SearchAdmissionTest, ADeadlinePassedOnArrivalIsRefusedWithoutTheGate) {
  knnd::testing::FakeCall call;
  const absl::Time now = absl::Now();
  absl::StatusOr<AdmissionGate::Ticket> ticket =
      admission_->Admit(call, now, now, {4, 100, 0}, Recorder());
  EXPECT_TRUE(absl::IsDeadlineExceeded(ticket.status()));
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_EQ(answers_[0], ticket.status());
  EXPECT_EQ(gate_->queries_in_flight(), 0);
  EXPECT_EQ(Rejected("deadline"), 1);
}

TEST_F(SearchAdmissionTest, AFullGateAsksForThePushbackAndCountsTheRefusal) {
  knnd::testing::FakeCall call;
  const absl::Time now = absl::Now();
  absl::StatusOr<AdmissionGate::Ticket> held = admission_->Admit(
      call, now, now + absl::Seconds(1), {10, 0, 0}, Recorder());
  ASSERT_TRUE(held.ok());
  absl::StatusOr<AdmissionGate::Ticket> refused = admission_->Admit(
      call, now, now + absl::Seconds(1), {1, 0, 0}, Recorder());
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status()));
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_TRUE(absl::IsResourceExhausted(answers_[0]));
  EXPECT_THAT(call.trailers(),
              ::testing::ElementsAre(::testing::Pair(kPushbackMetadata, "77")));
  EXPECT_EQ(Rejected("queue_full"), 1);
}

TEST_F(SearchAdmissionTest, ADrainingRefusalIsHeldUntilTheHoldLetsGo) {
  gate_->StartDraining();
  hold_.Start();
  knnd::testing::FakeCall call;
  const absl::Time now = absl::Now();
  absl::StatusOr<AdmissionGate::Ticket> ticket = admission_->Admit(
      call, now, now + absl::Seconds(30), {1, 0, 0}, Recorder());
  EXPECT_TRUE(absl::IsUnavailable(ticket.status()));
  EXPECT_TRUE(answers_.empty());  // held
  EXPECT_EQ(Rejected("draining"), 1);
  hold_.Release();
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_TRUE(absl::IsUnavailable(answers_[0]));
}

TEST_F(SearchAdmissionTest, ADrainingRefusalIsAnsweredAtOnceWithoutAHold) {
  gate_->StartDraining();
  knnd::testing::FakeCall call;
  const absl::Time now = absl::Now();
  absl::StatusOr<AdmissionGate::Ticket> ticket = admission_->Admit(
      call, now, now + absl::Seconds(30), {1, 0, 0}, Recorder());
  EXPECT_TRUE(absl::IsUnavailable(ticket.status()));
  ASSERT_EQ(answers_.size(), 1u);
}

TEST_F(SearchAdmissionTest, RefuseCountsTheReasonAndAnswers) {
  admission_->Refuse(RejectReason::kNotReady,
                     absl::UnavailableError("loading"), Recorder());
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_EQ(answers_[0], absl::UnavailableError("loading"));
  EXPECT_EQ(Rejected("not_ready"), 1);
}

TEST_F(SearchAdmissionTest, AnUnknownTokenIsAnsweredAndNotCountedAsARejection) {
  knnd::testing::TempDir tmp;
  const std::string tokens = tmp.path("tokens");
  knnd::testing::WriteFile(tokens, "search-token-0123456789\n");
  TokenAuthenticator::Options options;
  options.search_token_file = tokens;
  absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth =
      TokenAuthenticator::Create(options);
  ASSERT_TRUE(auth.ok()) << auth.status();
  SearchAdmission admission({50}, gate_.get(), metrics_, auth->get(),
                            nullptr);
  knnd::testing::FakeCall call;
  EXPECT_FALSE(admission.Authorize(call, Recorder()));
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_TRUE(absl::IsUnauthenticated(answers_[0]));
  call.set_authorization("Bearer search-token-0123456789");
  EXPECT_TRUE(admission.Authorize(call, Recorder()));
  EXPECT_EQ(answers_.size(), 1u);
  for (const char* reason : kReasons) {
    EXPECT_EQ(Rejected(reason), 0) << reason;
  }
}

}  // namespace
}  // namespace knnd
