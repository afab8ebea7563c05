#include "pipelines/recipe.h"

#include <c10/core/Device.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "modifiers/recipe_config.h"
#include "modifiers/registry.h"
#include "pipelines/recipe.pb.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::RecipeChecker;
namespace {

using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::TextFormat;

// Keeps the first parse error, with 1-based line and column.
//
// The parser reports an unknown field name or enum value at the token after
// it (possibly on a later line); such errors are moved back to the start of
// the offending name, which is what a user needs to see.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  FirstErrorCollector(absl::string_view source, absl::string_view text)
      : source_(source), lines_(absl::StrSplit(text, '\n')) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!error_.empty()) return;
    if (line < 0) {
      error_ = absl::StrCat(source_, ": ", message);
      return;
    }
    BackUpToName(message, line, column);
    error_ =
        absl::StrCat(source_, ":", line + 1, ":", column + 1, ": ", message);
  }

  const std::string& error() const { return error_; }

 private:
  void BackUpToName(absl::string_view message, int& line, int& column) const {
    static constexpr absl::string_view kPrefixes[] = {
        "has no field named \"", "Unknown enumeration value of \""};
    for (absl::string_view prefix : kPrefixes) {
      size_t start = message.find(prefix);
      if (start == absl::string_view::npos) continue;
      start += prefix.size();
      size_t end = message.find('"', start);
      if (end == absl::string_view::npos) return;
      absl::string_view name = message.substr(start, end - start);
      // The last occurrence of `name` before the reported position.
      for (int l = std::min<int>(line, static_cast<int>(lines_.size()) - 1);
           l >= 0; --l) {
        absl::string_view text = lines_[l];
        if (l == line) text = text.substr(0, std::max(column, 0));
        size_t at = text.rfind(name);
        if (at != absl::string_view::npos) {
          line = l;
          column = static_cast<int>(at);
          return;
        }
      }
      return;
    }
  }

  std::string source_;
  std::vector<absl::string_view> lines_;
  std::string error_;
};

absl::Status CheckCache(const RecipeChecker& c,
                        const recipe::IntermediatesCacheConfig& m) {
  try {
    c10::Device device(m.offload_device());
    (void)device;
  } catch (const c10::Error&) {
    return c.Error(
        "offload_device",
        absl::StrCat("is not a device (\"cpu\", \"cuda:0\", ...): \"",
                     m.offload_device(), "\""));
  }
  if (m.memory_budget_bytes() < -1) {
    return c.Error("memory_budget_bytes",
                   absl::StrCat("must be >= 0 or -1 (unlimited), got ",
                                m.memory_budget_bytes()));
  }
  return absl::OkStatus();
}

absl::Status Check(const recipe::Recipe& r, const RecipeChecker& c) {
  if (r.modifiers().empty()) {
    return c.MessageError("has no modifiers");
  }
  modifiers::RecipeContext context = ContextOf(r);
  for (int i = 0; i < r.modifiers_size(); ++i) {
    RecipeChecker mc = c.Element("modifiers", i, r.modifiers(i));
    const FieldDescriptor* field = EntryField(r.modifiers(i));
    if (field == nullptr) {
      return mc.MessageError(
          absl::StrCat("names no modifier (", EntryNames(), ")"));
    }
    context.index = i;
    const Message& entry = *context.entries[i];
    const modifiers::ModifierType* type =
        modifiers::FindModifierType(entry.GetDescriptor());
    if (type == nullptr) {
      return mc.Error(field->name(),
                      absl::StrCat("no modifier is registered for ",
                                   entry.GetDescriptor()->full_name()));
    }
    if (type->validate != nullptr) {
      RETURN_IF_ERROR(
          type->validate(entry, mc.Nested(field->name(), entry), context));
    }
  }
  if (r.pipeline() == recipe::Recipe::PIPELINE_UNSPECIFIED) {
    return c.Error("pipeline", "must be SEQUENTIAL, LAYER_SEQUENTIAL or BASIC");
  }
  for (int i = 0; i < r.sequential_targets_size(); ++i) {
    if (r.sequential_targets(i).empty()) {
      return c.Error("sequential_targets", "is empty", i);
    }
  }
  if (r.has_cache()) {
    RETURN_IF_ERROR(CheckCache(c.Nested("cache", r.cache()), r.cache()));
  }
  return absl::OkStatus();
}

}  // namespace

const FieldDescriptor* EntryField(const recipe::Modifier& m) {
  const google::protobuf::OneofDescriptor* kind =
      recipe::Modifier::descriptor()->FindOneofByName("kind");
  return m.GetReflection()->GetOneofFieldDescriptor(m, kind);
}

std::string EntryNames() {
  const google::protobuf::OneofDescriptor* kind =
      recipe::Modifier::descriptor()->FindOneofByName("kind");
  std::vector<std::string> names;
  for (int i = 0; i < kind->field_count(); ++i) {
    names.push_back(kind->field(i)->name());
  }
  std::sort(names.begin(), names.end());
  const std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

modifiers::RecipeContext ContextOf(const recipe::Recipe& r) {
  modifiers::RecipeContext context;
  context.all_expert_tokens = r.calibrate_all_experts();
  for (const recipe::Modifier& m : r.modifiers()) {
    const FieldDescriptor* field = EntryField(m);
    // An entry with no modifier set stands for itself; Check refuses it.
    context.entries.push_back(
        field == nullptr ? &m : &m.GetReflection()->GetMessage(m, field));
  }
  return context;
}

absl::StatusOr<recipe::Recipe> ParseRecipe(absl::string_view text,
                                           absl::string_view source) {
  recipe::Recipe r;
  FirstErrorCollector errors(source, text);
  TextFormat::ParseInfoTree tree;
  TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(std::string(text), &r)) {
    return absl::InvalidArgumentError(
        errors.error().empty() ? absl::StrCat(source, ": cannot parse recipe")
                               : errors.error());
  }
  RETURN_IF_ERROR(Check(r, RecipeChecker(source, r, &tree, "", "")));
  return r;
}

absl::StatusOr<recipe::Recipe> LoadRecipe(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read recipe ", path));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("error reading recipe ", path));
  }
  return ParseRecipe(text.str(), path);
}

absl::Status ValidateRecipe(const recipe::Recipe& recipe,
                            absl::string_view source) {
  return Check(recipe, RecipeChecker(source, recipe, nullptr, "", ""));
}

}  // namespace tracecut::pipelines
