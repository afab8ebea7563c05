#include "tools/cli/common.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/torch_status.h"

namespace tracecut::cli {
namespace {

constexpr absl::string_view kUsagePayload = "tracecut/usage-error";
constexpr absl::string_view kExitCodePayload = "tracecut/exit-code";

std::vector<Subcommand>& Registry() {
  static auto* registry = new std::vector<Subcommand>();
  return *registry;
}

const FlagSpec* FindLong(const std::vector<FlagSpec>& flags,
                         absl::string_view name) {
  for (const FlagSpec& f : flags) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const FlagSpec* FindShort(const std::vector<FlagSpec>& flags, char name) {
  for (const FlagSpec& f : flags) {
    if (f.short_name != 0 && f.short_name == name) return &f;
  }
  return nullptr;
}

std::string ToolHelp() {
  std::string out =
      "usage: tracecut <subcommand> [arguments]\n\n"
      "Traces TorchScript models into tracecut's FX-style graph IR and works "
      "on them.\n\nsubcommands:\n";
  size_t width = 0;
  for (const Subcommand* c : Subcommands()) {
    width = std::max(width, c->name.size());
  }
  for (const Subcommand* c : Subcommands()) {
    absl::StrAppend(&out, "  ", c->name,
                    std::string(width - c->name.size() + 2, ' '), c->summary,
                    "\n");
  }
  absl::StrAppend(&out,
                  "\nRun 'tracecut <subcommand> --help' for a subcommand's "
                  "arguments.\n");
  return out;
}

std::string FlagLabel(const FlagSpec& f) {
  std::string label;
  if (f.short_name != 0)
    absl::StrAppend(&label, "-", std::string(1, f.short_name), ", ");
  absl::StrAppend(&label, "--", f.name);
  if (!f.value_name.empty()) absl::StrAppend(&label, "=", f.value_name);
  return label;
}

// Outputs are written to a temporary file renamed over the path: over a
// device or FIFO (e.g. -o /dev/null or /dev/full, as root) that would
// replace the node itself with a regular file.
absl::Status CheckNotSpecialFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) &&
      !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot write '", path,
        "': it exists and is not a regular file (a device, FIFO or socket)"));
  }
  return absl::OkStatus();
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
  auto add = [&](const FlagSpec& f, std::string value) -> absl::Status {
    std::vector<std::string>& values = parsed.values_[f.name];
    if (!values.empty() && !f.repeated) {
      return UsageError(absl::StrCat("--", f.name, " given more than once"));
    }
    values.push_back(std::move(value));
    return absl::OkStatus();
  };
  bool flags_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (flags_done || a == "-" || !absl::StartsWith(a, "-")) {
      parsed.positional_.push_back(a);
      continue;
    }
    if (a == "--") {
      flags_done = true;
      continue;
    }
    const FlagSpec* f = nullptr;
    std::optional<std::string> inline_value;
    std::string shown;
    if (absl::StartsWith(a, "--")) {
      absl::string_view body = absl::string_view(a).substr(2);
      size_t eq = body.find('=');
      absl::string_view name = body.substr(0, eq);
      if (eq != absl::string_view::npos) {
        inline_value = std::string(body.substr(eq + 1));
      }
      f = FindLong(flags, name);
      shown = absl::StrCat("--", name);
    } else {
      f = FindShort(flags, a[1]);
      if (a.size() > 2) inline_value = a.substr(2);
      shown = a.substr(0, 2);
    }
    if (f == nullptr) {
      return UsageError(absl::StrCat("unknown flag ", shown));
    }
    if (f->value_name.empty()) {
      if (inline_value.has_value()) {
        return UsageError(absl::StrCat(shown, " takes no value"));
      }
      absl::Status s = add(*f, "");
      if (!s.ok()) return s;
      continue;
    }
    std::string value;
    if (inline_value.has_value()) {
      value = *inline_value;
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return UsageError(
          absl::StrCat(shown, " needs a value (", f->value_name, ")"));
    }
    if (value.empty()) {
      return UsageError(absl::StrCat(shown, " needs a non-empty value (",
                                     f->value_name, ")"));
    }
    absl::Status s = add(*f, std::move(value));
    if (!s.ok()) return s;
  }
  return parsed;
}

