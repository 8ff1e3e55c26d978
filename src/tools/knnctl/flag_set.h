// FlagSet: the flags of one knnctl command, each bound to a field of that
// command's options, parsed from the command's arguments and described by
// its --help.
//
// knnctl does not use absl flags: they are process-global, one help text
// and one default per name, so `--batch` or `--index` could not mean one
// thing to eval and another to search, and every command would accept
// every other command's flags. A FlagSet knows only its command's flags;
// anything else is an error naming the flag.
//
// Accepted forms: --name VALUE, --name=VALUE, and for booleans --name or
// --name=true|false; a single leading dash works too (as absl's parser
// allowed). A later occurrence of a flag overrides an earlier one.
//
// Ownership: the bound fields belong to the caller and must outlive the
// FlagSet. Thread-safety: none needed; main() uses it on one thread.
#ifndef KNND_TOOLS_KNNCTL_FLAG_SET_H_
#define KNND_TOOLS_KNNCTL_FLAG_SET_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"

namespace knnd::knnctl {

class FlagSet {
 public:
  // `placeholder` names the value in the help ("FILE", "N"); `help` is one
  // or more sentences. The field's value when Add() is called is the
  // default the help shows (strings: only when not empty).
  void Add(const char* name, std::string* value, const char* placeholder,
           const char* help);
  void Add(const char* name, int* value, const char* placeholder,
           const char* help);
  void Add(const char* name, int64_t* value, const char* placeholder,
           const char* help);
  void Add(const char* name, uint32_t* value, const char* placeholder,
           const char* help);
  void Add(const char* name, double* value, const char* placeholder,
           const char* help);
  // Unset until given on the command line; the help shows no default.
  void Add(const char* name, absl::optional<int64_t>* value,
           const char* placeholder, const char* help);
  // A switch: --name turns it on.
  void AddSwitch(const char* name, bool* value, const char* help);
  // A switch whose default depends on other flags: unset until given
  // (--name or --name=true|false); the help shows no default, so `help`
  // says what it is.
  void AddSwitch(const char* name, absl::optional<bool>* value,
                 const char* help);

  // Help() lists the flags added after this call under `title` ("flags"
  // until the first call).
  void StartSection(const char* title) { section_ = title; }

  // Sets the bound fields from `args`. INVALID_ARGUMENT naming the
  // argument: an unknown flag, a missing or malformed value, an argument
  // that is not a flag.
  absl::Status Parse(const std::vector<std::string>& args);

  // One entry per flag, in the order added: "  --name PLACEHOLDER
  // (default D)" and the help wrapped below it; each section is a block of
  // its own, headed "<title>:".
  std::string Help() const;

 private:
  struct Flag {
    std::string name;
    std::string placeholder;  // empty for a switch
    std::string help;
    std::string default_text;  // empty: none shown
    // Stores the text of a value; false when it is not of the flag's type.
    std::function<bool(absl::string_view)> set;
    const char* expected;  // what set() accepts, for the error message
    std::string section;
  };

  template <typename Int>
  void AddInteger(const char* name, Int* value, const char* placeholder,
                  const char* help, const char* expected);
  const Flag* Find(absl::string_view name) const;

  std::vector<Flag> flags_;
  std::string section_ = "flags";
};

}  // namespace knnd::knnctl

#endif  // KNND_TOOLS_KNNCTL_FLAG_SET_H_
