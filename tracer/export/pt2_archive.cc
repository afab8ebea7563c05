#include "tracer/export/pt2_archive.h"

#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors.h"
#include "runtime/torch_status.h"
#include "util/path_guard.h"
#include "util/status_macros.h"

namespace tracecut::tracer::exported {
namespace {

namespace schema = torch::_export;

constexpr char kModelsDir[] = "models/";
constexpr char kWeightsDir[] = "data/weights/";
constexpr char kWeightsConfig[] = "data/weights/model_weights_config.json";
constexpr char kConstantsDir[] = "data/constants/";
constexpr char kConstantsConfig[] =
    "data/constants/model_constants_config.json";
constexpr char kExtraDir[] = "extra/";
constexpr char kSampleInputs[] = "data/sample_inputs/model.pt";

// Members are read whole into memory, and a crafted archive can deflate
// gigabytes into a few megabytes (a 2.5 MB .pt2 whose extra/config.json is
// 2 GiB). torch.export and LibTorch store members uncompressed, so no
// honest member is larger than the archive; a small allowance is left for
// JSON that another zip tool compressed.
constexpr uint64_t kCompressedAllowance = 64 << 20;

uint64_t RecordLimit(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  return (ec ? 0 : size) + kCompressedAllowance;
}

absl::Status CheckRecordSize(caffe2::serialize::PyTorchStreamReader& reader,
                             const std::string& path, const std::string& name,
                             uint64_t limit) {
  const uint64_t size = reader.getRecordSize(name);
  if (size > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ":", name, ": inflates to ", size,
                     " bytes, more than the ", limit,
                     " tracecut reads from this archive's members; refusing a "
                     "compressed member that large"));
  }
  return absl::OkStatus();
}

// Stored members add up to about the archive's size; compressed ones may
// exceed it only by the allowance, one by one and together.
absl::Status CheckMemberSizes(caffe2::serialize::PyTorchStreamReader& reader,
                              const std::string& path) {
  uint64_t left = RecordLimit(path);
  for (const std::string& r : reader.getAllRecords()) {
    RETURN_IF_ERROR(CheckRecordSize(reader, path, r, left));
    left -= reader.getRecordSize(r);
  }
  return absl::OkStatus();
}

std::string ReadRecord(caffe2::serialize::PyTorchStreamReader& reader,
                       const std::string& name) {
  auto [data, size] = reader.getRecord(name);
  return std::string(static_cast<const char*>(data.get()), size);
}

// Parses `text` as schema type T; errors name the record and, for a schema
// mismatch, the torch version that wrote it.
template <typename T>
absl::StatusOr<T> ParseJson(const std::string& text, const std::string& where,
                            const std::string& writer) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not valid JSON: ", e.what()));
  }
  try {
    return j.get<T>();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": does not match the torch.export schema of LibTorch ",
        TORCH_VERSION, writer.empty() ? "" : " (written by torch ", writer,
        writer.empty() ? "" : ")", ": ", e.what()));
  }
}

int64_t AsInt(const schema::SymInt& s, const std::string& what) {
  if (s.tag() != schema::SymInt::Tag::AS_INT) {
    throw std::invalid_argument(
        absl::StrCat(what, " has a symbolic size or stride"));
  }
  return s.get_as_int();
}

