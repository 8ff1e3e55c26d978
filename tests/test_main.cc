// main() of every googletest binary: the index probe (see
// knnd::RunIndexProbeIfAsked) runs the test binary itself.
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/index_snapshot.h"

int main(int argc, char** argv) {
  // The probe-timeout test: a probe that never answers, as on a filesystem
  // that hangs (the flag is the one IndexSnapshot::Load starts probes with).
  if (argc > 1 && std::strcmp(argv[1], "--knnd_internal_index_probe") == 0 &&
      std::getenv("KNND_TEST_PROBE_HANGS") != nullptr) {
    for (;;) pause();
  }
  knnd::RunIndexProbeIfAsked(argc, argv);
  testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
