// A training checkpoint out as a Hugging Face model, streamed tensor by tensor through the
// family's Hub layout (hf_export.h).
#include "core/checkpoint/hf_export.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/mtp_layers.h"
#include "core/checkpoint/mxfp4.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/error.h"
#include "core/model/families/family.h"
#include "core/model/hub_layout.h"
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

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t d = 0; d < dims.size(); ++d) s += (d ? ", " : "") + std::to_string(dims[d]);
  return s + ")";
}

int64_t product(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// Calls f(index) for each index of the dims before the last of `box`, in row-major order (the
// last dim is the caller's inner loop); nothing for an empty box.
template <typename F>
void for_each_row_of(const std::vector<int64_t>& box, F&& f) {
  for (int64_t d : box) {
    if (d == 0) return;
  }
  const int outer = static_cast<int>(box.size()) - 1;
  std::vector<int64_t> at(box.size(), 0);
  while (true) {
    f(at);
    int k = outer - 1;
    for (; k >= 0; --k) {
      if (++at[k] < box[k]) break;
      at[k] = 0;
    }
    if (k < 0) return;
  }
}

// A param of a Hub tensor as the export reads it: its checkpoint tensor and its placement (in
// the Hub tensor, or in its MXFP4 decode).
struct PlacedParam {
  const ShardTensor* source;
  HubPlacement placement;
  std::vector<int64_t> dims;
};

// Whole rows of a Hub tensor (or of its MXFP4 decode), `row` elements each, assembled from the
// params placed in it and converted to `dtype`. NOTES: for rows [r0, r1) each param gives the
// values of its largest-stride dim whose slices start in them — each slice lies within one row
// (family.h) — so its part is a box of the param, read as runs of its last dim (merged where
// they touch) and scattered to its Hub elements.
class RowAssembler {
 public:
  RowAssembler(ShardedCheckpoint& checkpoint, std::vector<PlacedParam> params, int64_t row,
               std::string dtype)
      : checkpoint_(checkpoint), params_(std::move(params)), row_(row), dtype_(std::move(dtype)) {}

  // Bytes of staging per element of a chunk: read, converted and assembled.
  size_t staging_per_element() const {
    size_t in = 0;
    for (const PlacedParam& p : params_) in = std::max(in, dtype_size(p.source->dtype));
    return in + 2 * safetensors_element_size(dtype_);
  }

  void rows(int64_t r0, int64_t r1, char* out) {
    const int64_t c0 = r0 * row_, c1 = r1 * row_;
    const size_t out_element = safetensors_element_size(dtype_);
    int64_t assembled = 0;  // elements written: the params tile the rows
    for (const PlacedParam& p : params_) {
      const HubPlacement& at = p.placement;
      const int outer = hub_order_dims(at)[0];
      const int64_t s0 = at.strides[outer], n0 = p.dims[outer];
      auto first_slice_at = [&](int64_t c) {
        return std::clamp<int64_t>(c <= at.offset ? 0 : (c - at.offset + s0 - 1) / s0, 0, n0);
      };
      const int64_t v0 = first_slice_at(c0), v1 = first_slice_at(c1);
      if (v0 >= v1) continue;
      std::vector<int64_t> box = p.dims, low(p.dims.size(), 0);
      box[outer] = v1 - v0;
      low[outer] = v0;
      const int64_t count = product(box);
      const size_t in_element = dtype_size(p.source->dtype);
      read_.resize(static_cast<size_t>(count) * in_element);
      converted_.resize(static_cast<size_t>(count) * out_element);
      // The box as runs of the param's last dim, in the box's row-major order.
      const size_t last = p.dims.size() - 1;
      std::vector<int64_t> row_major(p.dims.size(), 1);
      for (size_t k = last; k > 0; --k) row_major[k - 1] = row_major[k] * p.dims[k];
      int64_t run_begin = 0, run_end = 0, done = 0;
      auto flush = [&] {
        if (run_end == run_begin) return;
        checkpoint_.read(*p.source, run_begin, run_end,
                         read_.data() + static_cast<size_t>(done) * in_element);
        done += run_end - run_begin;
      };
      for_each_row_of(box, [&](const std::vector<int64_t>& index) {
        int64_t first = low[last];
        for (size_t k = 0; k < last; ++k) first += (low[k] + index[k]) * row_major[k];
        if (first != run_end) {
          flush();
          run_begin = first;
          run_end = first;
        }
        run_end += box[last];
      });
      flush();
      convert_float_elements(read_.data(), safetensors_dtype_name(p.source->dtype),
                             converted_.data(), dtype_, static_cast<size_t>(count));
      int64_t j = 0;
      for_each_row_of(box, [&](const std::vector<int64_t>& index) {
        int64_t hub = at.offset + low[last] * at.strides[last] - c0;
        for (size_t k = 0; k < last; ++k) hub += (low[k] + index[k]) * at.strides[k];
        MOEPEAK_CHECK(hub >= 0 && hub + (box[last] - 1) * at.strides[last] < c1 - c0, at.tensor,
                      ": a slice of a param leaves rows ", r0, "..", r1 - 1);
        for (int64_t i = 0; i < box[last]; ++i, ++j) {
          std::memcpy(out + static_cast<size_t>(hub + i * at.strides[last]) * out_element,
                      converted_.data() + static_cast<size_t>(j) * out_element, out_element);
        }
      });
      assembled += count;
    }
    MOEPEAK_CHECK(assembled == c1 - c0, "rows ", r0, "..", r1 - 1, " of a Hub tensor: ", assembled,
                  " of their ", c1 - c0, " elements placed");
  }

 private:
  ShardedCheckpoint& checkpoint_;
  std::vector<PlacedParam> params_;
  int64_t row_;
  std::string dtype_;
  std::vector<char> read_, converted_;
};

// What one tensor of the export is: a Hub tensor in the export's dtype, one half of an MXFP4
// pair, or a tensor of a carried file (the MTP layers) as stored.
enum class ExportPart { values, mxfp4_blocks, mxfp4_scales, carried };

struct Item {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  const HubTensor* tensor = nullptr;
  ExportPart part = ExportPart::values;
  const SafetensorsFile* carried = nullptr;  // ExportPart::carried: the file holding it
};

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

  const HubLayout hub(layout);
  const bool mxfp4 = options.quantize == "mxfp4";
  if (!options.quantize.empty() && !mxfp4) {
    MOEPEAK_INPUT_ERROR("export: --quantize ", options.quantize, " is not one of: mxfp4");
  }
  const std::string_view family = enum_name(model.model_type);
  if (mxfp4 && !hub.has_mxfp4()) {
    MOEPEAK_INPUT_ERROR("export --quantize mxfp4: the ", family,
                        " family has no MXFP4 tensors (only gpt_oss's experts are released so)");
  }

  // Every weight of the model, checked against the manifest before anything is written.
  const std::string where = "checkpoint " + summary.checkpoint;
  std::vector<const ShardTensor*> sources;
  for (const ParamInfo& p : layout.params()) {
    const ShardTensor& t = source.manifest().tensor(p.name, where);
    if (t.shape != p.shape.dims() || (t.dtype != DType::f32 && t.dtype != DType::bf16)) {
      MOEPEAK_INPUT_ERROR(where, ": tensor \"", p.name, "\" is ", safetensors_dtype_name(t.dtype),
                          " of another shape or dtype than its config.json's model (",
                          p.shape.str(), ", F32 or BF16)");
    }
    sources.push_back(&t);
  }
  std::vector<Item> items;
  const size_t out_element = safetensors_element_size(options.dtype);
  for (const HubTensor& t : hub.tensors()) {
    if (!(mxfp4 && t.mxfp4)) {
      items.push_back({t.name, options.dtype, t.shape,
                       static_cast<uint64_t>(t.numel()) * out_element, &t, ExportPart::values});
      continue;
    }
    // The decode [..., rows, cols] is X with its last two dims swapped.
    std::vector<int64_t> decoded = t.shape;
    std::swap(decoded[decoded.size() - 1], decoded[decoded.size() - 2]);
    const int64_t cols = decoded.back();
    if (cols % kMxfp4BlockSize != 0) {
      MOEPEAK_INPUT_ERROR("export --quantize mxfp4: tensor \"", t.name, "\" ", dims_text(t.shape),
                          " is stored as its ", dims_text(decoded), ", whose rows of ", cols,
                          " are not whole MXFP4 blocks of ", kMxfp4BlockSize);
    }
    std::vector<int64_t> scales = decoded, blocks = decoded;
    scales.back() = cols / kMxfp4BlockSize;
    blocks.back() = cols / kMxfp4BlockSize;
    blocks.push_back(kMxfp4BytesPerBlock);
    items.push_back({t.name + "_blocks", "U8", blocks, static_cast<uint64_t>(product(blocks)), &t,
                     ExportPart::mxfp4_blocks});
    items.push_back({t.name + "_scales", "U8", scales, static_cast<uint64_t>(product(scales)), &t,
                     ExportPart::mxfp4_scales});
  }

  // The carried files' tensors (the MTP layers, core/checkpoint/mtp_layers.h) after the model's,
  // as stored: each file proven against the manifest's checksums first.
  std::vector<SafetensorsFile> carried_files;
  carried_files.reserve(source.manifest().carried.size());
  for (const ShardFileInfo& f : source.manifest().carried) {
    verify_carried_file(summary.checkpoint, f);
    carried_files.push_back(
        SafetensorsFile::open((fs::path(summary.checkpoint) / f.name).string()));
  }
  for (const SafetensorsFile& f : carried_files) {
    for (const std::string& name : f.names()) {
      if (hub.find(name) >= 0) {
        MOEPEAK_INPUT_ERROR(f.path(), ": carried tensor \"", name,
                            "\" is also a weight of the model; which one is meant?");
      }
      const SafetensorsTensorInfo& info = f.info(name);
      items.push_back({name, info.dtype, info.shape, info.bytes, nullptr, ExportPart::carried, &f});
      summary.carried_tensors += 1;
    }
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
  // Writes one item's bytes (inside writer.write(), tensor by tensor).
  auto produce = [&](const Item& item, FileSink& sink) {
    if (item.part == ExportPart::carried) {
      // NOTES: bytes as stored, whatever their dtype (FP8 and its scales included): transformers
      // has no module for the MTP layers and leaves them out on load, and a server that runs
      // them reads them as released.
      std::vector<char> stage(static_cast<size_t>(std::min<uint64_t>(item.bytes, buffer_bytes)));
      for (uint64_t at = 0; at < item.bytes; at += stage.size()) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(stage.size(), item.bytes - at));
        item.carried->read_bytes(item.name, static_cast<size_t>(at), stage.data(), n);
        sink.write(stage.data(), n);
      }
      return;
    }
    const HubTensor& t = *item.tensor;
    if (item.part == ExportPart::values && hub.is_whole(t)) {
      // NOTES: one param as it is: chunks of elements as read (first part of the stage) and
      // converted (second part); a chunk is as many elements as fit both.
      const ShardTensor& st = *sources[static_cast<size_t>(t.params[0])];
      const std::string_view from = safetensors_dtype_name(st.dtype);
      const size_t in_element = dtype_size(st.dtype);
      const int64_t chunk = static_cast<int64_t>(buffer_bytes / (in_element + out_element));
      std::vector<char> stage(static_cast<size_t>(std::min(chunk, st.numel())) *
                              (in_element + out_element));
      char* converted =
          stage.data() + static_cast<size_t>(std::min(chunk, st.numel())) * in_element;
      for (int64_t b = 0; b < st.numel(); b += chunk) {
        const int64_t e = std::min(st.numel(), b + chunk);
        const size_t n = static_cast<size_t>(e - b);
        source.read(st, b, e, stage.data());
        convert_float_elements(stage.data(), from, converted, options.dtype, n);
        sink.write(converted, n * out_element);
      }
      return;
    }
    // A fused tensor, or the MXFP4 decode of one ([..., rows, cols]: the Hub tensor with its last
    // two dims swapped), assembled by whole rows.
    const bool packed = item.part != ExportPart::values;
    std::vector<PlacedParam> placed;
    for (int p : t.params) {
      const std::vector<int64_t> dims = layout.params()[static_cast<size_t>(p)].shape.dims();
      placed.push_back({sources[static_cast<size_t>(p)],
                        packed ? mxfp4_decoded_placement(hub.placement(p), dims) : hub.placement(p),
                        dims});
    }
    std::vector<int64_t> shape = t.shape;
    if (packed) std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
    const int64_t row = shape.back(), rows = product(shape) / row;
    const std::string dtype = packed ? "F32" : options.dtype;
    RowAssembler assembler(source, std::move(placed), row, dtype);
    const size_t per_element = assembler.staging_per_element() + (packed ? 1 : 0);
    const int64_t chunk_rows =
        std::max<int64_t>(1, static_cast<int64_t>(buffer_bytes / (row * per_element)));
    const size_t element = safetensors_element_size(dtype);
    std::vector<char> assembled(static_cast<size_t>(std::min(chunk_rows, rows) * row) * element);
    std::vector<uint8_t> blocks, scales;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t r1 = std::min(rows, r0 + chunk_rows);
      const int64_t n = (r1 - r0) * row;
      assembler.rows(r0, r1, assembled.data());
      if (!packed) {
        sink.write(assembled.data(), static_cast<size_t>(n) * element);
        continue;
      }
      blocks.resize(static_cast<size_t>(n / 2));
      scales.resize(static_cast<size_t>(n / kMxfp4BlockSize));
      try {
        mxfp4_quantize(t.name,
                       std::span<const float>(reinterpret_cast<const float*>(assembled.data()),
                                              static_cast<size_t>(n)),
                       Shape{r1 - r0, row}, blocks, scales);
      } catch (const Error& e) {
        MOEPEAK_INPUT_ERROR("export --quantize mxfp4: ", where, ": rows ", r0, "..", r1 - 1, " of ",
                            dims_text(shape), " (the MXFP4 decode of \"", t.name,
                            "\"): ", nested_message(e));
      }
      const bool first = item.part == ExportPart::mxfp4_blocks;
      sink.write(first ? blocks.data() : scales.data(), first ? blocks.size() : scales.size());
    }
  };

  try {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t k = 0; k < files.size(); ++k) {
      const std::string name = shard_file_name(static_cast<int>(k), summary.files);
      SafetensorsWriter writer;
      for (const Item* item : files[k]) {
        writer.add_streamed(item->name, item->dtype, item->shape,
                            [&produce, item](FileSink& sink) { produce(*item, sink); });
        weight_map[item->name] = name;
      }
      writer.set_metadata("format", "pt");
      writer.write((tmp / name).string());
    }
    const nlohmann::json index = {{"metadata", {{"total_size", summary.total_bytes}}},
                                  {"weight_map", weight_map}};
    write_file_atomically((tmp / "model.safetensors.index.json").string(), index.dump(2) + "\n");
    nlohmann::json config = model_config_json(
        model, torch_dtype_name(options.dtype == "BF16" ? DType::bf16 : DType::f32));
    if (mxfp4) {
      nlohmann::json modules = nlohmann::json::array();
      for (std::string_view m : family_of(model.model_type).mxfp4_modules_to_not_convert) {
        modules.push_back(std::string(m));
      }
      config["quantization_config"] = {{"quant_method", "mxfp4"},
                                       {"modules_to_not_convert", modules}};
    }
    write_file_atomically((tmp / "config.json").string(), config.dump(2) + "\n");
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
