#ifndef TRACECUT_IR_MODULE_PATTERN_H_
#define TRACECUT_IR_MODULE_PATTERN_H_

// A pattern naming modules by path or type: what --leaf, --targets and
// --ignore take (tracer::LeafPolicy, partition::PartitionOptions), one
// syntax for all of them.
//
//   ModulePattern p("model.layers.*");
//   p.Matches("model.layers.3", "transformers...LlamaDecoderLayer");  // true
//   ModulePattern("LlamaRMSNorm").MatchesType("a.b.LlamaRMSNorm");     // true
//
// Syntax:
//   "LlamaDecoderLayer"                 short type (after the last '.')
//   "transformers.models.llama.modeling_llama.LlamaDecoderLayer"
//                                       qualified (demangled) type
//   "model.layers.3"                    module path
//   "model.layers.*", "*DecoderLayer"   glob, when the text holds '*' or '?':
//                                       on a path, '*' and '?' stay within
//                                       a segment and '**' spans segments;
//                                       on a type, '*' spans '.' too (the
//                                       dots of a qualified type are Python
//                                       packages, not module nesting); '?'
//                                       is one byte other than '.'
//   "re:.*layers\.[0-9]+"               ECMAScript regex, full match
//
// Path segments are whatever PyTorch allows (ir/names.h), so
// "trunk_output.*.block1-*" matches torchvision's RegNet blocks, and a name
// holding '*' or '?' matches itself. A type pattern matches the qualified
// type or its short name; an empty (unknown) type matches nothing.

#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace tracecut::ir {

// The prefix that makes a pattern an ECMAScript regex.
inline constexpr absl::string_view kModulePatternRegexPrefix = "re:";

class ModulePattern {
 public:
  enum class Kind { kExact, kGlob, kRegex };

  // Never fails: a "re:" pattern whose regex does not compile matches
  // nothing, and error() says why (callers that take user input report it).
  explicit ModulePattern(absl::string_view text);

  const std::string& text() const { return text_; }
  Kind kind() const { return kind_; }
  // False for a "re:" pattern whose regex does not compile; error() says
  // why.
  bool valid() const { return kind_ != Kind::kRegex || regex_ != nullptr; }
  const std::string& error() const { return error_; }

  // Matches a dotted module path ("" is the root module).
  bool MatchesPath(absl::string_view path) const;
  // Matches a qualified type or its short name; never an empty type.
  bool MatchesType(absl::string_view type) const;
  // Either: how --targets and --ignore match a module.
  bool Matches(absl::string_view path, absl::string_view type) const {
    return MatchesPath(path) || MatchesType(type);
  }

 private:
  enum class Token { kChar, kStar, kDoubleStar, kQuestion };

  bool Match(absl::string_view s, bool star_spans_dots) const;

  std::string text_;
  Kind kind_ = Kind::kExact;
  std::vector<std::pair<Token, char>> glob_;
  std::shared_ptr<const std::regex> regex_;  // Null if it did not compile.
  std::string error_;
};

}  // namespace tracecut::ir

#endif  // TRACECUT_IR_MODULE_PATTERN_H_
