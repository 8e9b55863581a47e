// Loading the config: TOML files (toml++) applied in order onto the embedded default, then the
// --set overrides, then the checks that span keys. Each value is checked against the schema as it
// is applied, so an error names where that value came from ("configs/x.toml:7", "--set ...") and
// the full key; each accepted value records that place in Config::origins.
#include "core/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>

#include "core/config/schema.h"
#include "core/error.h"
#include "core/units.h"

namespace moepeak {
namespace {

using config_schema::Field;
using config_schema::FieldType;
using config_schema::FieldValue;

// ---- Describing what the user wrote --------------------------------------------------------

std::string describe_node(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "string " + config_schema::quote_toml_string(*node.value<std::string>());
    case toml::node_type::integer:
      return "integer " + std::to_string(*node.value<int64_t>());
    case toml::node_type::floating_point:
      return "float " + config_schema::to_toml_literal(*node.value<double>());
    case toml::node_type::boolean:
      return *node.value<bool>() ? "boolean true" : "boolean false";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::string_view expected_phrase(FieldType type) {
  switch (type) {
    case FieldType::integer:
      return "an integer";
    case FieldType::floating:
      return "a float";
    case FieldType::boolean:
      return "a boolean (true or false)";
    case FieldType::string:
      return "a string";
    case FieldType::enumeration:
      return "a string";
    case FieldType::byte_size:
      return "a byte size string such as \"16GiB\", or \"auto\"";
    case FieldType::dataset_list:
      return "an array of tables such as [{ path = \"a.bin\", weight = 0.7 }]";
    case FieldType::integer_list:
      return "an array of integers such as [0, 3]";
    case FieldType::enum_list:
      return "an array of strings such as [\"a\", \"b\"]";
  }
  return "a value";
}

std::vector<std::string_view> section_names() {
  std::vector<std::string_view> names;
  for (const auto& s : config_schema::sections()) names.push_back(s.name);
  return names;
}

std::vector<std::string_view> keys_of(std::string_view section) {
  std::vector<std::string_view> keys;
  for (const Field& f : config_schema::fields()) {
    if (f.section == section) keys.push_back(f.key);
  }
  return keys;
}

// " (did you mean 'hidden_size'?)", " (did you mean 'training.seq_len'?)", or "".
std::string key_suggestion(std::string_view section, std::string_view key) {
  for (const Field& f : config_schema::fields()) {
    if (f.key == key && f.section != section) {
      return " (did you mean '" + f.full_key() + "'? it is in [" + std::string(f.section) + "])";
    }
  }
  if (auto near = config_schema::closest_match(key, keys_of(section))) {
    return " (did you mean '" + *near + "'?)";
  }
  return "";
}

std::string section_suggestion(std::string_view name) {
  if (auto near = config_schema::closest_match(name, section_names())) {
    return " (did you mean [" + *near + "]?)";
  }
  return "";
}

// ---- Applying one value --------------------------------------------------------------------

// A dataset list: an array of inline tables { path, weight[, dataset] }. An error names the
// entry (training.datasets[i]) and its line where the file gives one.
std::vector<DatasetSource> read_dataset_list(const Field& field, const toml::node& node,
                                             const std::string& where) {
  const toml::array* array = node.as_array();
  if (!array) {
    MOEPEAK_INPUT_ERROR(where, ": ", field.full_key(), ": expected ", expected_phrase(field.type),
                        ", got ", describe_node(node));
  }
  static const std::vector<std::string_view> kKeys = {"path", "weight", "dataset"};
  std::vector<DatasetSource> list;
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& element = *array->get(i);
    const std::string entry = field.full_key() + "[" + std::to_string(i) + "]";
    const std::string at =
        element.source().begin.line == 0 || where.rfind("--set", 0) == 0
            ? where
            : where.substr(0, where.rfind(':')) + ":" + std::to_string(element.source().begin.line);
    const toml::table* table = element.as_table();
    if (!table) {
      MOEPEAK_INPUT_ERROR(at, ": ", entry,
                          ": expected a table { path = \"...\", weight = w }, got ",
                          describe_node(element));
    }
    for (const auto& [key, value] : *table) {
      if (std::find(kKeys.begin(), kKeys.end(), key.str()) == kKeys.end()) {
        const auto near = config_schema::closest_match(key.str(), kKeys);
        MOEPEAK_INPUT_ERROR(at, ": ", entry, ": unknown key '", key.str(), "'",
                            near ? " (did you mean '" + *near + "'?)" : std::string(),
                            "; an entry has path, weight and optionally dataset");
      }
    }
    DatasetSource d;
    const toml::node* path = table->get("path");
    if (!path || !path->is_string()) {
      MOEPEAK_INPUT_ERROR(at, ": ", entry, ": needs path = \"...\" (a string)",
                          path ? ", got " + describe_node(*path) : std::string());
    }
    d.path = *path->value<std::string>();
    const toml::node* weight = table->get("weight");
    if (!weight || !(weight->is_integer() || weight->is_floating_point())) {
      MOEPEAK_INPUT_ERROR(at, ": ", entry, " (", d.path, "): needs weight = w (a number >= 0)",
                          weight ? ", got " + describe_node(*weight) : std::string());
    }
    d.weight = weight->is_integer() ? static_cast<double>(*weight->value<int64_t>())
                                    : *weight->value<double>();
    if (const toml::node* kind = table->get("dataset")) {
      const auto parsed = kind->is_string()
                              ? enum_from_name<DatasetKind>(*kind->value<std::string>())
                              : std::nullopt;
      if (!parsed) {
        MOEPEAK_INPUT_ERROR(at, ": ", entry, " (", d.path,
                            "): dataset must be \"bin\" or \"megatron\", got ",
                            describe_node(*kind));
      }
      d.dataset = *parsed;
    }
    list.push_back(std::move(d));
  }
  return list;
}

// The node as the field's value type, or an error at `where` naming the key.
FieldValue read_value(const Field& field, const toml::node& node, const std::string& where) {
  auto wrong_type = [&]() {
    MOEPEAK_INPUT_ERROR(where, ": ", field.full_key(), ": expected ", expected_phrase(field.type),
                        ", got ", describe_node(node));
  };
  switch (field.type) {
    case FieldType::integer:
      if (!node.is_integer()) wrong_type();
      return *node.value<int64_t>();
    case FieldType::floating:
      // An integer is a fine float: TOML users write rope_theta = 10000.
      if (node.is_integer()) return static_cast<double>(*node.value<int64_t>());
      if (!node.is_floating_point()) wrong_type();
      return *node.value<double>();
    case FieldType::boolean:
      if (!node.is_boolean()) wrong_type();
      return *node.value<bool>();
    case FieldType::byte_size:
      if (node.is_integer()) return std::to_string(*node.value<int64_t>());  // a plain byte count
      [[fallthrough]];
    case FieldType::string:
    case FieldType::enumeration:
      if (!node.is_string()) wrong_type();
      return *node.value<std::string>();
    case FieldType::dataset_list:
      return read_dataset_list(field, node, where);
    case FieldType::integer_list: {
      const toml::array* array = node.as_array();
      if (!array) wrong_type();
      std::vector<int64_t> list;
      for (size_t i = 0; i < array->size(); ++i) {
        const toml::node& element = *array->get(i);
        if (!element.is_integer()) {
          MOEPEAK_INPUT_ERROR(where, ": ", field.full_key(), "[", i, "]: expected an integer, got ",
                              describe_node(element));
        }
        list.push_back(*element.value<int64_t>());
      }
      return list;
    }
    case FieldType::enum_list: {
      const toml::array* array = node.as_array();
      if (!array) wrong_type();
      std::vector<std::string> list;
      for (size_t i = 0; i < array->size(); ++i) {
        const toml::node& element = *array->get(i);
        if (!element.is_string()) {
          MOEPEAK_INPUT_ERROR(where, ": ", field.full_key(), "[", i, "]: expected a string, got ",
                              describe_node(element));
        }
        list.push_back(*element.value<std::string>());
      }
      return list;
    }
  }
  wrong_type();
  return {};
}

void assign(Config& cfg, const Field& field, const FieldValue& value, const std::string& origin) {
  std::string problem = config_schema::check_value(field, value);
  if (!problem.empty()) MOEPEAK_INPUT_ERROR(origin, ": ", problem);
  field.set(cfg, value);
  cfg.origins[field.full_key()] = origin;
}

// ---- Files ---------------------------------------------------------------------------------

struct Entry {
  std::string key;
  const toml::node* node;
  toml::source_position position;
};

// A table's entries in the order they appear in the file (toml::table iterates by key), so the
// first error reported is the first one in the file.
std::vector<Entry> in_file_order(const toml::table& table) {
  std::vector<Entry> entries;
  for (const auto& [key, node] : table) {
    toml::source_position pos = key.source().begin;
    if (pos.line == 0) pos = node.source().begin;
    entries.push_back({std::string(key.str()), &node, pos});
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.position.line != b.position.line ? a.position.line < b.position.line
                                              : a.position.column < b.position.column;
  });
  return entries;
}

toml::table parse_toml_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) MOEPEAK_INPUT_ERROR("config file '", path, "' not found");
  if (std::filesystem::is_directory(path, ec)) {
    MOEPEAK_INPUT_ERROR("config file '", path, "' is a directory, not a TOML file");
  }
  try {
    return toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const toml::source_position& at = e.source().begin;
    if (at.line == 0) MOEPEAK_INPUT_ERROR(path, ": cannot read config file: ", e.description());
    MOEPEAK_INPUT_ERROR(path, ":", at.line, ":", at.column,
                        ": TOML syntax error: ", e.description());
  }
}

