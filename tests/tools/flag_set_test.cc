// FlagSet, the per-command flag parser of knnctl.
#include "flag_set.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"

namespace knnd::knnctl {
namespace {

using ::testing::HasSubstr;

// One flag of every kind, bound to fields with defaults.
struct Fields {
  std::string input = "in.npy";
  int k = 10;
  int64_t rows = 0;
  uint32_t seed = 1234;
  double recall = 0.95;
  absl::optional<int64_t> pin;
  bool keep = false;
  absl::optional<bool> vectors;
  std::string addr = "localhost:50051";

  FlagSet Define() {
    FlagSet flags;
    flags.Add("input", &input, "FILE", "Vectors to read.");
    flags.Add("k", &k, "N", "Neighbours per query.");
    flags.Add("rows", &rows, "N", "Rows.");
    flags.Add("seed", &seed, "N", "Seed.");
    flags.Add("recall", &recall, "R", "Target recall.");
    flags.Add("pin", &pin, "N", "Version to pin.");
    flags.AddSwitch("keep", &keep, "Keep the vectors.");
    flags.AddSwitch("vectors", &vectors, "Write vectors; default: no --ids.");
    flags.StartSection("connection flags");
    flags.Add("addr", &addr, "HOST:PORT", "Where knnd listens.");
    return flags;
  }
};

absl::Status Parse(Fields& fields, const std::vector<std::string>& args) {
  FlagSet flags = fields.Define();
  return flags.Parse(args);
}

TEST(FlagSet, ParsesEveryFormAndKind) {
  Fields f;
  ASSERT_TRUE(Parse(f, {"--input", "x.npy", "--k=5", "-rows", "-3", "--seed=7",
                        "--recall", "0.5", "--pin", "0", "--keep", "-addr=h:1",
                        "--vectors"})
                  .ok());
  EXPECT_EQ(f.input, "x.npy");
  EXPECT_EQ(f.k, 5);
  EXPECT_EQ(f.rows, -3);  // a value may start with a dash
  EXPECT_EQ(f.seed, 7u);
  EXPECT_EQ(f.recall, 0.5);
  EXPECT_EQ(f.pin, absl::optional<int64_t>(0));
  EXPECT_TRUE(f.keep);
  EXPECT_EQ(f.vectors, absl::optional<bool>(true));
  EXPECT_EQ(f.addr, "h:1");
}

TEST(FlagSet, UnsetFlagsKeepTheirDefaultsAndTheLastOccurrenceWins) {
  Fields f;
  ASSERT_TRUE(
      Parse(f, {"--k", "1", "--k", "2", "--keep", "--keep=false"}).ok());
  EXPECT_EQ(f.k, 2);
  EXPECT_FALSE(f.keep);
  EXPECT_EQ(f.input, "in.npy");
  EXPECT_EQ(f.pin, absl::nullopt);
  EXPECT_EQ(f.vectors, absl::nullopt);  // unset: the caller's default
  Fields off;
  ASSERT_TRUE(Parse(off, {"--vectors", "--vectors=false"}).ok());
  EXPECT_EQ(off.vectors, absl::optional<bool>(false));
}

TEST(FlagSet, RefusalsNameTheArgument) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nprobe", "3"}, "unknown flag --nprobe"},
      {{"--"}, "unknown flag --"},
      {{"--input"}, "--input needs a value (FILE)"},
      {{"--k", "ten"}, "--k=ten is not a 32-bit integer"},
      {{"--k", "3000000000"}, "--k=3000000000 is not a 32-bit integer"},
      {{"--seed=-1"}, "--seed=-1 is not an unsigned 32-bit integer"},
      {{"--recall", "high"}, "--recall=high is not a number"},
      {{"--pin", "x"}, "--pin=x is not a 64-bit integer"},
      {{"--keep=maybe"}, "--keep=maybe is not true or false"},
      {{"--vectors=2"}, "--vectors=2 is not true or false"},
      {{"build"}, "unexpected argument 'build'"},
  };
  for (const auto& [args, message] : cases) {
    Fields f;
    absl::Status s = Parse(f, args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
  }
}

TEST(FlagSet, HelpListsFlagsInOrderWithDefaultsAndSections) {
  Fields f;
  const std::string help = f.Define().Help();
  EXPECT_EQ(help.find("flags:\n  --input FILE  (default in.npy)\n"
                      "      Vectors to read.\n  --k N  (default 10)\n"),
            0u)
      << help;
  EXPECT_THAT(help, HasSubstr("  --pin N\n      Version to pin.\n"));
  EXPECT_THAT(help, HasSubstr("  --keep\n      Keep the vectors.\n"));
  EXPECT_THAT(help, HasSubstr("  --vectors\n      Write vectors; default: "
                              "no --ids.\n"));
  EXPECT_THAT(help, HasSubstr("\n\nconnection flags:\n  --addr HOST:PORT  "
                              "(default localhost:50051)\n"));
}

TEST(FlagSet, HelpWrapsLongTextAtSeventyEightColumns) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "word ";
  std::string value;
  FlagSet flags;
  flags.Add("long", &value, "X", text.c_str());
  for (absl::string_view line : absl::StrSplit(flags.Help(), '\n')) {
    EXPECT_LE(line.size(), 78u) << line;
  }
}

}  // namespace
}  // namespace knnd::knnctl
