#include "core/checkpoint/train_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/comm/comm.h"
#include "core/error.h"
#include "core/model/hub_layout.h"

namespace moepeak {
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> unhex(const std::string& text, const std::string& where) {
  MOEPEAK_CHECK_INPUT(text.size() % 2 == 0, where, ": malformed hex string");
  std::vector<uint8_t> out;
  for (size_t i = 0; i < text.size(); i += 2) {
    auto nibble = [&](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      MOEPEAK_INPUT_ERROR(where, ": malformed hex string");
    };
    out.push_back(static_cast<uint8_t>(nibble(text[i]) * 16 + nibble(text[i + 1])));
  }
  return out;
}

// Reads tensor `name` of `file` (the full tensor of param `index`) and keeps this rank's part of
// it in `flat` (laid out like the store's values: the weights, or an optimizer state), checking
// dtype (flat's) and shape.
void read_into(const SafetensorsFile& file, const std::string& name, ZeroParamStore& params,
               int index, const Tensor& flat, Stream& stream) {
  if (!file.contains(name)) MOEPEAK_INPUT_ERROR(file.path(), ": no tensor '", name, "'");
  const SafetensorsTensorInfo& info = file.info(name);
  const ParamInfo& p = params.layout().params()[index];
  if (info.dtype != safetensors_dtype_name(flat.dtype()) || info.shape != p.shape.dims()) {
    std::ostringstream got;
    for (int64_t d : info.shape) got << d << ",";
    MOEPEAK_INPUT_ERROR(file.path(), ": tensor '", name, "' is ", info.dtype, " (", got.str(),
                        ") but this model expects ", safetensors_dtype_name(flat.dtype()), " ",
                        p.shape.str());
  }
  std::vector<char> host(static_cast<size_t>(p.shape.numel()) * dtype_size(flat.dtype()));
  file.read(name, host.data(), host.size());
  params.load_full(index, host.data(), flat, stream);
}

// The full tensors of every param from `flat` (values, grads, or an optimizer state), gathered on
// every rank (collective) and kept on rank 0 only, in layout order.
std::vector<std::vector<char>> gather_all(const ZeroParamStore& params, const Tensor& flat,
                                          Stream& stream) {
  std::vector<std::vector<char>> full(params.layout().params().size());
  for (size_t i = 0; i < full.size(); ++i) {
    std::vector<char> t = params.gather_full(static_cast<int>(i), flat, stream);
    if (params.rank() == 0) full[i] = std::move(t);
  }
  return full;
}

// Adds the Hub's tensors (HubLayout) made of the full params `full` (layout order, `dtype`): a
// param that is a Hub tensor of its own as it is, a fused one (gpt-oss's experts) assembled into
// a buffer of `fused`, which must outlive the writer's write().
void add_hub_tensors(SafetensorsWriter& writer, const ZeroParamStore& params,
                     const std::vector<std::vector<char>>& full, DType dtype,
                     std::vector<std::vector<char>>& fused) {
  const ParamLayout& layout = params.layout();
  const HubLayout hub(layout);
  const size_t element = dtype_size(dtype);
  for (const HubTensor& t : hub.tensors()) {
    if (hub.is_whole(t)) {
      const std::vector<char>& bytes = full[static_cast<size_t>(t.params[0])];
      writer.add(t.name, dtype, t.shape, bytes.data(), bytes.size());
      continue;
    }
    std::vector<char>& bytes = fused.emplace_back(static_cast<size_t>(t.numel()) * element);
    for (int p : t.params) {
      const char* from = full[static_cast<size_t>(p)].data();
      for_each_in_hub_order(hub.placement(p), layout.params()[static_cast<size_t>(p)].shape.dims(),
                            [&](int64_t param, int64_t at) {
                              std::memcpy(bytes.data() + static_cast<size_t>(at) * element,
                                          from + static_cast<size_t>(param) * element, element);
                            });
    }
    writer.add(t.name, dtype, t.shape, bytes.data(), bytes.size());
  }
}

// Runs `write` on rank 0 and makes its outcome every rank's (run_and_agree).
void write_on_rank0(const ZeroParamStore& params, Stream& stream, const std::string& what,
                    const std::function<void()>& write) {
  run_and_agree(params, stream, what, params.rank() == 0, write);
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

void write_params_safetensors(const std::string& path, const ZeroParamStore& params, bool gradients,
                              Stream& stream) {
  auto full = gather_all(params, gradients ? params.flat_grads() : params.flat_values(), stream);
  write_on_rank0(params, stream, path, [&] {
    SafetensorsWriter writer;
    std::vector<std::vector<char>> fused;
    add_hub_tensors(writer, params, full, gradients ? params.grad_dtype() : params.dtype(), fused);
    writer.set_metadata("format", "pt");
    writer.write(path);
  });
}

void save_checkpoint(const std::string& folder, int64_t step, const ModelConfig& model,
                     const ZeroParamStore& params, const schedules::Optimizer& optimizer,
                     const DataLoader& loader, Stream& stream, int64_t keep_latest,
                     uint64_t write_buffer_bytes, const std::optional<CarriedFile>& carried) {
  save_sharded_checkpoint(folder, checkpoint_dir_name(step), step, model, params, optimizer, loader,
                          stream, keep_latest, write_buffer_bytes, carried);
}

std::optional<std::string> latest_checkpoint(const std::string& folder) {
  std::ifstream in(fs::path(folder) / "latest");
  std::string name;
  if (!in || !(in >> name)) return std::nullopt;
  fs::path dir = fs::path(folder) / name;
  if (!fs::is_directory(dir)) {
    MOEPEAK_INPUT_ERROR(folder, "/latest names ", name, " but that directory does not exist");
  }
  return dir.string();
}

int64_t load_checkpoint(const std::string& dir, const ModelConfig& model, ZeroParamStore& params,
                        schedules::Optimizer& optimizer, DataLoader& loader, Stream& stream) {
  const fs::path root(dir);
  {
    std::ifstream in(root / "config.json");
    if (!in) MOEPEAK_INPUT_ERROR("checkpoint ", dir, " has no config.json");
    nlohmann::json j;
    try {
      in >> j;
    } catch (const nlohmann::json::exception& e) {
      MOEPEAK_INPUT_ERROR((root / "config.json").string(), ": ", e.what());
    }
    ModelConfig saved = model_config_from_json(j, (root / "config.json").string());
    ModelConfig expected = model;
    expected.head_dim = expected.head_dim_resolved();  // config.json stores it resolved
    expected.init_from.clear();                        // where the run began: not a shape
    saved.head_dim = saved.head_dim_resolved();
    if (!(saved == expected)) {
      MOEPEAK_INPUT_ERROR("checkpoint ", dir,
                          " was saved for another model shape than [model] in the config");
    }
  }
  if (is_sharded_checkpoint(dir))
    return load_sharded_checkpoint(dir, params, optimizer, loader, stream);
  // A checkpoint of the earlier whole-tensor format (model.safetensors + optimizer.safetensors).
  const auto& infos = params.layout().params();
  SafetensorsFile weights = SafetensorsFile::open((root / "model.safetensors").string());
  SafetensorsFile state = SafetensorsFile::open((root / "optimizer.safetensors").string());
  const std::vector<schedules::OptimizerState> states = optimizer.state();
  // A master is loaded when the optimizer keeps one apart from the weights and the checkpoint
  // has it; otherwise it is re-derived from the loaded weights below.
  const bool has_master = !infos.empty() && state.contains("master." + infos[0].name);
  bool master_loaded = false;
  for (size_t i = 0; i < infos.size(); ++i) {
    const int p = static_cast<int>(i);
    read_into(weights, infos[i].name, params, p, params.flat_values(), stream);
    for (const schedules::OptimizerState& st : states) {
      if (st.name == "master" && !has_master) continue;
      read_into(state, st.name + "." + infos[i].name, params, p, st.flat, stream);
      if (st.name == "master") master_loaded = true;
    }
  }
  if (!master_loaded) optimizer.load_master_from_weights(stream);
  const auto& meta = state.metadata();
  auto field = [&](const std::string& key) -> const std::string& {
    auto it = meta.find(key);
    if (it == meta.end()) MOEPEAK_INPUT_ERROR(state.path(), ": metadata has no '", key, "'");
    return it->second;
  };
  try {
    loader.restore(unhex(field("data_loader_state"), state.path()));
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::input || e.message().rfind(state.path(), 0) == 0) throw;
    MOEPEAK_INPUT_ERROR(state.path(), ": ", e.message());  // the loader's words, the file named
  }
  int64_t step = 0;
  try {
    step = std::stoll(field("step"));
  } catch (const std::exception&) {
    MOEPEAK_INPUT_ERROR(state.path(), ": metadata 'step' is not a number: ", field("step"));
  }
  return step;
}

void write_step_dump(const std::string& dir, const ModelConfig& model, const ZeroParamStore& params,
                     const std::vector<int64_t>& input_ids, const std::vector<int64_t>& labels,
                     int64_t batch, int64_t seq_len, double loss, Stream& stream,
                     std::span<const int64_t> positions, std::span<const int32_t> document_starts) {
  const fs::path root(dir);
  const auto weights = gather_all(params, params.flat_values(), stream);
  const auto grads = gather_all(params, params.flat_grads(), stream);
  write_on_rank0(params, stream, "the step dump in " + dir, [&] {
    create_directories(dir);
    // NOTES: the gradients are in grad_dtype (fp32 main grads beside bf16 weights).
    for (const auto& [file, tensors, dtype] :
         {std::tuple{"model.safetensors", &weights, params.dtype()},
          std::tuple{"grads.safetensors", &grads, params.grad_dtype()}}) {
      SafetensorsWriter writer;
      std::vector<std::vector<char>> fused;
      add_hub_tensors(writer, params, *tensors, dtype, fused);
      writer.set_metadata("format", "pt");
      writer.write((root / file).string());
    }
    write_config_json((root / "config.json").string(), model, params.dtype());
    SafetensorsWriter writer;
    writer.add("input_ids", DType::i64, {batch, seq_len}, input_ids.data(), input_ids.size() * 8);
    writer.add("labels", DType::i64, {batch, seq_len}, labels.data(), labels.size() * 8);
    if (!positions.empty()) {
      writer.add("position_ids", DType::i64, {batch, seq_len}, positions.data(),
                 positions.size() * 8);
    }
    if (!document_starts.empty()) {
      writer.add("document_starts", DType::i32, {batch, seq_len}, document_starts.data(),
                 document_starts.size() * 4);
    }
    writer.write((root / "batch.safetensors").string());
    nlohmann::json j = {{"loss", loss}};
    write_file_atomically((root / "loss.json").string(), j.dump(2) + "\n");
  });
}

}  // namespace moepeak
