// Runs the knnctl binary (KNNCTL_BINARY, defined for every test binary) as
// a user runs it, and writes the id files it reads, for the tests of its
// commands.
#ifndef KNND_TESTS_TESTING_KNNCTL_RUN_H_
#define KNND_TESTS_TESTING_KNNCTL_RUN_H_

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace knnd::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// `knnctl ARGS` through the shell, its output captured. One OpenMP thread:
// tests share the machine, and OpenMP threads spinning on busy cores made
// small builds several times slower. The environment, not --threads,
// which only build and eval take.
inline CommandResult Knnctl(const std::string& args) {
  CommandResult run;
  FILE* pipe = popen(
      absl::StrCat("OMP_NUM_THREADS=1 ", KNNCTL_BINARY, " ", args, " 2>&1")
          .c_str(),
      "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) run.output.append(buf, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// `ids` as a 1-D little-endian int64 .npy, as numpy writes one.
inline void WriteIdsNpy(const std::string& path,
                        const std::vector<int64_t>& ids) {
  std::string header =
      absl::StrCat("{'descr': '<i8', 'fortran_order': False, 'shape': (",
                   ids.size(), ",), }");
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t length = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&length), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(ids.data()),
            static_cast<std::streamsize>(ids.size() * 8));
}

}  // namespace knnd::testing

#endif  // KNND_TESTS_TESTING_KNNCTL_RUN_H_