void apply_section(Config& cfg, const std::string& path, std::string_view section,
                   const toml::table& table) {
  for (const Entry& entry : in_file_order(table)) {
    std::string where = path + ":" + std::to_string(entry.position.line);
    const Field* field = config_schema::find_field(section, entry.key);
    if (!field) {
      MOEPEAK_INPUT_ERROR(where, ": unknown key '", section, ".", entry.key, "'",
                          key_suggestion(section, entry.key));
    }
    assign(cfg, *field, read_value(*field, *entry.node, where), where);
  }
}

void apply_file(Config& cfg, const std::string& path) {
  toml::table root = parse_toml_file(path);
  for (const Entry& entry : in_file_order(root)) {
    std::string where = path + ":" + std::to_string(entry.position.line);
    if (!config_schema::find_section(entry.key)) {
      if (entry.node->is_table()) {
        MOEPEAK_INPUT_ERROR(where, ": unknown section [", entry.key, "]",
                            section_suggestion(entry.key));
      }
      for (const Field& f : config_schema::fields()) {
        if (f.key == entry.key) {
          MOEPEAK_INPUT_ERROR(where, ": key '", entry.key,
                              "' is outside any section (did you mean '", f.full_key(),
                              "', under [", f.section, "]?)");
        }
      }
      MOEPEAK_INPUT_ERROR(where, ": unknown key '", entry.key,
                          "' outside any section; keys go under a [section] header",
                          section_suggestion(entry.key));
    }
    const toml::table* table = entry.node->as_table();
    if (!table) {
      MOEPEAK_INPUT_ERROR(where, ": '", entry.key, "' is a section: expected a table ([", entry.key,
                          "] with keys under it), got ", describe_node(*entry.node));
    }
    apply_section(cfg, path, entry.key, *table);
  }
}

