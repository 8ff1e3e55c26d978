#include "flag_set.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace knnd::knnctl {
namespace {

constexpr int kHelpIndent = 6;
constexpr int kHelpWidth = 78;

// `text` as lines of at most kHelpWidth columns, each indented by
// kHelpIndent (a word longer than a line gets a line of its own).
std::string Wrap(absl::string_view text) {
  std::string out;
  int column = 0;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (column > 0 && column + 1 + static_cast<int>(word.size()) > kHelpWidth) {
      out += '\n';
      column = 0;
    }
    if (column == 0) {
      out.append(kHelpIndent, ' ');
      column = kHelpIndent;
    } else {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += static_cast<int>(word.size());
  }
  return out + '\n';
}

}  // namespace

void FlagSet::Add(const char* name, std::string* value, const char* placeholder,
                  const char* help) {
  flags_.push_back({name, placeholder, help, *value,
                    [value](absl::string_view text) {
                      *value = std::string(text);
                      return true;
                    },
                    "a string", section_});
}

template <typename Int>
void FlagSet::AddInteger(const char* name, Int* value, const char* placeholder,
                         const char* help, const char* expected) {
  flags_.push_back({name, placeholder, help, absl::StrCat(*value),
                    [value](absl::string_view text) {
                      return absl::SimpleAtoi(text, value);
                    },
                    expected, section_});
}

void FlagSet::Add(const char* name, int* value, const char* placeholder,
                  const char* help) {
  AddInteger(name, value, placeholder, help, "a 32-bit integer");
}

void FlagSet::Add(const char* name, int64_t* value, const char* placeholder,
                  const char* help) {
  AddInteger(name, value, placeholder, help, "a 64-bit integer");
}

void FlagSet::Add(const char* name, uint32_t* value, const char* placeholder,
                  const char* help) {
  AddInteger(name, value, placeholder, help, "an unsigned 32-bit integer");
}

void FlagSet::Add(const char* name, double* value, const char* placeholder,
                  const char* help) {
  flags_.push_back({name, placeholder, help, absl::StrCat(*value),
                    [value](absl::string_view text) {
                      return absl::SimpleAtod(text, value);
                    },
                    "a number", section_});
}

void FlagSet::Add(const char* name, absl::optional<int64_t>* value,
                  const char* placeholder, const char* help) {
  flags_.push_back({name, placeholder, help, "",
                    [value](absl::string_view text) {
                      int64_t parsed;
                      if (!absl::SimpleAtoi(text, &parsed)) return false;
                      *value = parsed;
                      return true;
                    },
                    "a 64-bit integer", section_});
}

void FlagSet::AddSwitch(const char* name, bool* value, const char* help) {
  flags_.push_back({name, "", help, *value ? "true" : "",
                    [value](absl::string_view text) {
                      return absl::SimpleAtob(text, value);
                    },
                    "true or false", section_});
}

void FlagSet::AddSwitch(const char* name, absl::optional<bool>* value,
                        const char* help) {
  flags_.push_back({name, "", help, "",
                    [value](absl::string_view text) {
                      bool parsed;
                      if (!absl::SimpleAtob(text, &parsed)) return false;
                      *value = parsed;
                      return true;
                    },
                    "true or false", section_});
}

const FlagSet::Flag* FlagSet::Find(absl::string_view name) const {
  for (const Flag& flag : flags_) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view name = args[i];
    if (!absl::ConsumePrefix(&name, "-")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected argument '", args[i], "': every argument is a --flag"));
    }
    absl::ConsumePrefix(&name, "-");
    absl::optional<absl::string_view> value;
    if (const size_t equals = name.find('='); equals != name.npos) {
      value = name.substr(equals + 1);
      name = name.substr(0, equals);
    }
    const Flag* flag = name.empty() ? nullptr : Find(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!value.has_value()) {
      if (flag->placeholder.empty()) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", name, " needs a value (", flag->placeholder, ")"));
      }
    }
    if (!flag->set(*value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "=", *value, " is not ", flag->expected));
    }
  }
  return absl::OkStatus();
}

std::string FlagSet::Help() const {
  std::string out;
  const std::string* section = nullptr;
  for (const Flag& flag : flags_) {
    if (section == nullptr || *section != flag.section) {
      absl::StrAppend(&out, section == nullptr ? "" : "\n", flag.section,
                      ":\n");
      section = &flag.section;
    }
    absl::StrAppend(&out, "  --", flag.name);
    if (!flag.placeholder.empty()) absl::StrAppend(&out, " ", flag.placeholder);
    if (!flag.default_text.empty()) {
      absl::StrAppend(&out, "  (default ", flag.default_text, ")");
    }
    absl::StrAppend(&out, "\n", Wrap(flag.help));
  }
  return out;
}

}  // namespace knnd::knnctl
