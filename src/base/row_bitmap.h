// RowBitmap: a set of rows of one index (0 <= row < size()), one bit each:
// what an attribute filter compiles to (index/attribute_filter.h), tested
// per candidate by the searches (faiss/id_filter.h) in O(1).
//
// Thread-safety: a plain value; const methods are safe from any number of
// threads, mutation needs exclusive access. Ownership: owns its words.
#ifndef KNND_BASE_ROW_BITMAP_H_
#define KNND_BASE_ROW_BITMAP_H_

#include <cstdint>
#include <vector>

namespace knnd {

class RowBitmap {
 public:
  // `rows` rows, none set (or all of them with `all`).
  explicit RowBitmap(int64_t rows, bool all = false)
      : rows_(rows), words_(WordsFor(rows), all ? ~uint64_t{0} : 0) {
    if (all) ClearTail();
  }

  static int64_t WordsFor(int64_t rows) { return (rows + 63) / 64; }

  int64_t size() const { return rows_; }
  // Heap bytes of the bits (what a request's filter costs).
  int64_t bytes() const {
    return static_cast<int64_t>(words_.size() * sizeof(uint64_t));
  }
  const uint64_t* words() const { return words_.data(); }

  // False for a row outside [0, size()).
  bool Test(int64_t row) const {
    if (row < 0 || row >= rows_) return false;
    return (words_[static_cast<size_t>(row >> 6)] >> (row & 63)) & 1;
  }
  void Set(int64_t row) {
    words_[static_cast<size_t>(row >> 6)] |= uint64_t{1} << (row & 63);
  }
  // Sets the rows of a bitmap of the same size given as raw words (a mapped
  // presence bitmap); bits past size() are ignored.
  void OrWords(const uint64_t* words) {
    for (size_t i = 0; i < words_.size(); ++i) words_[i] |= words[i];
    ClearTail();
  }

  void And(const RowBitmap& other) {
    for (size_t i = 0; i < words_.size(); ++i) words_[i] &= other.words_[i];
  }
  void Or(const RowBitmap& other) {
    for (size_t i = 0; i < words_.size(); ++i) words_[i] |= other.words_[i];
  }
  void Invert() {
    for (uint64_t& w : words_) w = ~w;
    ClearTail();
  }

  // Sets the rows of a bitmap of the same size given as raw words (a
  // mapped presence bitmap) that `except` does not hold.
  void OrWordsExcept(const uint64_t* words, const RowBitmap& except) {
    for (size_t i = 0; i < words_.size(); ++i) {
      words_[i] |= words[i] & ~except.words_[i];
    }
    ClearTail();
  }

  // Number of rows set.
  int64_t Count() const { return CountWords(words_.data(), rows_); }
  // Number of bits set in a bitmap of `rows` rows given as raw words (a
  // mapped presence bitmap, whose bits past `rows` are zero).
  static int64_t CountWords(const uint64_t* words, int64_t rows) {
#if defined(__x86_64__) && defined(__GNUC__)
    // Built for baseline x86-64, __builtin_popcountll is a call into
    // libgcc per word: counting a 1M-row filter that way took ~10% of a
    // filtered search's CPU, counted three times per request
    // (bench/RESULTS.md "Filters"). The POPCNT instruction where the CPU
    // has it (every x86-64 CPU since 2008).
    static const bool has_popcnt = __builtin_cpu_supports("popcnt");
    if (has_popcnt) return CountWordsPopcnt(words, WordsFor(rows));
#endif
    int64_t n = 0;
    for (int64_t i = 0; i < WordsFor(rows); ++i) {
      n += __builtin_popcountll(words[i]);
    }
    return n;
  }
  // The rows set, ascending, each plus `offset`.
  std::vector<int64_t> Rows(int64_t offset = 0) const {
    std::vector<int64_t> rows;
    rows.reserve(static_cast<size_t>(Count()));
    for (size_t i = 0; i < words_.size(); ++i) {
      for (uint64_t w = words_[i]; w != 0; w &= w - 1) {
        rows.push_back(static_cast<int64_t>(i * 64) + __builtin_ctzll(w) +
                       offset);
      }
    }
    return rows;
  }

  friend bool operator==(const RowBitmap& a, const RowBitmap& b) {
    return a.rows_ == b.rows_ && a.words_ == b.words_;
  }

 private:
#if defined(__x86_64__) && defined(__GNUC__)
  __attribute__((target("popcnt"))) static int64_t CountWordsPopcnt(
      const uint64_t* words, int64_t num_words) {
    int64_t n = 0;
    for (int64_t i = 0; i < num_words; ++i) n += __builtin_popcountll(words[i]);
    return n;
  }
#endif

  void ClearTail() {
    if (rows_ % 64 != 0) words_.back() &= (uint64_t{1} << (rows_ % 64)) - 1;
  }

  int64_t rows_;
  std::vector<uint64_t> words_;
};

}  // namespace knnd

#endif  // KNND_BASE_ROW_BITMAP_H_