// ---- --set overrides -----------------------------------------------------------------------

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

// The value text of `--set key=value`: a TOML value (1e6, true, "quoted"), or for a string, enum
// or byte-size key any other text taken as it is (job.name=run7, training.dtype=float32).
FieldValue read_override_value(const Field& field, const std::string& text,
                               const std::string& where) {
  std::optional<toml::table> parsed;
  try {
    parsed = toml::parse("value = " + text);
  } catch (const toml::parse_error&) {
  }
  const toml::node* node = (parsed && parsed->size() == 1) ? parsed->get("value") : nullptr;
  bool textual = field.type == FieldType::string || field.type == FieldType::enumeration ||
                 field.type == FieldType::byte_size;
  if (textual) {
    if (node && node->is_string()) return *node->value<std::string>();
    return text;
  }
  if (!node) {
    MOEPEAK_INPUT_ERROR(where, ": ", field.full_key(), ": expected ", expected_phrase(field.type),
                        ", got '", text, "' (not a TOML value)");
  }
  return read_value(field, *node, where);
}

void apply_override(Config& cfg, const std::string& text) {
  const std::string where = "--set " + text;
  size_t eq = text.find('=');
  if (eq == std::string::npos) {
    MOEPEAK_INPUT_ERROR(where, ": expected section.key=value, as in --set training.steps=50");
  }
  std::string key = trim(std::string_view(text).substr(0, eq));
  std::string value = trim(std::string_view(text).substr(eq + 1));
  size_t dot = key.find('.');
  if (key.empty() || dot == std::string::npos) {
    std::string hint;
    for (const Field& f : config_schema::fields()) {
      if (!key.empty() && f.key == key) {
        hint = " (did you mean '" + f.full_key() + "'?)";
        break;
      }
    }
    MOEPEAK_INPUT_ERROR(where,
                        ": expected section.key=value with the key's section, as in "
                        "--set training.steps=50",
                        hint);
  }
  std::string section = key.substr(0, dot);
  std::string name = key.substr(dot + 1);
  if (!config_schema::find_section(section)) {
    MOEPEAK_INPUT_ERROR(where, ": unknown section [", section, "]", section_suggestion(section));
  }
  const Field* field = config_schema::find_field(section, name);
  if (!field) {
    MOEPEAK_INPUT_ERROR(where, ": unknown key '", key, "'", key_suggestion(section, name));
  }
  assign(cfg, *field, read_override_value(*field, value, where), where);
}

