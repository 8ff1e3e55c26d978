#include "fuzz_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace knnd::fuzz {

const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl =
        absl::StrCat(base != nullptr ? base : "/tmp", "/knnd_fuzz.XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    return new std::string(tmpl);
  }();
  return *dir;
}

void WriteFileOrDie(const std::string& path, const uint8_t* data,
                    size_t size) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  close(fd);
}

}  // namespace knnd::fuzz
