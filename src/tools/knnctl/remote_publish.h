// knnctl publish --remote: uploads a finished version, or a sharded set,
// to object storage through rclone (rclone.h), under the next version
// number of REMOTE (PREFIX/<N>/, the numbering of a local versions
// directory), and writes the bucket manifest
// (proto/knnd/v1/bucket_manifest.proto: every file's size and SHA-256)
// LAST, so that a version whose upload stopped half-way has none and is
// never fetched. The versions are checked as `knnctl publish --dir` checks
// them (every bound file present and loaded against its checksum) before
// a byte is uploaded.
//
// Thread-safety: runs on knnctl's main thread.
#ifndef KNND_TOOLS_KNNCTL_REMOTE_PUBLISH_H_
#define KNND_TOOLS_KNNCTL_REMOTE_PUBLISH_H_

#include <string>

namespace knnd::knnctl {

// The bucket manifest's name in a version's folder.
inline constexpr char kBucketManifestName[] = "bucket-manifest.json";

struct RemotePublishOptions {
  std::string index;   // the index file, or the OUT of OUT.shard-S-of-N
  std::string remote;  // REMOTE:bucket/prefix, as rclone names it
  int shards = 0;      // N > 0: publish OUT.shard-0-of-N .. as one set
};

// Runs the publish and prints what it uploaded; knnctl's exit code.
int PublishToRemote(const RemotePublishOptions& options);

}  // namespace knnd::knnctl

#endif  // KNND_TOOLS_KNNCTL_REMOTE_PUBLISH_H_
