// The index probe: an index file is first read, and searched once, in a
// separate process, so that a corrupt file that would crash FAISS's reader
// (a division by a zero field, a wild offset) kills the probe and yields an
// error instead of killing the daemon.
//
// The probe runs in a new process image: the program's own executable,
// started by posix_spawn as `<program> kIndexProbeFlag PATH` with a pipe on
// fd kIndexProbeFd for its answer, where RunIndexProbeIfAsked (first thing
// in main()) takes over. A bare fork() of the serving process would run
// FAISS's reader in a copy of a multi-threaded process, where a lock that
// another thread held at the fork (gRPC's, or an allocator's under the
// sanitizers) stays locked for ever; a fresh image inherits none of them.
//
// Thread-safety: ProbeIndexInSubprocess may be called from any thread; it
// keeps no state.
#ifndef KNND_INDEX_INDEX_PROBE_H_
#define KNND_INDEX_INDEX_PROBE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace knnd {

// The argument that makes a program the probe (only knnd passes it).
inline constexpr char kIndexProbeFlag[] = "--knnd_internal_index_probe";
// The probe writes its answer (a status code byte, then the message) here.
inline constexpr int kIndexProbeFd = 3;

// Reads `path` in a probe process, runs one search there, and returns what
// that process found; DATA_LOSS when reading crashed it (the signal named),
// DEADLINE_EXCEEDED when it gave no answer within `timeout` (it is killed
// and reaped).
absl::Status ProbeIndexInSubprocess(const std::string& path,
                                    absl::Duration timeout);

// Every program that loads indexes with the probe on calls this first in
// main(), before it starts threads or parses flags. In the probe process it
// reads the index, writes the outcome to kIndexProbeFd and exits;
// everywhere else it returns at once.
void RunIndexProbeIfAsked(int argc, char** argv);

}  // namespace knnd

#endif  // KNND_INDEX_INDEX_PROBE_H_
