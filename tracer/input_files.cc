#include "tracer/input_files.h"

#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::tracer {

std::vector<ForwardArgument> ForwardArguments(
    const torch::jit::Module& module) {
  std::vector<ForwardArgument> out;
  auto method = module.find_method("forward");
  if (!method.has_value()) return out;
  const auto& args = method->function().getSchema().arguments();
  for (size_t i = 1; i < args.size(); ++i) {
    out.push_back({args[i].name(), args[i].type()->annotation_str()});
  }
  return out;
}

std::string DescribeForward(const std::vector<ForwardArgument>& args) {
  std::vector<std::string> names;
  for (const ForwardArgument& a : args) {
    names.push_back(absl::StrCat(a.name, ": ", a.type));
  }
  return absl::StrJoin(names, ", ");
}

bool LooksLikeSafetensors(absl::string_view bytes) {
  if (bytes.size() < 10) return false;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  }
  return n >= 2 && n <= bytes.size() - 8 && bytes[8] == '{';
}

absl::StatusOr<c10::IValue> ReadTensorFile(const std::string& path,
                                           absl::string_view what) {
  const std::string where = absl::StrCat(what, ": '", path, "'");
  // Reading a directory through a filebuf throws std::ios_base::failure.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(what, ": cannot open '", path, "'"));
  }
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat(where, ": read error"));
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is empty"));
  }
  if (LooksLikeSafetensors(bytes)) {
    ASSIGN_OR_RETURN(
        std::shared_ptr<const checkpoint::SafetensorsFile> file,
        checkpoint::SafetensorsFile::FromBytes(std::move(bytes), path));
    c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
    for (const std::string& name : file->names()) {
      ASSIGN_OR_RETURN(torch::Tensor t, file->Get(name));
      dict.insert(c10::IValue(name), c10::IValue(t));
    }
    return c10::IValue(std::move(dict));
  }
  std::vector<char> data(bytes.begin(), bytes.end());
  return runtime::TorchCall(
      absl::StrCat(where,
                   " is not a torch.save'd tensor, list, tuple or dict (nor "
                   "a safetensors file)"),
      [&] { return torch::jit::pickle_load(data); });
}

absl::StatusOr<std::vector<std::pair<std::string, c10::IValue>>>
MatchForwardArguments(const c10::IValue& value,
                      const std::vector<ForwardArgument>& args,
                      absl::string_view where) {
  std::vector<std::pair<std::string, c10::IValue>> out;
  if (value.isGenericDict()) {
    for (const auto& e : value.toGenericDict()) {
      if (!e.key().isString()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " is a dict with non-string keys"));
      }
      const std::string name = e.key().toStringRef();
      bool known = false;
      for (const ForwardArgument& a : args) known |= a.name == name;
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " has '", name, "', which is not an argument of forward(",
            DescribeForward(args), ")"));
      }
      out.emplace_back(name, e.value());
    }
    return out;
  }
  std::vector<c10::IValue> items;
  if (value.isTuple()) {
    items = value.toTupleRef().elements().vec();
  } else if (value.isList()) {
    items = value.toListRef().vec();
  } else {
    items = {value};
  }
  if (items.size() > args.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " holds ", items.size(), " values, but forward(",
                     DescribeForward(args), ") takes ", args.size()));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    out.emplace_back(args[i].name, items[i]);
  }
  return out;
}

absl::StatusOr<std::map<std::string, c10::IValue>> ReadExampleInputs(
    const std::string& path, const torch::jit::Module& module) {
  ASSIGN_OR_RETURN(c10::IValue value, ReadTensorFile(path, "--example-inputs"));
  ASSIGN_OR_RETURN(
      auto matched,
      MatchForwardArguments(value, ForwardArguments(module),
                            absl::StrCat("--example-inputs: '", path, "'")));
  return std::map<std::string, c10::IValue>(matched.begin(), matched.end());
}

}  // namespace tracecut::tracer
