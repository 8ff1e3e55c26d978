// main() of every googletest binary: the index probe (index/index_probe.h)
// runs the test binary itself.
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/index/index_probe.h"

int main(int argc, char** argv) {
  // The probe-timeout test: a probe that never answers, as on a filesystem
  // that hangs.
  if (argc > 1 && std::strcmp(argv[1], knnd::kIndexProbeFlag) == 0 &&
      std::getenv("KNND_TEST_PROBE_HANGS") != nullptr) {
    for (;;) pause();
  }
  knnd::RunIndexProbeIfAsked(argc, argv);
  testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
