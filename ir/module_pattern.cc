#include "ir/module_pattern.h"

#include <algorithm>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "ir/names.h"

namespace tracecut::ir {

ModulePattern::ModulePattern(absl::string_view text) : text_(text) {
  if (absl::StartsWith(text, kModulePatternRegexPrefix)) {
    kind_ = Kind::kRegex;
    std::string body(text.substr(kModulePatternRegexPrefix.size()));
    try {
      regex_ = std::make_shared<const std::regex>(body, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      error_ = e.what();
    }
    return;
  }
  if (text.find_first_of("*?") == absl::string_view::npos) return;
  kind_ = Kind::kGlob;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '*') {
      if (i + 1 < text.size() && text[i + 1] == '*') {
        glob_.push_back({Token::kDoubleStar, 0});
        while (i + 1 < text.size() && text[i + 1] == '*') ++i;
      } else {
        glob_.push_back({Token::kStar, 0});
      }
    } else if (text[i] == '?') {
      glob_.push_back({Token::kQuestion, 0});
    } else {
      glob_.push_back({Token::kChar, text[i]});
    }
  }
}

// Dynamic programming over pattern tokens: O(|pattern| * |s|), whatever the
// stars (a backtracking glob is exponential in them).
bool ModulePattern::Match(absl::string_view s, bool star_spans_dots) const {
  const size_t n = s.size();
  // prev[j]: the tokens so far match s[0, j).
  std::vector<char> prev(n + 1, 0), cur(n + 1, 0);
  prev[0] = 1;
  for (const auto& [token, c] : glob_) {
    std::fill(cur.begin(), cur.end(), 0);
    switch (token) {
      case Token::kChar:
        for (size_t j = 1; j <= n; ++j) cur[j] = prev[j - 1] && s[j - 1] == c;
        break;
      case Token::kQuestion:
        for (size_t j = 1; j <= n; ++j) {
          cur[j] = prev[j - 1] && s[j - 1] != kModulePathSeparator;
        }
        break;
      case Token::kStar:
        cur[0] = prev[0];
        for (size_t j = 1; j <= n; ++j) {
          cur[j] = prev[j] ||
                   (cur[j - 1] &&
                    (star_spans_dots || s[j - 1] != kModulePathSeparator));
        }
        break;
      case Token::kDoubleStar:
        cur[0] = prev[0];
        for (size_t j = 1; j <= n; ++j) cur[j] = prev[j] || cur[j - 1];
        break;
    }
    std::swap(prev, cur);
  }
  return prev[n];
}

bool ModulePattern::MatchesPath(absl::string_view path) const {
  switch (kind_) {
    case Kind::kExact:
      return path == text_;
    case Kind::kGlob:
      return Match(path, /*star_spans_dots=*/false);
    case Kind::kRegex:
      return regex_ != nullptr &&
             std::regex_match(path.begin(), path.end(), *regex_);
  }
  return false;
}

bool ModulePattern::MatchesType(absl::string_view type) const {
  if (type.empty()) return false;
  const std::string short_type = Scope::ShortType(type);
  switch (kind_) {
    case Kind::kExact:
      return type == text_ || short_type == text_;
    case Kind::kGlob:
      return Match(type, /*star_spans_dots=*/true) ||
             Match(short_type, /*star_spans_dots=*/true);
    case Kind::kRegex: {
      if (regex_ == nullptr) return false;
      auto full = [&](absl::string_view s) {
        return std::regex_match(s.begin(), s.end(), *regex_);
      };
      return full(type) || full(short_type);
    }
  }
  return false;
}

}  // namespace tracecut::ir
