// Replacing files so that a reader never sees half of one, and a crash
// never loses a completed write: write a temporary file in the same
// directory, fsync it, rename it over the target, fsync the directory.
// The one implementation for index files, sidecars, vectors files and
// version directories. A file that knnd maps is therefore never rewritten
// in place.
//
// Thread-safety: the functions share no state; concurrent writers of the
// same path get distinct temporary names only across processes (the pid),
// so one process writes one path from one thread at a time.
#ifndef KNND_STORAGE_ATOMIC_FILE_H_
#define KNND_STORAGE_ATOMIC_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace knnd {

// `path` + ".tmp." + this process's pid: same directory, so the rename
// stays within one filesystem.
std::string TempPathFor(const std::string& path);

// fsyncs `tmp`, renames it to `path` and fsyncs `path`'s directory. On
// failure `tmp` is removed and `path` is as it was; DATA_LOSS or
// PERMISSION_DENIED naming the file and the system's reason.
absl::Status CommitTempFile(const std::string& tmp, const std::string& path);

// Writes `contents` to `path` through TempPathFor(path) and
// CommitTempFile().
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

// fsyncs `path` (a regular file); DATA_LOSS naming it on failure.
absl::Status SyncFile(const std::string& path);

// fsyncs the directory holding `path` (after a rename into it), or `path`
// itself when it is a directory. Best effort: some filesystems refuse.
void SyncDirectoryOf(const std::string& path);

}  // namespace knnd

#endif  // KNND_STORAGE_ATOMIC_FILE_H_
