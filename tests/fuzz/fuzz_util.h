// Helpers shared by knnd's libFuzzer targets.
#ifndef KNND_TESTS_FUZZ_FUZZ_UTIL_H_
#define KNND_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace knnd::fuzz {

// A private directory for files the target writes (TEST_TMPDIR or /tmp);
// created once, never removed: libFuzzer ends the process with _Exit.
const std::string& ScratchDir();

// Writes `size` bytes to `path` (truncating it); aborts on an I/O error,
// which is the fuzzing machine's fault, not the input's.
void WriteFileOrDie(const std::string& path, const uint8_t* data, size_t size);

}  // namespace knnd::fuzz

#endif  // KNND_TESTS_FUZZ_FUZZ_UTIL_H_