bool RegisterSubcommand(Subcommand command) {
  Registry().push_back(std::move(command));
  return true;
}

std::vector<const Subcommand*> Subcommands() {
  std::vector<const Subcommand*> out;
  for (const Subcommand& c : Registry()) out.push_back(&c);
  std::sort(out.begin(), out.end(),
            [](const Subcommand* a, const Subcommand* b) {
              return a->name < b->name;
            });
  return out;
}

std::string SubcommandHelp(const Subcommand& command) {
  std::string out =
      absl::StrCat("usage: tracecut ", command.name, " ", command.synopsis,
                   "\n\n", command.summary, "\n");
  if (!command.description.empty()) {
    absl::StrAppend(&out, "\n", command.description, "\n");
  }
  std::vector<FlagSpec> flags = command.flags;
  flags.push_back(FlagSpec::Bool("help", "show this help").Short('h'));
  size_t width = 0;
  for (const FlagSpec& f : flags) width = std::max(width, FlagLabel(f).size());
  absl::StrAppend(&out, "\nflags:\n");
  for (const FlagSpec& f : flags) {
    std::string label = FlagLabel(f);
    absl::StrAppend(&out, "  ", label,
                    std::string(width - label.size() + 2, ' '), f.help,
                    f.repeated ? " (repeatable)" : "", "\n");
  }
  return out;
}

// The values of input-file flags (FlagSpec::InputFile) that are
// directories: reading one would fail with a misleading message (an empty
// recipe "has no modifiers") or an exception.
absl::Status CheckInputFiles(const ParsedArgs& args,
                             const std::vector<FlagSpec>& flags) {
  for (const FlagSpec& f : flags) {
    if (!f.input_file) continue;
    for (const std::string& value : args.GetAll(f.name)) {
      std::error_code ec;
      if (std::filesystem::is_directory(value, ec)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", f.name, ": '", value, "' is a directory"));
      }
    }
  }
  return absl::OkStatus();
}

int Main(const std::vector<std::string>& argv, Io& io) {
  if (argv.size() < 2) {
    io.err << "tracecut: missing subcommand (run 'tracecut --help')\n";
    return 2;
  }
  const std::string& name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    io.out << ToolHelp();
    return 0;
  }
  const Subcommand* command = nullptr;
  for (const Subcommand* c : Subcommands()) {
    if (c->name == name) command = c;
  }
  if (command == nullptr) {
    io.err << "tracecut: unknown subcommand '" << name
           << "' (run 'tracecut --help')\n";
    return 2;
  }
  std::vector<std::string> args(argv.begin() + 2, argv.end());
  std::vector<FlagSpec> flags = command->flags;
  flags.push_back(FlagSpec::Bool("help", "show this help").Short('h'));
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, flags);
  absl::Status status;
  if (!parsed.ok()) {
    status = parsed.status();
  } else if (parsed->Has("help")) {
    io.out << SubcommandHelp(*command);
    return 0;
  } else {
    const int n = static_cast<int>(parsed->positional().size());
    if (n < command->min_positional) {
      status =
          UsageError(absl::StrCat("missing argument: ", command->synopsis));
    } else if (command->max_positional >= 0 && n > command->max_positional) {
      status = UsageError(
          absl::StrCat("unexpected argument '",
                       parsed->positional()[command->max_positional], "'"));
    } else {
      status = CheckInputFiles(*parsed, flags);
      // The last boundary: an exception that got this far (an allocation
      // failure outside the components' own boundaries) is an error, not
      // an abort; unwinding runs the commands' cleanups.
      if (status.ok()) {
        status = runtime::TorchCall(
            "", [&]() -> absl::Status { return command->run(*parsed, io); });
      }
    }
  }
  if (status.ok()) {
    // What a command printed must have reached stdout (e.g. not a full disk
    // or a closed pipe): a lost report is an error, not a success.
    io.out.flush();
    if (!io.out)
      status = absl::DataLossError("cannot write to standard output");
  }
  if (status.ok()) return 0;
  std::string message(status.message());
  std::replace(message.begin(), message.end(), '\n', ' ');
  io.out.flush();
  if (IsUsageError(status)) {
    io.err << "tracecut " << command->name << ": " << message
           << " (see 'tracecut " << command->name << " --help')\n";
    return 2;
  }
  if (auto code = status.GetPayload(kExitCodePayload)) {
    int exit_code = 1;
    if (absl::SimpleAtoi(std::string(*code), &exit_code)) {
      io.err << "tracecut " << command->name << ": " << message << "\n";
      return exit_code;
    }
  }
  io.err << "tracecut " << command->name << ": error: " << message << "\n";
  // LibTorch's whole message (TorchScript call stacks), on request.
  if (const char* v = std::getenv("TRACECUT_VERBOSE"); v != nullptr && *v) {
    if (auto full = status.GetPayload("tracecut/torch-message")) {
      io.err << "LibTorch's message:\n" << std::string(*full) << "\n";
    }
  }
  return 1;
}

