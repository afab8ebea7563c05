#include "tools/cli/flags.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tracecut::cli {
namespace {

constexpr absl::string_view kUsagePayload = "tracecut/usage-error";

// The result CLI11 records for a boolean flag given without a value (its
// default flag value, "--json{...}"): `--json=true` records "true", refused
// like any other value.
constexpr absl::string_view kFlagSet = "\x01";

// Single-valued options keep every occurrence too (TakeLast: CLI11 does not
// throw) so that ParseArgs can say "given more than once" itself; repeated
// ones are TakeAll, which is also how the help knows them.
CLI::MultiOptionPolicy PolicyOf(const FlagSpec& f) {
  return f.repeated ? CLI::MultiOptionPolicy::TakeAll
                    : CLI::MultiOptionPolicy::TakeLast;
}

// "-o, --output=FILE".
std::string Label(const CLI::Option& o) {
  std::string label;
  for (const std::string& s : o.get_snames())
    absl::StrAppend(&label, "-", s, ", ");
  for (const std::string& l : o.get_lnames()) absl::StrAppend(&label, "--", l);
  if (o.get_expected_max() > 0) absl::StrAppend(&label, "=", o.get_type_name());
  return label;
}

// Today's `tracecut <command> --help` layout over CLI11's options: usage
// line, summary (the app's description), description (its footer), then one
// aligned line per flag.
class HelpFormatter : public CLI::FormatterBase {
 public:
  explicit HelpFormatter(std::string synopsis)
      : synopsis_(std::move(synopsis)) {}

  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode /*mode*/) const override {
    std::string out = absl::StrCat("usage: ", name, " ", synopsis_, "\n\n",
                                   app->get_description(), "\n");
    if (std::string footer = app->get_footer(); !footer.empty()) {
      absl::StrAppend(&out, "\n", footer, "\n");
    }
    std::vector<const CLI::Option*> options = app->get_options(
        [](const CLI::Option* o) { return !o->get_positional(); });
    size_t width = 0;
    for (const CLI::Option* o : options) {
      width = std::max(width, Label(*o).size());
    }
    absl::StrAppend(&out, "\nflags:\n");
    for (const CLI::Option* o : options) {
      const std::string label = Label(*o);
      const bool repeatable =
          o->get_multi_option_policy() == CLI::MultiOptionPolicy::TakeAll;
      absl::StrAppend(
          &out, "  ", label, std::string(width - label.size() + 2, ' '),
          o->get_description(), repeatable ? " (repeatable)" : "", "\n");
    }
    return out;
  }

 private:
  std::string synopsis_;
};

// A CLI11 app for `flags`: options in declaration order, positionals into
// `positional`, unknown flags left in remaining() (reported by ParseArgs, in
// its words), no built-in --help (commands declare their own).
std::unique_ptr<CLI::App> MakeApp(const std::vector<FlagSpec>& flags,
                                  std::vector<std::string>* positional) {
  auto app = std::make_unique<CLI::App>();
  app->set_help_flag();
  app->allow_extras();
  for (const FlagSpec& f : flags) {
    // "-o,--output"; a boolean flag's names carry their default value:
    // "-h{\x01},--help{\x01}".
    const std::string set =
        f.value_name.empty() ? absl::StrCat("{", kFlagSet, "}") : "";
    std::string names = absl::StrCat("--", f.name, set);
    if (f.short_name != 0) {
      names = absl::StrCat("-", std::string(1, f.short_name), set, ",", names);
    }
    if (f.value_name.empty()) {
      app->add_flag(names, f.help)->multi_option_policy(PolicyOf(f));
    } else {
      app->add_option(names, f.help)
          ->type_name(f.value_name)
          ->multi_option_policy(PolicyOf(f));
    }
  }
  app->add_option("args", *positional);
  return app;
}

// How the user wrote the flag in `arg`: "--name" (without "=value") or "-o".
std::string Shown(absl::string_view arg) {
  if (absl::StartsWith(arg, "--"))
    return std::string(arg.substr(0, arg.find('=')));
  return std::string(arg.substr(0, 2));
}

// The flag that `shown` ("--name" or "-o") names, if any.
const FlagSpec* FindFlag(const std::vector<FlagSpec>& flags,
                         absl::string_view shown) {
  for (const FlagSpec& f : flags) {
    if (shown == absl::StrCat("--", f.name) ||
        (f.short_name != 0 &&
         shown == absl::StrCat("-", std::string(1, f.short_name)))) {
      return &f;
    }
  }
  return nullptr;
}

}  // namespace

