// RawHttp: one TCP connection to 127.0.0.1 speaking HTTP/1.1 by hand, for
// tests of the HTTP listener that need what a library client hides: bytes
// sent a few at a time, a body never sent, a connection kept alive, the
// server closing it. Header-only; not thread-safe.
#ifndef KNND_TESTING_RAW_HTTP_H_
#define KNND_TESTING_RAW_HTTP_H_

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"

namespace knnd::testing {

class RawHttp {
 public:
  struct Response {
    int status = 0;
    std::map<std::string, std::string> headers;  // lower-case names
    std::string body;
  };

  explicit RawHttp(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address),
                         sizeof(address)) == 0;
  }
  ~RawHttp() { close(fd_); }
  RawHttp(const RawHttp&) = delete;
  RawHttp& operator=(const RawHttp&) = delete;

  bool connected() const { return connected_; }

  // A request with Content-Length (no body: none sent).
  static std::string Request(absl::string_view method, absl::string_view path,
                             absl::string_view body = "",
                             absl::string_view extra_headers = "") {
    return absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: test\r\n",
                        extra_headers, "Content-Length: ", body.size(),
                        "\r\n\r\n", body);
  }

  bool Send(absl::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // One response (a Content-Length body); nullopt when the connection
  // closes first or `timeout` passes.
  absl::optional<Response> Read(absl::Duration timeout = absl::Seconds(30)) {
    const absl::Time end = absl::Now() + timeout;
    size_t header_end;
    while ((header_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill(end)) return absl::nullopt;
    }
    Response response;
    const std::string head = buffer_.substr(0, header_end);
    size_t line_end = head.find("\r\n");
    const std::string status_line = head.substr(0, line_end);
    if (status_line.size() < 12 ||
        !absl::SimpleAtoi(status_line.substr(9, 3), &response.status)) {
      return absl::nullopt;
    }
    while (line_end != std::string::npos) {
      const size_t next = head.find("\r\n", line_end + 2);
      const std::string line = head.substr(
          line_end + 2,
          next == std::string::npos ? std::string::npos : next - line_end - 2);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        response.headers[absl::AsciiStrToLower(line.substr(0, colon))] =
            std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
      line_end = next;
    }
    size_t length = 0;
    if (auto it = response.headers.find("content-length");
        it != response.headers.end()) {
      length = static_cast<size_t>(std::atoll(it->second.c_str()));
    }
    while (buffer_.size() < header_end + 4 + length) {
      if (!Fill(end)) return absl::nullopt;
    }
    response.body = buffer_.substr(header_end + 4, length);
    buffer_.erase(0, header_end + 4 + length);
    return response;
  }

  // Whether the server ends the connection (end of stream or reset)
  // within `timeout`, whatever it sends first.
  bool ClosedWithin(absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (Fill(end)) {
    }
    return !timed_out_;
  }

 private:
  // Reads more into buffer_; false at the end of the stream, on an error,
  // or at `end` (timed_out_ then).
  bool Fill(absl::Time end) {
    timed_out_ = false;
    const int64_t ms = absl::ToInt64Milliseconds(end - absl::Now());
    pollfd p{fd_, POLLIN, 0};
    if (ms <= 0 || poll(&p, 1, static_cast<int>(ms)) <= 0) {
      timed_out_ = true;
      return false;
    }
    char chunk[65536];
    const ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  bool timed_out_ = false;
  std::string buffer_;
};

}  // namespace knnd::testing

#endif  // KNND_TESTING_RAW_HTTP_H_