absl::Status WriteOutput(const std::string& path, absl::string_view bytes,
                         Io& io) {
  if (path == "-") {
    io.out << bytes;
    io.out.flush();
    return io.out ? absl::OkStatus()
                  : absl::DataLossError("cannot write to standard output");
  }
  if (absl::Status s = CheckNotSpecialFile(path); !s.ok()) return s;
  std::string dir = ".";
  if (size_t slash = path.rfind('/'); slash != std::string::npos) {
    dir = slash == 0 ? "/" : path.substr(0, slash);
  }
  std::string base = path.substr(
      path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  if (base.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output path '", path, "' names a directory"));
  }
  std::string tmpl = absl::StrCat(dir, "/.", base, ".tmp.XXXXXX");
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  int fd = mkstemp(name.data());
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write '", path, "': cannot create a file in '",
                     dir, "': ", std::strerror(errno)));
  }
  const std::string tmp(name.data());
  auto fail = [&](absl::string_view what) {
    int err = errno;
    close(fd);
    unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat("cannot write '", path, "': ", what,
                                            ": ", std::strerror(err)));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write failed");
    }
    done += static_cast<size_t>(n);
  }
  // Readable like a file created normally (mkstemp makes it 0600).
  mode_t mask = umask(0);
  umask(mask);
  fchmod(fd, 0666 & ~mask);
  if (fsync(fd) != 0) return fail("fsync failed");
  if (close(fd) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat(
        "cannot write '", path, "': close failed: ", std::strerror(err)));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat(
        "cannot write '", path, "': rename failed: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::Status CheckOutputPath(const std::string& path, bool directory_output) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!directory_output && fs::is_directory(path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write '", path, "': it is a directory"));
  }
  if (absl::Status s = CheckNotSpecialFile(path); !s.ok()) return s;
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("cannot write '", path, "': '",
                                            dir.string(),
                                            "' is not an existing directory"));
  }
  // Permission bits do not stop root, and /proc or /sys refuse new files
  // whatever the bits say: create (and remove) a file to know.
  std::string probe = (dir / ".tracecut-probe.XXXXXX").string();
  int fd = mkstemp(probe.data());
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write '", path, "': cannot create a file in '",
                     dir.string(), "': ", std::strerror(errno)));
  }
  close(fd);
  unlink(probe.c_str());
  return absl::OkStatus();
}

absl::Status WithExitCode(absl::Status status, int code) {
  status.SetPayload(kExitCodePayload, absl::Cord(absl::StrCat(code)));
  return status;
}

absl::Status CheckOutputIsNotInput(const std::string& output,
                                   const std::string& input) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (output.empty() || output == "-" || !fs::exists(output, ec)) {
    return absl::OkStatus();  // A new file overwrites nothing.
  }
  if (fs::equivalent(output, input, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to write '", output, "': it is the input model '", input,
        "'; choose another output path"));
  }
  fs::path dir = fs::path(output).parent_path();
  if (dir.empty()) dir = ".";
  if (fs::is_directory(input, ec) && fs::equivalent(dir, input, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("refusing to write '", output,
                     "': it is a file of the input "
                     "checkpoint directory '",
                     input, "'; choose another output path"));
  }
  return absl::OkStatus();
}

}  // namespace tracecut::cli