FlagSpec FlagSpec::Value(std::string name, std::string value_name,
                         std::string help) {
  FlagSpec f;
  f.name = std::move(name);
  f.value_name = std::move(value_name);
  f.help = std::move(help);
  return f;
}

FlagSpec FlagSpec::Bool(std::string name, std::string help) {
  FlagSpec f;
  f.name = std::move(name);
  f.help = std::move(help);
  return f;
}

bool ParsedArgs::Has(absl::string_view flag) const {
  return values_.find(flag) != values_.end();
}

std::optional<std::string> ParsedArgs::Get(absl::string_view flag) const {
  auto it = values_.find(flag);
  if (it == values_.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> ParsedArgs::GetAll(absl::string_view flag) const {
  auto it = values_.find(flag);
  return it == values_.end() ? std::vector<std::string>() : it->second;
}

absl::Status UsageError(absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kUsagePayload, absl::Cord("1"));
  return s;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::vector<FlagSpec>& flags) {
  ParsedArgs parsed;
  std::unique_ptr<CLI::App> app = MakeApp(flags, &parsed.positional_);
  // CLI11 reads `--name=` as `--name` and takes the next argument as its
  // value; keep the empty value (refused below, like `--name ""`).
  std::vector<std::string> cli_args;
  bool flags_done = false;
  for (const std::string& a : args) {
    if (a == "--") flags_done = true;
    const FlagSpec* f = nullptr;
    if (!flags_done && absl::StartsWith(a, "--") &&
        a.find('=') == a.size() - 1) {
      f = FindFlag(flags, Shown(a));
    }
    if (f == nullptr) {
      cli_args.push_back(a);
    } else if (f->value_name.empty()) {
      return UsageError(absl::StrCat(Shown(a), " takes no value"));
    } else {
      cli_args.push_back(Shown(a));
      cli_args.emplace_back();
    }
  }
  std::reverse(cli_args.begin(), cli_args.end());  // CLI11 pops from the back.
  try {
    app->parse(cli_args);
  } catch (const CLI::ArgumentMismatch& e) {
    // Only the last argument can run out of values: "... -o".
    const std::string shown = args.empty() ? "" : Shown(args.back());
    if (const FlagSpec* f = FindFlag(flags, shown)) {
      return UsageError(
          absl::StrCat(shown, " needs a value (", f->value_name, ")"));
    }
    return UsageError(e.what());
  } catch (const CLI::ParseError& e) {
    return UsageError(e.what());
  }
  // remaining() also holds the "--" that ended the flags.
  for (const std::string& unknown : app->remaining()) {
    if (unknown != "--") {
      return UsageError(absl::StrCat("unknown flag ", Shown(unknown)));
    }
  }
  for (const FlagSpec& f : flags) {
    const CLI::Option* o = app->get_option(absl::StrCat("--", f.name));
    if (o->count() == 0) continue;
    const std::string shown = absl::StrCat("--", f.name);
    if (o->count() > 1 && !f.repeated) {
      return UsageError(absl::StrCat(shown, " given more than once"));
    }
    std::vector<std::string>& values = parsed.values_[f.name];
    for (const std::string& v : o->results()) {
      if (f.value_name.empty()) {
        if (v != kFlagSet) {
          return UsageError(absl::StrCat(shown, " takes no value"));
        }
        values.emplace_back();
        continue;
      }
      if (v.empty()) {
        return UsageError(absl::StrCat(shown, " needs a non-empty value (",
                                       f.value_name, ")"));
      }
      values.push_back(v);
    }
  }
  return parsed;
}

std::string FlagsHelp(absl::string_view command, absl::string_view synopsis,
                      absl::string_view summary, absl::string_view description,
                      const std::vector<FlagSpec>& flags) {
  std::vector<std::string> positional;
  std::unique_ptr<CLI::App> app = MakeApp(flags, &positional);
  app->name(std::string(command));
  app->description(std::string(summary));
  app->footer(std::string(description));
  app->formatter(std::make_shared<HelpFormatter>(std::string(synopsis)));
  return app->help("tracecut");
}

}  // namespace tracecut::cli
