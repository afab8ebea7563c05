#include "modifiers/registry.h"

#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tracecut::modifiers {
namespace {

// Keyed by the message's full name: a descriptor of the generated pool is
// unique per name.
absl::flat_hash_map<std::string, ModifierType>& Types() {
  // Never destroyed: registrations run at static initialization and
  // lookups may run at exit.
  static auto* types = new absl::flat_hash_map<std::string, ModifierType>();
  return *types;
}

}  // namespace

bool RegisterModifierType(const google::protobuf::Descriptor* config,
                          ModifierType type) {
  if (config == nullptr || type.build == nullptr ||
      !Types().emplace(config->full_name(), std::move(type)).second) {
    std::cerr << "tracecut: modifier registration for "
              << (config == nullptr ? "(null)" : config->full_name())
              << " is missing its build function or repeats one\n";
    std::abort();
  }
  return true;
}

const ModifierType* FindModifierType(
    const google::protobuf::Descriptor* config) {
  auto it = Types().find(config->full_name());
  return it == Types().end() ? nullptr : &it->second;
}

std::vector<std::string> RegisteredModifierMessages() {
  std::vector<std::string> names;
  for (const auto& [name, type] : Types()) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace tracecut::modifiers