// ---- Rules that span keys ------------------------------------------------------------------

// "model.head_dim = 0 (configs/x.toml:9)"
std::string shown(const Config& cfg, const std::string& key) {
  return key + " = " + config_value_toml(cfg, key) + " (" + cfg.origin(key) + ")";
}

void check_cross_field_rules(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  const TrainingConfig& t = cfg.training;
  if (m.num_attention_heads % m.num_key_value_heads != 0) {
    MOEPEAK_INPUT_ERROR("invalid config: ", shown(cfg, "model.num_attention_heads"),
                        " must be a multiple of ", shown(cfg, "model.num_key_value_heads"));
  }
  if (m.num_experts_per_tok > m.num_local_experts) {
    MOEPEAK_INPUT_ERROR("invalid config: ", shown(cfg, "model.num_experts_per_tok"),
                        " must be <= ", shown(cfg, "model.num_local_experts"));
  }
  if (m.head_dim == 0 && m.hidden_size % m.num_attention_heads != 0) {
    MOEPEAK_INPUT_ERROR("invalid config: ", shown(cfg, "model.head_dim"),
                        " takes hidden_size / num_attention_heads, but ",
                        shown(cfg, "model.hidden_size"), " is not a multiple of ",
                        shown(cfg, "model.num_attention_heads"),
                        "; set model.head_dim explicitly or change one of them");
  }
  if (m.head_dim_resolved() % 2 != 0) {
    if (m.head_dim != 0) {
      MOEPEAK_INPUT_ERROR("invalid config: ", shown(cfg, "model.head_dim"),
                          " must be even (RoPE rotates pairs)");
    }
    MOEPEAK_INPUT_ERROR("invalid config: ", shown(cfg, "model.head_dim"),
                        " resolves to hidden_size / num_attention_heads = ", m.head_dim_resolved(),
                        ", which must be even (RoPE rotates pairs); ",
                        shown(cfg, "model.hidden_size"), ", ",
                        shown(cfg, "model.num_attention_heads"));
  }
  if (!m.layer_types.empty() && static_cast<int64_t>(m.layer_types.size()) != m.num_hidden_layers) {
    MOEPEAK_INPUT_ERROR("invalid config: model.layer_types (", cfg.origin("model.layer_types"),
                        ") lists ", m.layer_types.size(), " layers, but ",
                        shown(cfg, "model.num_hidden_layers"), "; list every layer or none");
  }
  for (size_t i = 0; i < m.mlp_only_layers.size(); ++i) {
    if (m.mlp_only_layers[i] >= m.num_hidden_layers) {
      MOEPEAK_INPUT_ERROR("invalid config: model.mlp_only_layers[", i, "] = ", m.mlp_only_layers[i],
                          " (", cfg.origin("model.mlp_only_layers"), ") is not a layer of ",
                          shown(cfg, "model.num_hidden_layers"));
    }
  }
  // NOTES: dynamic NTK scaling is for sequences past max_position_embeddings (its base grows with
  // the length); every other RoPE type moves max_position_embeddings itself to the new context.
  if (t.seq_len > m.max_position_embeddings && m.rope_type != RopeType::dynamic) {
    MOEPEAK_INPUT_ERROR("invalid config: ", shown(cfg, "training.seq_len"),
                        " must be <= ", shown(cfg, "model.max_position_embeddings"));
  }
  if (t.dataset != DatasetKind::copy && t.dataset_path.empty() && t.datasets.empty()) {
    MOEPEAK_INPUT_ERROR("invalid config: ", shown(cfg, "training.dataset"),
                        " needs a data file, but training.dataset_path is empty (",
                        cfg.origin("training.dataset_path"), ")");
  }
  if (!t.datasets.empty() && !t.dataset_path.empty()) {
    MOEPEAK_INPUT_ERROR("invalid config: training.datasets (", cfg.origin("training.datasets"),
                        ") and training.dataset_path (", cfg.origin("training.dataset_path"),
                        ") are both set; a run reads one dataset or one blend");
  }
  if (cfg.eval.enabled() && t.dataset == DatasetKind::copy) {
    MOEPEAK_INPUT_ERROR("invalid config: eval.dataset_path (", cfg.origin("eval.dataset_path"),
                        ") is read in training.dataset's format, but ",
                        shown(cfg, "training.dataset"),
                        " is not a token file's; set training.dataset = \"bin\" or \"megatron\"");
  }
  for (size_t i = 0; i < t.datasets.size(); ++i) {
    if (!t.datasets[i].dataset && t.dataset == DatasetKind::copy) {
      MOEPEAK_INPUT_ERROR("invalid config: training.datasets[", i, "] (", t.datasets[i].path,
                          ") names no format and ", shown(cfg, "training.dataset"),
                          " is not a token file's; set training.dataset = \"bin\" or "
                          "\"megatron\", or dataset = ... in the entry");
    }
  }
  if (m.eos_token_id >= m.vocab_size) {
    MOEPEAK_INPUT_ERROR("invalid config: ", shown(cfg, "model.eos_token_id"), " is not a token of ",
                        shown(cfg, "model.vocab_size"));
  }
  const bool documents = t.document_mask || t.reset_position_ids;
  const char* const documents_key =
      t.document_mask ? "training.document_mask" : "training.reset_position_ids";
  // NOTES: before model.init_from's config.json is merged (with_init_from_model checks the merged
  // config again) the EOS may still come from it.
  const bool eos_from_checkpoint = !m.init_from.empty() && !cfg.origins.count("model.eos_token_id");
  if (documents && t.document_boundaries == DocumentBoundaries::eos && m.eos_token_id < 0 &&
      !eos_from_checkpoint) {
    MOEPEAK_INPUT_ERROR("invalid config: ", shown(cfg, documents_key),
                        " cuts windows at model.eos_token_id, but none is set (",
                        cfg.origin("model.eos_token_id"),
                        "); set model.eos_token_id (model.init_from reads config.json's), or "
                        "training.document_boundaries = \"index\" for a Megatron dataset");
  }
  // NOTES: dynamic NTK scales RoPE by the sequence's length (transformers: its largest position
  // + 1); a window of documents with positions restarting has no one length, and each document
  // alone would be scaled by its own.
  if (t.reset_position_ids && m.rope_type == RopeType::dynamic) {
    MOEPEAK_INPUT_ERROR("invalid config: ", shown(cfg, "training.reset_position_ids"), " with ",
                        shown(cfg, "model.rope_type"),
                        ": dynamic scaling follows the sequence's length, which a window of "
                        "documents restarting their positions does not have; use yarn, linear or "
                        "llama3 scaling, or keep the window's positions");
  }
  if (documents && t.document_boundaries == DocumentBoundaries::index) {
    bool all_megatron = t.datasets.empty() ? t.dataset == DatasetKind::megatron : true;
    for (const DatasetSource& source : t.datasets)
      all_megatron &= source.dataset.value_or(t.dataset) == DatasetKind::megatron;
    if (!all_megatron) {
      MOEPEAK_INPUT_ERROR("invalid config: ", shown(cfg, "training.document_boundaries"),
                          " takes the documents from a Megatron dataset's index, but ",
                          shown(cfg, "training.dataset"),
                          t.datasets.empty() ? "" : " (or an entry of training.datasets)",
                          " is not one; use document_boundaries = \"eos\" with "
                          "model.eos_token_id");
    }
  }
}

