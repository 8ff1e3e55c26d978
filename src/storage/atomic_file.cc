#include "knnd/storage/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace knnd {
absl::Status SyncFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) close(fd);
    return absl::DataLossError(
        absl::StrCat("cannot sync ", path, ": ", std::strerror(err)));
  }
  close(fd);
  return absl::OkStatus();
}

std::string TempPathFor(const std::string& path) {
  return absl::StrCat(path, ".tmp.", getpid());
}

void SyncDirectoryOf(const std::string& path) {
  struct stat st;
  std::string dir;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    dir = path;
  } else {
    const size_t slash = path.rfind('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  }
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

absl::Status CommitTempFile(const std::string& tmp, const std::string& path) {
  if (absl::Status s = SyncFile(tmp); !s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot rename ", tmp, " to ", path, ": ", std::strerror(err)));
  }
  SyncDirectoryOf(path);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  const std::string tmp = TempPathFor(path);
  FILE* file = std::fopen(tmp.c_str(), "wb");
  if (file == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  const bool written =
      std::fwrite(contents.data(), 1, contents.size(), file) == contents.size();
  const int err = errno;
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) {
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot write ", tmp, ": ", std::strerror(written ? errno : err)));
  }
  return CommitTempFile(tmp, path);
}

}  // namespace knnd