// The tensors a payload config lists, from the files under `dir`.
absl::Status ReadPayloads(caffe2::serialize::PyTorchStreamReader& reader,
                          const std::string& path, const std::string& dir,
                          const std::string& config_name,
                          const std::string& writer,
                          std::map<std::string, torch::Tensor>& out) {
  if (!reader.hasRecord(config_name)) return absl::OkStatus();
  ASSIGN_OR_RETURN(schema::PayloadConfig config,
                   ParseJson<schema::PayloadConfig>(
                       ReadRecord(reader, config_name),
                       absl::StrCat(path, ":", config_name), writer));
  // Sorted, so errors and storage sharing do not depend on hash order.
  std::map<std::string, const schema::PayloadMeta*> entries;
  for (const auto& [fqn, meta] : config.get_config()) entries[fqn] = &meta;
  std::map<std::string, torch::Tensor> storages;  // By payload file.
  for (const auto& [fqn, meta] : entries) {
    const std::string where = absl::StrCat(path, ": tensor '", fqn, "'");
    if (meta->get_use_pickle()) {
      return absl::UnimplementedError(absl::StrCat(
          where,
          " is stored pickled (a tensor subclass or a non-strided tensor); "
          "tracecut reads plain tensors only"));
    }
    if (!meta->get_tensor_meta().has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has no tensor_meta"));
    }
    const schema::TensorMeta& tm = *meta->get_tensor_meta();
    // A meta-device export holds no data; the weights come from the
    // checkpoint (FillFromCheckpoint).
    if (tm.get_device().get_type() == "meta") continue;
    std::optional<c10::ScalarType> dtype = ToScalarType(tm.get_dtype());
    if (!dtype.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has an unknown dtype"));
    }
    const std::string file = dir + meta->get_path_name();
    if (!reader.hasRecord(file)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": payload file '", file, "' is missing from the archive"));
    }
    auto storage_it = storages.find(file);
    if (storage_it == storages.end()) {
      auto [data, size] = reader.getRecord(file);
      const size_t item = c10::elementSize(*dtype);
      if (size % item != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": payload '", file, "' has ", size,
                         " bytes, not a multiple of the ", item, "-byte ",
                         c10::toString(*dtype)));
      }
      torch::Tensor flat = torch::empty({static_cast<int64_t>(size / item)},
                                        torch::dtype(*dtype));
      if (size > 0) std::memcpy(flat.data_ptr(), data.get(), size);
      storage_it = storages.emplace(file, flat).first;
    }
    torch::Tensor flat = storage_it->second;
    if (flat.scalar_type() != *dtype) flat = flat.view(*dtype);
    ASSIGN_OR_RETURN(
        torch::Tensor t, runtime::TorchCall(where, [&] {
          std::vector<int64_t> sizes, strides;
          for (const auto& s : tm.get_sizes()) sizes.push_back(AsInt(s, fqn));
          for (const auto& s : tm.get_strides()) {
            strides.push_back(AsInt(s, fqn));
          }
          const int64_t offset = AsInt(tm.get_storage_offset(), fqn);
          // The archive's numbers: one stride per size, none negative, and
          // the last element reached computed without overflow (a fuzzed
          // .pt2 once read strides past their end).
          if (strides.size() != sizes.size() || offset < 0) {
            throw std::invalid_argument(
                absl::StrCat(sizes.size(), " sizes, ", strides.size(),
                             " strides and storage offset ", offset));
          }
          for (size_t i = 0; i < sizes.size(); ++i) {
            if (sizes[i] < 0 || strides[i] < 0) {
              throw std::invalid_argument(
                  "a negative size or stride in its tensor_meta");
            }
          }
          int64_t last = offset;
          bool overflow = false;
          for (size_t i = 0; i < sizes.size(); ++i) {
            if (sizes[i] == 0) return torch::empty(sizes, flat.options());
            int64_t step = 0;
            overflow |= __builtin_mul_overflow(sizes[i] - 1, strides[i], &step);
            overflow |= __builtin_add_overflow(last, step, &last);
          }
          if (overflow || last >= flat.numel()) {
            throw std::invalid_argument(absl::StrCat(
                "sizes and strides reach element ", last, " of a payload of ",
                flat.numel(), " elements (truncated payload?)"));
          }
          return flat.as_strided(sizes, strides, offset);
        }));
    out[fqn] = t;
  }
  return absl::OkStatus();
}

// What the program expects of a tensor input: its graph value's meta.
struct Expected {
  c10::ScalarType dtype;
  std::vector<int64_t> sizes;
};

