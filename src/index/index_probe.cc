#include "knnd/index/index_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "knnd/faiss/serving_index.h"

namespace knnd {
namespace {

// Status <-> pipe bytes for the probe child: 1 byte code, then the message.
void WriteStatus(int fd, const absl::Status& status) {
  std::string out(1, static_cast<char>(status.code()));
  out.append(status.message().data(), status.message().size());
  const char* p = out.data();
  size_t left = out.size();
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

absl::Status ProbeIndexInSubprocess(const std::string& path,
                                    absl::Duration timeout) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  // dup2 onto itself would leave close-on-exec set: move the write end off
  // kIndexProbeFd first.
  if (fds[1] == kIndexProbeFd) {
    const int moved = fcntl(fds[1], F_DUPFD_CLOEXEC, kIndexProbeFd + 1);
    close(fds[1]);
    if (moved < 0) {
      close(fds[0]);
      return absl::InternalError(absl::StrCat("fcntl: ", strerror(errno)));
    }
    fds[1] = moved;
  }
  // Everything the child gets is built here: posix_spawn runs no code of
  // ours between its clone and the exec.
  char arg0[] = "knnd-index-probe";
  std::string flag = kIndexProbeFlag;
  std::string file = path;
  char* argv[] = {arg0, flag.data(), file.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], kIndexProbeFd);
  // Not the caller's blocked signals or ignored SIGPIPE: the child dies of
  // SIGTERM, or of SIGPIPE when the parent has gone.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int err =
      posix_spawn(&pid, "/proc/self/exe", &actions, &attr, argv, environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (err != 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat(
        "cannot start the index probe process (/proc/self/exe): ",
        strerror(err), "; probe_index_in_subprocess: false reads ", path,
        " without it"));
  }
  std::string reply;
  char buf[4096];
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  int poll_error = 0;
  for (;;) {
    const int64_t wait_ms =
        absl::ToInt64Milliseconds(absl::Ceil(deadline - absl::Now(),
                                             absl::Milliseconds(1)));
    if (wait_ms <= 0) {
      timed_out = true;
      break;
    }
    pollfd readable = {fds[0], POLLIN, 0};
    const int ready =
        poll(&readable, 1, static_cast<int>(std::min<int64_t>(wait_ms, 60000)));
    if (ready < 0 && errno != EINTR) {
      poll_error = errno;
      break;
    }
    if (ready <= 0) continue;
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      reply.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close(fds[0]);
  if (timed_out || poll_error != 0) kill(pid, SIGKILL);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the index probe process for ", path, " gave no answer within ",
        absl::FormatDuration(timeout),
        " and was killed (a hung or very slow filesystem?); "
        "index_probe_timeout_s sets the limit"));
  }
  if (poll_error != 0) {
    return absl::InternalError(absl::StrCat(
        "waiting for the index probe process for ", path, ": ",
        strerror(poll_error)));
  }
  if (WIFSIGNALED(wstatus)) {
    return absl::DataLossError(absl::StrCat(
        "index file ", path, " is corrupt: reading it crashed a probe process (",
        strsignal(WTERMSIG(wstatus)), ")"));
  }
  if (reply.empty()) {
    // A sanitizer's report of a memory error in the reader ends here too.
    return absl::InternalError(absl::StrCat(
        "the probe process for ", path, " exited with status ",
        WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1,
        " without an answer (a program that loads indexes with the probe on "
        "must call knnd::RunIndexProbeIfAsked first in main)"));
  }
  return absl::Status(static_cast<absl::StatusCode>(reply[0]),
                      reply.substr(1));
}

void RunIndexProbeIfAsked(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[1], kIndexProbeFlag) != 0) return;
  struct stat st;
  if (fstat(kIndexProbeFd, &st) != 0 || !S_ISFIFO(st.st_mode)) return;
  // A crash in the reader must reach the parent as the signal it is, not
  // as whatever the program installed (libFuzzer would save a crash).
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    signal(sig, SIG_DFL);
  }
  absl::StatusOr<std::unique_ptr<ServingIndex>> index =
      ServingIndex::Open(argv[2]);
  absl::Status status = index.status();
  if (status.ok()) {
    std::vector<float> query(static_cast<size_t>((*index)->facts().dim), 0.0f);
    float distance;
    int64_t id;
    SearchArgs args;
    args.queries = query.data();
    args.num_queries = 1;
    args.k = 1;
    args.nprobe = 1;
    args.distances = &distance;
    args.ids = &id;
    status = (*index)->Search(args);
  }
  WriteStatus(kIndexProbeFd, status);
  _exit(0);
}

}  // namespace knnd
