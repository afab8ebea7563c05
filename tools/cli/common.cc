#include "tools/cli/common.h"

#include <ATen/Parallel.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/torch_status.h"
#include "tools/cpp/runfiles/runfiles.h"
#include "util/files.h"
#include "util/format.h"
#include "util/path_guard.h"
#include "util/status_macros.h"

namespace tracecut::cli {
namespace {

constexpr absl::string_view kExitCodePayload = "tracecut/exit-code";

std::vector<Subcommand>& Registry() {
  static auto* registry = new std::vector<Subcommand>();
  return *registry;
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

// The flags of `command`, --help and --threads, which every subcommand
// takes.
std::vector<FlagSpec> FlagsWithHelp(const Subcommand& command) {
  std::vector<FlagSpec> flags = command.flags;
  flags.push_back(FlagSpec::Value(
      "threads", "N",
      "intra-op threads of LibTorch's kernels (default: the machine's "
      "cores, as torch picks them; OMP_NUM_THREADS also sets it)"));
  flags.push_back(FlagSpec::Bool("help", "show this help").Short('h'));
  return flags;
}

// --threads=N: LibTorch's intra-op pool, set before any kernel runs (the
// pool cannot be resized once it has started).
absl::Status ApplyThreads(const ParsedArgs& args) {
  const std::optional<std::string> value = args.Get("threads");
  if (!value.has_value()) return absl::OkStatus();
  int threads = 0;
  if (!absl::SimpleAtoi(*value, &threads) || threads < 1 || threads > 1024) {
    return UsageError(
        absl::StrCat("--threads: expected a whole number from 1 to 1024, got '",
                     *value, "'"));
  }
  at::set_num_threads(threads);
  return absl::OkStatus();
}

}  // namespace

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
  return FlagsHelp(command.name, command.synopsis, command.summary,
                   command.description, FlagsWithHelp(command));
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
      if (!std::filesystem::exists(value, ec)) continue;  // Its reader says.
      // A FIFO blocks and /dev/zero never ends: neither is read.
      ASSIGN_OR_RETURN(
          util::RegularFile file,
          util::OpenRegularFile(value, absl::StrCat("--", f.name)));
      if (f.max_bytes > 0 && file.size > f.max_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", f.name, ": '", value, "' has ",
                         util::HumanBytes(static_cast<int64_t>(file.size)),
                         ", more than the ",
                         util::HumanBytes(static_cast<int64_t>(f.max_bytes)),
                         " such a file may have"));
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
  const std::vector<FlagSpec> flags = FlagsWithHelp(*command);
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
      if (status.ok()) status = ApplyThreads(*parsed);
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
  RETURN_IF_ERROR(CheckNotSpecialFile(path));
  if (path.empty() || path.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("output path '", path, "' names a directory"));
  }
  return util::WriteFileAtomically(path, bytes);
}

absl::Status CheckOutputPath(const std::string& path, bool directory_output) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!directory_output && fs::is_directory(path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write '", path, "': it is a directory"));
  }
  RETURN_IF_ERROR(CheckNotSpecialFile(path));
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
    return util::ErrnoError(
        errno, absl::StrCat("cannot write '", path,
                            "': cannot create a file in '", dir.string(), "'"));
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

std::string UserPath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  if (const char* wd = std::getenv("BUILD_WORKING_DIRECTORY")) {
    return absl::StrCat(wd, "/", path);
  }
  return path;
}

absl::StatusOr<std::string> FindRunfile(const std::string& name) {
  using ::bazel::tools::cpp::runfiles::Runfiles;
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string error;
  std::unique_ptr<Runfiles> runfiles(Runfiles::Create(exe, &error));
  if (runfiles == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot find tracecut's runfiles: ", error));
  }
  std::string path = runfiles->Rlocation(name);
  if (path.empty() || access(path.c_str(), R_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot find ", name, " among tracecut's runfiles"));
  }
  return path;
}

}  // namespace tracecut::cli