// Tensors the program reads that the archive lacks (a meta-device export,
// `tracecut export --meta`): from the buffers the exporter embedded, then
// from the safetensors of the directory holding the archive, by name. A
// checkpoint tensor of another floating dtype is converted to the
// program's; another shape is an error.
absl::Status FillFromCheckpoint(Pt2Archive& archive, bool defer) {
  const auto& graph = archive.program.get_graph_module().get_graph();
  const auto& sig = archive.program.get_graph_module().get_signature();
  std::map<std::string, std::string> missing;  // fqn -> graph value.
  for (const schema::InputSpec& spec : sig.get_input_specs()) {
    using Tag = schema::InputSpec::Tag;
    std::string fqn, value;
    if (spec.tag() == Tag::PARAMETER) {
      fqn = spec.get_parameter().get_parameter_name();
      value = spec.get_parameter().get_arg().get_name();
    } else if (spec.tag() == Tag::BUFFER) {
      fqn = spec.get_buffer().get_buffer_name();
      value = spec.get_buffer().get_arg().get_name();
    } else if (spec.tag() == Tag::TENSOR_CONSTANT) {
      fqn = spec.get_tensor_constant().get_tensor_constant_name();
      value = spec.get_tensor_constant().get_arg().get_name();
    } else {
      continue;
    }
    if (!archive.tensors.contains(fqn)) missing[fqn] = value;
  }
  if (missing.empty()) return absl::OkStatus();

  std::shared_ptr<const checkpoint::SafetensorsFile> buffers;
  if (auto it = archive.extra_files.find(kEmbeddedBuffers);
      it != archive.extra_files.end()) {
    const std::string name = absl::StrCat(archive.path, ":", kEmbeddedBuffers);
    std::string bytes;
    if (!absl::Base64Unescape(it->second, &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": not base64"));
    }
    ASSIGN_OR_RETURN(buffers, checkpoint::SafetensorsFile::FromBytes(
                                  std::move(bytes), name));
  }
  const std::string dir =
      std::filesystem::path(archive.path).parent_path().string();
  std::optional<checkpoint::Checkpoint> ckpt;
  if (checkpoint::Checkpoint::HasWeights(dir.empty() ? "." : dir)) {
    ASSIGN_OR_RETURN(ckpt,
                     checkpoint::Checkpoint::Open(dir.empty() ? "." : dir));
  }
  // Tied parameters (lm_head and embed_tokens): a checkpoint holds one name.
  // Tensors the checkpoint stores renamed or in pieces: its layout.
  std::map<std::string, std::vector<std::string>> aliases;
  checkpoint::Layout layout;
  if (auto it = archive.extra_files.find("tracecut_model.json");
      it != archive.extra_files.end()) {
    const std::string source =
        absl::StrCat(archive.path, ":tracecut_model.json");
    try {
      nlohmann::json j = nlohmann::json::parse(it->second);
      if (j.contains("tied_parameters")) {
        for (const auto& group :
             j["tied_parameters"]
                 .get<std::vector<std::vector<std::string>>>()) {
          for (const std::string& name : group) aliases[name] = group;
        }
      }
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
    }
    ASSIGN_OR_RETURN(layout,
                     checkpoint::Layout::FromModelJson(it->second, source));
  }
  for (const auto& [fqn, value] : missing) {
    torch::Tensor t;
    std::string from;
    std::vector<std::string> names = {fqn};
    for (const std::string& a : aliases[fqn]) {
      if (a != fqn) names.push_back(a);
    }
    std::optional<DeferredTensor> deferred;
    for (const std::string& name : names) {
      if (buffers != nullptr && buffers->Has(name)) {
        ASSIGN_OR_RETURN(t, buffers->Get(name));
        from = buffers->name();
      } else if (ckpt.has_value() && ckpt->Has(name) && defer) {
        ASSIGN_OR_RETURN(checkpoint::TensorInfo info, ckpt->Info(name));
        t = StandIn(info.dtype, info.shape);
        deferred = DeferredTensor{name, info.dtype, info.dtype};
        from = ckpt->FileOf(name);
      } else if (ckpt.has_value() && ckpt->Has(name)) {
        ASSIGN_OR_RETURN(t, ckpt->Get(name));
        from = absl::StrCat(ckpt->dir(), "'s safetensors");
      } else if (const std::vector<checkpoint::Piece>* pieces =
                     layout.Find(name);
                 ckpt.has_value() && pieces != nullptr) {
        from = absl::StrCat(ckpt->dir(), "'s safetensors (", pieces->size(),
                            " pieces from '", pieces->front().name, "' on)");
        if (defer) {
          ASSIGN_OR_RETURN(checkpoint::TensorInfo info,
                           ckpt->Info(pieces->front().name));
          t = StandIn(info.dtype, checkpoint::ShapeOf(*pieces));
          deferred = DeferredTensor{name, info.dtype, info.dtype, *pieces};
        } else {
          ASSIGN_OR_RETURN(t, checkpoint::ReadPieces(*ckpt, name, *pieces));
        }
      }
      if (t.defined()) break;
    }
    if (!t.defined()) {
      return absl::NotFoundError(absl::StrCat(
          archive.path, ": the program reads '", fqn,
          "', which the archive does not hold (exported with --meta?) and ",
          ckpt.has_value()
              ? absl::StrCat("the checkpoint in '", ckpt->dir(),
                             "' does not have")
              : absl::StrCat("there is no checkpoint (model.safetensors) "
                             "next to it in '",
                             dir.empty() ? "." : dir, "'")));
    }
    auto meta = graph.get_tensor_values().find(value);
    if (meta != graph.get_tensor_values().end()) {
      std::vector<int64_t> sizes;
      for (const auto& s : meta->second.get_sizes()) {
        sizes.push_back(s.tag() == schema::SymInt::Tag::AS_INT ? s.get_as_int()
                                                               : -1);
      }
      if (t.sizes().vec() != sizes) {
        return absl::InvalidArgumentError(absl::StrCat(
            from, ": tensor '", fqn, "' has shape [",
            absl::StrJoin(t.sizes().vec(), ", "), "], the program expects [",
            absl::StrJoin(sizes, ", "), "]"));
      }
      std::optional<c10::ScalarType> dtype =
          ToScalarType(meta->second.get_dtype());
      if (dtype.has_value() && *dtype != t.scalar_type()) {
        if (!c10::isFloatingType(*dtype) ||
            !c10::isFloatingType(t.scalar_type())) {
          return absl::InvalidArgumentError(absl::StrCat(
              from, ": tensor '", fqn, "' is ", c10::toString(t.scalar_type()),
              ", the program expects ", c10::toString(*dtype)));
        }
        if (deferred.has_value()) {
          // A stand-in is rebuilt, not converted: .to() would materialise it.
          deferred->dtype = *dtype;
          t = StandIn(*dtype, t.sizes().vec());
        } else {
          t = t.to(*dtype);
        }
      }
    }
    archive.tensors[fqn] = t;
    if (deferred.has_value()) {
      archive.deferred.emplace(fqn, *deferred);
      archive.checkpoint_dir = ckpt->dir();
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsPt2Path(const std::string& path) { return absl::EndsWith(path, ".pt2"); }

torch::Tensor StandIn(c10::ScalarType dtype,
                      const std::vector<int64_t>& shape) {
  return torch::full({1},
                     c10::isFloatingType(dtype)
                         ? std::numeric_limits<double>::quiet_NaN()
                         : 0.0,
                     torch::dtype(dtype))
      .expand(shape);
}

bool IsStandIn(const torch::Tensor& t) {
  return t.defined() && t.numel() > 1 &&
         t.storage().nbytes() <= static_cast<size_t>(t.element_size());
}

std::optional<c10::ScalarType> ToScalarType(schema::ScalarType type) {
  using S = schema::ScalarType;
  switch (type) {
    case S::BYTE:
      return c10::kByte;
    case S::CHAR:
      return c10::kChar;
    case S::SHORT:
      return c10::kShort;
    case S::INT:
      return c10::kInt;
    case S::LONG:
      return c10::kLong;
    case S::HALF:
      return c10::kHalf;
    case S::FLOAT:
      return c10::kFloat;
    case S::DOUBLE:
      return c10::kDouble;
    case S::COMPLEXHALF:
      return c10::kComplexHalf;
    case S::COMPLEXFLOAT:
      return c10::kComplexFloat;
    case S::COMPLEXDOUBLE:
      return c10::kComplexDouble;
    case S::BOOL:
      return c10::kBool;
    case S::BFLOAT16:
      return c10::kBFloat16;
    case S::UINT16:
      return c10::kUInt16;
    case S::FLOAT8E4M3FN:
      return c10::kFloat8_e4m3fn;
    case S::FLOAT8E5M2:
      return c10::kFloat8_e5m2;
    case S::FLOAT8E4M3FNUZ:
      return c10::kFloat8_e4m3fnuz;
    case S::FLOAT8E5M2FNUZ:
      return c10::kFloat8_e5m2fnuz;
    // By value: torch 2.11's export schema (bench/gpu builds against it)
    // ends at FLOAT8E5M2FNUZ = 32 and lacks these names.
    case static_cast<S>(33):  // FLOAT8E8M0FNU
      return c10::kFloat8_e8m0fnu;
    case static_cast<S>(34):  // UINT32
      return c10::kUInt32;
    case static_cast<S>(35):  // UINT64
      return c10::kUInt64;
    default:
      return std::nullopt;
  }
}

absl::Status CheckArchiveMemberSizes(const std::string& path) {
  RETURN_IF_ERROR(util::OpenRegularFile(path, "model file").status());
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception&) {
    // Not an archive LibTorch reads: its loader says why, in its words.
    return absl::OkStatus();
  }
  return runtime::TorchCall(absl::StrCat("reading ", path),
                            [&] { return CheckMemberSizes(*reader, path); });
}

absl::StatusOr<Pt2Archive> ReadPt2Archive(const std::string& path,
                                          const Pt2ReadOptions& options) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("model file '", path, "' does not exist"));
  }
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model path '", path, "' is a directory, not a .pt2"));
  }
  // Not a FIFO (LibTorch's open would block) nor a device.
  RETURN_IF_ERROR(util::OpenRegularFile(path, "model file").status());
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  RETURN_IF_ERROR(runtime::TorchCall(
      absl::StrCat("model file '", path,
                   "' is not a torch.export archive (a .pt2 is a zip written "
                   "by torch.export.save)"),
      [&] {
        reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
      }));

  Pt2Archive archive;
  archive.path = path;
  std::vector<std::string> records;
  RETURN_IF_ERROR(runtime::TorchCall(absl::StrCat("reading ", path), [&] {
    records = reader->getAllRecords();
  }));
  RETURN_IF_ERROR(runtime::TorchCall(absl::StrCat("reading ", path), [&] {
    return CheckMemberSizes(*reader, path);
  }));
  std::string model_json;
  std::vector<std::string> models;
  for (const std::string& r : records) {
    if (absl::StartsWith(r, kModelsDir) && absl::EndsWith(r, ".json") &&
        r.find('/', sizeof(kModelsDir) - 1) == std::string::npos) {
      models.push_back(r);
    }
  }
  if (models.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model file '", path,
                     "' is a zip archive but not a torch.export program (no "
                     "models/*.json; was it written by torch.export.save?)"));
  }
  std::sort(models.begin(), models.end());
  model_json = models.front();
  for (const std::string& m : models) {
    if (m == "models/model.json") model_json = m;
  }
  if (models.size() > 1 && model_json != "models/model.json") {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": holds several programs (", absl::StrJoin(models, ", "),
        "); tracecut reads archives of one model"));
  }

  return runtime::TorchCall(
      absl::StrCat("reading ", path), [&]() -> absl::StatusOr<Pt2Archive> {
        const std::string text = ReadRecord(*reader, model_json);
        // The writer's version, for errors: best effort, before the schema.
        std::string writer;
        try {
          nlohmann::json j = nlohmann::json::parse(text);
          if (j.contains("torch_version") && j["torch_version"].is_string()) {
            writer = j["torch_version"].get<std::string>();
          }
        } catch (const nlohmann::json::exception&) {
        }
        ASSIGN_OR_RETURN(
            archive.program,
            ParseJson<schema::ExportedProgram>(
                text, absl::StrCat(path, ":", model_json), writer));
        RETURN_IF_ERROR(ReadPayloads(*reader, path, kWeightsDir, kWeightsConfig,
                                     writer, archive.tensors));
        RETURN_IF_ERROR(ReadPayloads(*reader, path, kConstantsDir,
                                     kConstantsConfig, writer,
                                     archive.tensors));
        if (reader->hasRecord(kSampleInputs)) {
          archive.sample_inputs = ReadRecord(*reader, kSampleInputs);
        }
        for (const std::string& r : records) {
          if (absl::StartsWith(r, kExtraDir)) {
            archive.extra_files[r.substr(sizeof(kExtraDir) - 1)] =
                ReadRecord(*reader, r);
          }
        }
        RETURN_IF_ERROR(
            FillFromCheckpoint(archive, options.defer_checkpoint_tensors));
        return std::move(archive);
      });
}

}  // namespace tracecut::tracer::exported
