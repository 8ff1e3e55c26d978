// main() of every googletest binary: the index probe (see
// knnd::RunIndexProbeIfAsked) runs the test binary itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/index_snapshot.h"

int main(int argc, char** argv) {
  knnd::RunIndexProbeIfAsked(argc, argv);
  testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