std::optional<uint64_t> byte_size_setting(const std::string& text, const char* key) {
  if (text == "auto") return std::nullopt;
  std::optional<uint64_t> bytes = parse_bytes(text);
  if (!bytes) MOEPEAK_INPUT_ERROR(key, " is not a byte size: \"", text, "\"");
  return bytes;
}

}  // namespace

std::string JobConfig::run_path() const { return run_dir + "/" + name; }

std::optional<uint64_t> SchedulesConfig::sco_host_budget_bytes() const {
  return byte_size_setting(sco_host_budget, "schedules.sco_host_budget");
}

uint64_t CheckpointConfig::write_buffer_bytes() const {
  return byte_size_setting(write_buffer, "checkpoint.write_buffer").value_or(64ull << 20);
}

std::optional<uint64_t> RuntimeConfig::device_memory_bytes() const {
  return byte_size_setting(device_memory, "runtime.device_memory");
}

std::optional<uint64_t> RuntimeConfig::pinned_memory_bytes() const {
  return byte_size_setting(pinned_memory, "runtime.pinned_memory");
}

std::string Config::origin(const std::string& key) const {
  auto it = origins.find(key);
  return it == origins.end() ? "default" : it->second;
}

bool Config::same_settings(const Config& other) const {
  return job == other.job && model == other.model && training == other.training &&
         parallelism == other.parallelism && schedules == other.schedules &&
         optimizer == other.optimizer && lr_scheduler == other.lr_scheduler &&
         checkpoint == other.checkpoint && eval == other.eval && metrics == other.metrics &&
         runtime == other.runtime;
}

void set_config_value(Config& cfg, std::string_view key, const std::string& toml_value,
                      const std::string& origin) {
  const size_t dot = key.find('.');
  const Field* field = dot == std::string_view::npos
                           ? nullptr
                           : config_schema::find_field(std::string(key.substr(0, dot)),
                                                       std::string(key.substr(dot + 1)));
  if (!field) MOEPEAK_THROW("set_config_value: unknown key '", key, "'");
  assign(cfg, *field, read_override_value(*field, toml_value, origin), origin);
}

void check_config(const Config& cfg) { check_cross_field_rules(cfg); }

Config load_config(const std::vector<std::string>& files,
                   const std::vector<std::string>& overrides) {
  Config cfg;
  for (const std::string& path : files) apply_file(cfg, path);
  for (const std::string& text : overrides) apply_override(cfg, text);
  check_cross_field_rules(cfg);
  return cfg;
}

}  // namespace moepeak
