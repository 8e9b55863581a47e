// The config schema (internal to core/config): one table of fields, each with its section, key,
// type, accessors into Config, allowed values and a one-line meaning. The loader (config.cpp), the
// TOML writer and the markdown reference (schema.cpp) all walk this table; nothing else lists keys.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/config/config.h"

namespace moepeak::config_schema {

enum class FieldType {
  integer,
  floating,
  boolean,
  string,
  enumeration,
  byte_size,
  dataset_list,
  integer_list,
  enum_list
};

// A value on its way into or out of Config. Enumerations and byte sizes travel as strings; a
// dataset list (training.datasets) and an integer list (model.mlp_only_layers) as themselves, a
// list of enumerators (model.layer_types) as their spellings.
using FieldValue = std::variant<int64_t, double, bool, std::string, std::vector<DatasetSource>,
                                std::vector<int64_t>, std::vector<std::string>>;

struct Bound {
  double value = 0;
  bool inclusive = true;
};

struct Field {
  std::string_view section;
  std::string_view key;
  FieldType type;
  FieldValue (*get)(const Config&);
  void (*set)(Config&, const FieldValue&);    // the value must have passed check_value
  std::span<const std::string_view> choices;  // enumeration, enum_list: the allowed spellings
  // integer, floating, integer_list (each element); byte_size: on the byte count
  std::optional<Bound> lower, upper;
  // string: returns what is wrong with the text, or "" when it is fine.
  std::string (*check_text)(const std::string&) = nullptr;
  std::string_view text_rule;  // string: the rule check_text enforces, for the docs
  std::string_view doc;

  std::string full_key() const { return std::string(section) + "." + std::string(key); }
};

struct Section {
  std::string_view name;
  std::string_view doc;
};

std::span<const Section> sections();
std::span<const Field> fields();  // grouped by section, in the order of sections()

const Section* find_section(std::string_view name);
const Field* find_field(std::string_view section, std::string_view key);

// "integer", "float", "boolean", "string", "enum", "byte size", "dataset list", "integer list" (as
// errors and docs say it).
std::string_view type_name(FieldType type);
// What the field accepts, as one line: ">= 1", "[0, 1)", "copy, bin, megatron", ...
std::string allowed_text(const Field& field);
// "" when the value is acceptable; otherwise the problem, naming the full key:
// "training.steps must be >= 1, got 0". The value's variant must match the field's type.
std::string check_value(const Field& field, const FieldValue& value);
// A TOML literal: 64, 1e-05, true, "auto" (strings quoted and escaped).
std::string to_toml_literal(const FieldValue& value);
std::string quote_toml_string(std::string_view text);
std::string markdown_cell(const std::string& text);
// The candidate a typo most likely meant ("hiden_size" -> "hidden_size"), if any is close.
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string_view>& candidates);

}  // namespace moepeak::config_schema
