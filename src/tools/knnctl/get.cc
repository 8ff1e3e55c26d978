// knnctl get: the stored records of given ids (KnnService.Get), one JSON
// object per line, as a shell pipeline (jq) reads them.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "command.h"
#include "knnd/storage/json_value.h"
#include "knnd/v1/knn_service.grpc.pb.h"
#include "knnd_client.h"

namespace knnd::knnctl {
namespace {

struct GetOptions {
  std::string ids;
  std::string fields;
  bool attributes = false;
  bool vectors = false;
  KnndClient::Options client;
};

// One record as a JSON line: {"id":"7","payload":{...},"attributes":{...},
// "vector":[...]}, the id a string as in the API's JSON mapping.
std::string RecordLine(const knnd::v1::Record& record) {
  std::string line = absl::StrCat("{\"id\":\"", record.id(), "\"");
  if (!record.payload().empty()) {
    absl::StrAppend(&line, ",\"payload\":", record.payload());
  }
  if (!record.attributes().empty()) {
    absl::StrAppend(&line, ",\"attributes\":", record.attributes());
  }
  if (record.vector_size() > 0) {
    line += ",\"vector\":[";
    for (int i = 0; i < record.vector_size(); ++i) {
      if (i > 0) line += ',';
      JsonValue::Double(record.vector(i)).AppendTo(&line);
    }
    line += ']';
  }
  line += '}';
  return line;
}

int Get(const GetOptions& options) {
  knnd::v1::GetRequest request;
  for (absl::string_view text :
       absl::StrSplit(options.ids, ',', absl::SkipWhitespace())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(text, &id)) {
      return Fail(absl::StrCat("--ids: '", text,
                               "' is not an integer id (a comma-separated "
                               "list of ids, e.g. --ids 7,42)"));
    }
    request.add_ids(id);
  }
  if (request.ids().empty()) {
    return Fail(
        "--ids names no id: give a comma-separated list, e.g. --ids 7,42");
  }
  if (options.fields == "*") {
    request.mutable_payloads()->set_all_fields(true);
  } else if (!options.fields.empty()) {
    for (absl::string_view field :
         absl::StrSplit(options.fields, ',', absl::SkipWhitespace())) {
      request.mutable_payloads()->add_fields(std::string(field));
    }
  }
  request.set_with_attributes(options.attributes);
  request.set_with_vectors(options.vectors);
  absl::StatusOr<std::unique_ptr<KnndClient>> client =
      KnndClient::Create(options.client);
  if (!client.ok()) return Fail(client.status());
  auto stub = knnd::v1::KnnService::NewStub((*client)->channel());
  grpc::ClientContext context;
  (*client)->Prepare(context);
  knnd::v1::GetResponse response;
  grpc::Status s = stub->Get(&context, request, &response);
  if (!s.ok()) return FailRpc("Get", s);
  for (const knnd::v1::Record& record : response.records()) {
    std::printf("%s\n", RecordLine(record).c_str());
  }
  for (int64_t id : response.missing()) {
    std::printf("{\"id\":\"%lld\",\"missing\":true}\n",
                static_cast<long long>(id));
  }
  return kExitOk;
}

}  // namespace

std::function<int()> DefineGet(FlagSet& flags) {
  auto options = std::make_shared<GetOptions>();
  flags.Add("ids", &options->ids, "ID,ID,...",
            "The ids whose records to print (the index's ids: row numbers, or "
            "those of knnctl build --ids), at most the server's max_get_ids.");
  flags.Add("fields", &options->fields, "F,F,...|*",
            "Payload fields to print with each record; * = every field; "
            "empty = no payload.");
  flags.AddSwitch("attributes", &options->attributes,
                  "Print each record's attributes.");
  flags.AddSwitch("vectors", &options->vectors,
                  "Print each record's stored vector (an index served with "
                  "its raw vectors).");
  KnndClient::AddFlags(KnndClient::Api::kSearch, flags, options->client);
  return [options] { return Get(*options); };
}

}  // namespace knnd::knnctl
