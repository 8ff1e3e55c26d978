#include "testing/scrape_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace knnd::testing {

absl::StatusOr<std::string> HttpGet(int port, const std::string& target) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect to port ", port, ": ", strerror(err)));
  }
  const std::string request = absl::StrCat(
      "GET ", target, " HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n");
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("short write");
  }
  std::string response;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) response.append(buf, n);
  close(fd);
  const size_t end_of_headers = response.find("\r\n\r\n");
  if (end_of_headers == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("no HTTP response from port ", port));
  }
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (status_line.find(" 200 ") == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("GET ", target, ": ", status_line));
  }
  return response.substr(end_of_headers + 4);
}

std::vector<Sample> ParseExposition(const std::string& text) {
  std::vector<Sample> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    if (brace != absl::string_view::npos && brace < space) {
      s.name = std::string(line.substr(0, brace));
      const size_t close = line.rfind('}');
      // Label values written by knnd hold no '",' sequences, so a split on
      // '",' is exact here.
      absl::string_view labels = line.substr(brace + 1, close - brace - 1);
      for (absl::string_view pair :
           absl::StrSplit(labels, absl::ByString("\","), absl::SkipEmpty())) {
        std::pair<absl::string_view, absl::string_view> kv =
            absl::StrSplit(pair, absl::MaxSplits("=\"", 1));
        absl::ConsumeSuffix(&kv.second, "\"");
        s.labels[std::string(kv.first)] = std::string(kv.second);
      }
    } else {
      s.name = std::string(line.substr(0, line.find(' ')));
    }
    std::string value(absl::StripAsciiWhitespace(line.substr(space + 1)));
    if (value == "+Inf") {
      s.value = HUGE_VAL;
    } else if (!absl::SimpleAtod(value, &s.value)) {
      continue;
    }
    samples.push_back(std::move(s));
  }
  return samples;
}

std::vector<Sample> Scrape(int port) {
  absl::StatusOr<std::string> body = HttpGet(port, "/metrics");
  EXPECT_TRUE(body.ok()) << body.status();
  return body.ok() ? ParseExposition(*body) : std::vector<Sample>{};
}

namespace {
bool HasLabels(const Sample& s, const std::map<std::string, std::string>& l) {
  for (const auto& [k, v] : l) {
    auto it = s.labels.find(k);
    if (it == s.labels.end() || it->second != v) return false;
  }
  return true;
}
}  // namespace

absl::optional<double> FindSample(
    const std::vector<Sample>& samples, const std::string& name,
    const std::map<std::string, std::string>& labels) {
  absl::optional<double> found;
  for (const Sample& s : samples) {
    if (s.name != name || !HasLabels(s, labels)) continue;
    EXPECT_FALSE(found.has_value()) << "several samples match " << name;
    found = s.value;
  }
  return found;
}

double SumSamples(const std::vector<Sample>& samples, const std::string& name,
                  const std::map<std::string, std::string>& labels) {
  double sum = 0;
  for (const Sample& s : samples) {
    if (s.name == name && HasLabels(s, labels)) sum += s.value;
  }
  return sum;
}

std::string UrlEncode(const std::string& value) {
  std::string out;
  for (unsigned char c : value) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

}  // namespace knnd::testing
