// A training checkpoint out as a Hugging Face model, streamed tensor by tensor (hf_export.h).
#include "core/checkpoint/hf_export.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/error.h"
#include "core/model/param_layout.h"

namespace moepeak {
namespace fs = std::filesystem;

namespace {

// The step directory `checkpoint` names: itself, or what its `latest` points to.
std::string step_directory(const std::string& checkpoint) {
  if (!fs::is_directory(checkpoint)) {
    MOEPEAK_INPUT_ERROR("export: ", checkpoint, " is not a directory");
  }
  if (is_sharded_checkpoint(checkpoint)) return checkpoint;
  if (std::optional<std::string> latest = latest_checkpoint(checkpoint)) {
    if (is_sharded_checkpoint(*latest)) return *latest;
    MOEPEAK_INPUT_ERROR("export: ", *latest,
                        " has no manifest.json: it is a checkpoint of the earlier whole-tensor "
                        "format; resume it and save again to export it");
  }
  if (fs::exists(fs::path(checkpoint) / "model.safetensors")) {
    MOEPEAK_INPUT_ERROR("export: ", checkpoint,
                        " has no manifest.json: it is a checkpoint of the earlier whole-tensor "
                        "format (or already a Hugging Face model); resume it and save again");
  }
  MOEPEAK_INPUT_ERROR("export: ", checkpoint,
                      " holds neither a manifest.json (a checkpoint step directory) nor a "
                      "`latest` file (a checkpoint folder)");
}

std::string shard_file_name(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", k + 1, n);
  return buf;
}

}  // namespace

HfExportSummary export_hf_checkpoint(const std::string& checkpoint, const std::string& out,
                                     const HfExportOptions& options) {
  if (options.dtype != "BF16" && options.dtype != "F32") {
    MOEPEAK_INPUT_ERROR("export: dtype ", options.dtype, " is not one of BF16, F32");
  }
  if (options.max_shard_bytes == 0) MOEPEAK_INPUT_ERROR("export: the shard size must be > 0");
  const size_t buffer_bytes = std::max<uint64_t>(options.buffer_bytes, 4096);
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out))) {
    MOEPEAK_INPUT_ERROR("export: ", out, " already exists; choose a new directory");
  }

  HfExportSummary summary;
  summary.checkpoint = step_directory(checkpoint);
  const std::string config_path = (fs::path(summary.checkpoint) / "config.json").string();
  const ModelConfig model = read_config_json(config_path);
  ShardedCheckpoint source(summary.checkpoint);
  const ParamLayout layout(model);

  // Every weight of the model, checked against the manifest before anything is written.
  struct Item {
    const ShardTensor* tensor;
    uint64_t bytes;  // exported
  };
  std::vector<Item> items;
  const std::string where = "checkpoint " + summary.checkpoint;
  const size_t out_element = safetensors_element_size(options.dtype);
  for (const ParamInfo& p : layout.params()) {
    const ShardTensor& t = source.manifest().tensor(p.name, where);
    if (t.shape != p.shape.dims() || (t.dtype != DType::f32 && t.dtype != DType::bf16)) {
      MOEPEAK_INPUT_ERROR(where, ": tensor \"", p.name, "\" is ", safetensors_dtype_name(t.dtype),
                          " of another shape or dtype than its config.json's model (",
                          p.shape.str(), ", F32 or BF16)");
    }
    items.push_back(Item{&t, static_cast<uint64_t>(t.numel()) * out_element});
  }

  // Greedy packing in model order, as save_pretrained's max_shard_size.
  std::vector<std::vector<const Item*>> files;
  uint64_t filled = 0;
  for (const Item& item : items) {
    if (files.empty() || (filled > 0 && filled + item.bytes > options.max_shard_bytes)) {
      files.emplace_back();
      filled = 0;
    }
    files.back().push_back(&item);
    filled += item.bytes;
    summary.total_bytes += item.bytes;
  }
  summary.files = static_cast<int>(files.size());
  summary.tensors = static_cast<int64_t>(items.size());

  const fs::path target = fs::absolute(out).lexically_normal();
  const fs::path tmp = target.parent_path() / (".tmp_export_" + target.filename().string() + "." +
                                               std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  create_directories(tmp.string());
  try {
    std::vector<char> stage(buffer_bytes);
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t k = 0; k < files.size(); ++k) {
      const std::string name = shard_file_name(static_cast<int>(k), summary.files);
      SafetensorsWriter writer;
      for (const Item* item : files[k]) {
        const ShardTensor& t = *item->tensor;
        const std::string_view from = safetensors_dtype_name(t.dtype);
        // NOTES: the stage holds a chunk as read (first part) and converted (second part);
        // a chunk is as many elements as fit both.
        const size_t in_element = dtype_size(t.dtype);
        const int64_t chunk = static_cast<int64_t>(buffer_bytes / (in_element + out_element));
        // Runs inside writer.write(): captures by value what this loop iteration owns.
        writer.add_streamed(
            t.name, options.dtype, t.shape,
            [&stage, &source, &options, tensor = &t, from, chunk, in_element,
             out_element](FileSink& sink) {
              const ShardTensor& t = *tensor;
              char* converted = stage.data() + static_cast<size_t>(chunk) * in_element;
              for (int64_t b = 0; b < t.numel(); b += chunk) {
                const int64_t e = std::min(t.numel(), b + chunk);
                const size_t n = static_cast<size_t>(e - b);
                source.read(t, b, e, stage.data());
                convert_float_elements(stage.data(), from, converted, options.dtype, n);
                sink.write(converted, n * out_element);
              }
            });
        weight_map[t.name] = name;
      }
      writer.set_metadata("format", "pt");
      writer.write((tmp / name).string());
    }
    const nlohmann::json index = {{"metadata", {{"total_size", summary.total_bytes}}},
                                  {"weight_map", weight_map}};
    write_file_atomically((tmp / "model.safetensors.index.json").string(), index.dump(2) + "\n");
    write_file_atomically(
        (tmp / "config.json").string(),
        model_config_json(model,
                          torch_dtype_name(options.dtype == "BF16" ? DType::bf16 : DType::f32))
                .dump(2) +
            "\n");
    write_file_atomically((tmp / "generation_config.json").string(),
                          nlohmann::json{{"_from_model_config", true}}.dump(2) + "\n");
    if (fs::exists(target)) fs::remove(target);  // the empty directory checked above
    fs::rename(tmp, target, ec);
    if (ec)
      MOEPEAK_INPUT_ERROR("export: cannot move ", tmp.string(), " to ", out, ": ", ec.message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return summary;
}

}  // namespace moepeak
