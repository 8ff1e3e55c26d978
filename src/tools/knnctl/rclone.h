// rclone as knnctl's client of object storage: `knnctl publish --remote`
// runs the rclone binary found on PATH (Debian's package `rclone`) as a
// subprocess rather than speaking S3 itself, so that every storage rclone
// knows (S3 and S3-compatible stores, GCS, Azure Blob), its retries,
// multipart uploads and credential chains (environment, instance roles,
// workload identity) come with it. The remote is configured the way rclone
// is everywhere: a remote NAME defined by RCLONE_CONFIG_NAME_TYPE=s3 and
// its sibling variables, or an rclone config file; knnctl never sees the
// credentials. Every rclone flag can be set through its variable too
// (RCLONE_BWLIMIT, RCLONE_TRANSFERS ...).
//
// Thread-safety: pure functions; each call runs one rclone process and
// waits for it.
#ifndef KNND_TOOLS_KNNCTL_RCLONE_H_
#define KNND_TOOLS_KNNCTL_RCLONE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace knnd::knnctl {

// The rclone executable on PATH; FAILED_PRECONDITION saying what needs it
// and how to install it when there is none.
absl::StatusOr<std::string> FindRclone();

// Runs `rclone args...` and returns what it printed on stdout once it
// exited 0. NOT_FOUND when it exited 3 (rclone's "directory not found");
// otherwise UNAVAILABLE naming `what`, the exit code and the last lines of
// rclone's stderr (an unreachable endpoint, refused credentials ...).
absl::StatusOr<std::string> RunRclone(const std::string& rclone,
                                      const std::vector<std::string>& args,
                                      absl::string_view what);

}  // namespace knnd::knnctl

#endif  // KNND_TOOLS_KNNCTL_RCLONE_H_
