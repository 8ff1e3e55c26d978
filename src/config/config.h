// Reading and checking knnd's configuration (schema: proto/knnd/v1/
// config.proto, text format). Thread-safety: pure functions.
#ifndef KNND_CONFIG_CONFIG_H_
#define KNND_CONFIG_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "knnd/v1/config.pb.h"

namespace knnd {

// Parses a text-format ServerConfig file. Unknown fields and syntax errors
// are INVALID_ARGUMENT naming the file, line and column.
absl::StatusOr<knnd::v1::ServerConfig> LoadConfigFile(const std::string& path);

// Parses text-format ServerConfig from a string (`origin` names it in errors).
absl::StatusOr<knnd::v1::ServerConfig> ParseConfig(const std::string& text,
                                                   const std::string& origin);

// Checks ranges and relations between fields, e.g. that one request of
// max_queries_per_request queries can ever be admitted.
absl::Status ValidateConfig(const knnd::v1::ServerConfig& config);

}  // namespace knnd

#endif  // KNND_CONFIG_CONFIG_H_
