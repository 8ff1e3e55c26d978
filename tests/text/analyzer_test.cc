#include "knnd/text/analyzer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Terms(absl::string_view text,
                               const std::string& stemmer = "") {
  AnalyzerOptions options;
  options.stemmer = stemmer;
  absl::StatusOr<std::unique_ptr<Analyzer>> analyzer =
      Analyzer::Create(options);
  EXPECT_TRUE(analyzer.ok()) << analyzer.status();
  return (*analyzer)->Tokenize(text);
}

TEST(Analyzer, FoldsCaseAndWidthTogether) {
  EXPECT_THAT(Terms("ＡＢＣ Abc abc ǅ"),
              ElementsAre("abc", "abc", "abc", "dž"));
}

TEST(Analyzer, DropsSpacesAndPunctuationKeepsNumbers) {
  EXPECT_THAT(Terms("  IPv6, 2024 -- (v2.1)!  "),
              ElementsAre("ipv6", "2024", "v2.1"));
}

TEST(Analyzer, ChineseRunBecomesUnigramsAndBigrams) {
  EXPECT_THAT(Terms("服务器配置"), ElementsAre("服", "服务", "务", "务器", "器",
                                               "器配", "配", "配置", "置"));
}

TEST(Analyzer, KoreanWordsBecomeSyllableGramsWithinTheirSpaces) {
  EXPECT_THAT(Terms("파일을 열기"), ElementsAre("파", "파일", "일", "일을",
                                                "을", "열", "열기", "기"));
}

TEST(Analyzer, JapaneseKanaAndKanjiFormOneRun) {
  EXPECT_THAT(Terms("保存する"),
              ElementsAre("保", "保存", "存", "存す", "す", "する", "る"));
}

TEST(Analyzer, PunctuationAndLatinWordsEndACjkRun) {
  EXPECT_THAT(Terms("中文，韩文"),
              ElementsAre("中", "中文", "文", "韩", "韩文", "文"));
  EXPECT_THAT(Terms("使用LibreOffice的Writer"),
              ElementsAre("使", "使用", "用", "libreoffice", "的", "writer"));
}

TEST(Analyzer, FullWidthDigitsAndCompatibilityIdeographsFold) {
  // Ｗｉｎ１０ is Win10; U+F900 (a compatibility ideograph) is U+8C48.
  EXPECT_THAT(Terms("Ｗｉｎ１０ \uF900"), ElementsAre("win10", "\u8C48"));
}

TEST(Analyzer, StemsLettersWhenAskedNotNumbers) {
  EXPECT_THAT(Terms("Running files 2024s", "english"),
              ElementsAre("run", "file", "2024s"));
  EXPECT_THAT(Terms("Running files"), ElementsAre("running", "files"));
}

TEST(Analyzer, RefusesAnUnknownStemmerNamingTheKnownOnes) {
  AnalyzerOptions options;
  options.stemmer = "klingon";
  absl::StatusOr<std::unique_ptr<Analyzer>> analyzer =
      Analyzer::Create(options);
  ASSERT_FALSE(analyzer.ok());
  EXPECT_EQ(analyzer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(analyzer.status().message(), HasSubstr("klingon"));
  EXPECT_THAT(analyzer.status().message(), HasSubstr("english"));
}

TEST(Analyzer, DropsTermsLongerThanTheLimit) {
  const std::string blob(kMaxTermBytes + 1, 'a');
  EXPECT_THAT(Terms("short " + blob + " tail"), ElementsAre("short", "tail"));
  EXPECT_THAT(Terms(std::string(kMaxTermBytes, 'b')).size(), 1u);
}

TEST(Analyzer, InvalidUtf8NeverCrashesAndKeepsTheValidWords) {
  EXPECT_THAT(Terms("good \xff\xfe bad\xc3"), ElementsAre("good", "bad"));
  EXPECT_TRUE(Terms("").empty());
}

TEST(Analyzer, DescribesItsSteps) {
  AnalyzerOptions options;
  options.stemmer = "english";
  absl::StatusOr<std::unique_ptr<Analyzer>> analyzer =
      Analyzer::Create(options);
  ASSERT_TRUE(analyzer.ok());
  EXPECT_EQ((*analyzer)->Describe(),
            "icu nfkc_cf words, cjk 1+2-grams, snowball english");
}

}  // namespace
}  // namespace knnd
