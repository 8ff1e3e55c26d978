// Test helpers for knnd's /metrics: a plain HTTP/1.0 GET on loopback and a
// reader of the Prometheus text exposition format.
//
// Thread-safety: the functions share no state.
#ifndef KNND_TESTS_SCRAPE_UTIL_H_
#define KNND_TESTS_SCRAPE_UTIL_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/optional.h"

namespace knnd::testing {

// GET http://127.0.0.1:<port><target>; the body of a 200 response, else an
// error naming the status line.
absl::StatusOr<std::string> HttpGet(int port, const std::string& target);

// One sample line of the exposition: name{labels} value.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
std::vector<Sample> ParseExposition(const std::string& text);

// Every sample of GET http://127.0.0.1:<port>/metrics; none, and a test
// failure, when the scrape fails.
std::vector<Sample> Scrape(int port);

// The value of the one sample named `name` whose labels include `labels`;
// nullopt when there is none (several matches are a test failure).
absl::optional<double> FindSample(
    const std::vector<Sample>& samples, const std::string& name,
    const std::map<std::string, std::string>& labels = {});

// Sum of every sample named `name` that has `labels`.
double SumSamples(const std::vector<Sample>& samples, const std::string& name,
                  const std::map<std::string, std::string>& labels = {});

// Percent-encodes a URL query parameter value.
std::string UrlEncode(const std::string& value);

}  // namespace knnd::testing

#endif  // KNND_TESTS_SCRAPE_UTIL_H_
