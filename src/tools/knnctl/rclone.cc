#include "rclone.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace knnd::knnctl {
namespace {

// rclone's exit code for "directory not found".
constexpr int kRcloneDirectoryNotFound = 3;
// Lines of rclone's stderr an error quotes.
constexpr size_t kQuotedLines = 3;

// A temporary file removed with this object; the descriptor stays open
// for the child to write into.
class TempOutput {
 public:
  TempOutput() {
    const char* dir = std::getenv("TMPDIR");
    path_ = absl::StrCat(dir != nullptr && *dir != '\0' ? dir : "/tmp",
                         "/knnctl-rclone-XXXXXX");
    fd_ = mkstemp(path_.data());
  }
  ~TempOutput() {
    if (fd_ >= 0) {
      close(fd_);
      unlink(path_.c_str());
    }
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  std::string Read() const {
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// The last `n` non-empty lines of `text`, joined by "; ".
std::string LastLines(const std::string& text, size_t n) {
  std::vector<std::string> lines =
      absl::StrSplit(text, '\n', absl::SkipWhitespace());
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - n);
  for (std::string& line : lines) {
    line = std::string(absl::StripAsciiWhitespace(line));
  }
  return absl::StrJoin(lines, "; ");
}

}  // namespace

absl::StatusOr<std::string> FindRclone() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/rclone");
    struct stat st;
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return absl::FailedPreconditionError(
      "rclone is not on PATH: knnctl publish --remote uploads through rclone "
      "(Debian: apt-get install rclone); see knnctl publish --help for how "
      "the remote is configured");
}

absl::StatusOr<std::string> RunRclone(const std::string& rclone,
                                      const std::vector<std::string>& args,
                                      absl::string_view what) {
  TempOutput out, err;
  if (out.fd() < 0 || err.fd() < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create a temporary file for rclone's output: ",
                     std::strerror(errno)));
  }
  std::vector<char*> argv;
  std::string program = rclone;
  argv.push_back(program.data());
  std::vector<std::string> copies = args;
  for (std::string& arg : copies) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out.fd(), 1);
  posix_spawn_file_actions_adddup2(&actions, err.fd(), 2);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, rclone.c_str(), &actions, nullptr,
                                  argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot run ", rclone, " to ", what, ": ", std::strerror(spawned)));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  if (code == 0) return out.Read();
  const std::string message = absl::StrCat(
      "rclone could not ", what, " (exit ", code,
      WIFSIGNALED(status) ? absl::StrCat(", signal ", WTERMSIG(status))
                          : std::string(),
      "): ", LastLines(err.Read(), kQuotedLines));
  if (code == kRcloneDirectoryNotFound) return absl::NotFoundError(message);
  return absl::UnavailableError(message);
}

}  // namespace knnd::knnctl
