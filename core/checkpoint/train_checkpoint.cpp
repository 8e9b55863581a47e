#include "core/checkpoint/train_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint/atomic_file.h"
#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/safetensors.h"
#include "core/error.h"

namespace moepeak {
namespace fs = std::filesystem;

namespace {

void upload(const Tensor& t, const std::vector<char>& host, Backend& backend, Stream& stream) {
  backend.copy_async(t.data(), host.data(), host.size(), CopyKind::host_to_device, stream);
  stream.synchronize();
}

std::vector<int64_t> dims(const Shape& s) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.ndim(); ++i) d.push_back(s[i]);
  return d;
}

std::string hex(const std::vector<uint8_t>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::vector<uint8_t> unhex(const std::string& text, const std::string& where) {
  MOEPEAK_CHECK(text.size() % 2 == 0, where, ": malformed hex string");
  std::vector<uint8_t> out;
  for (size_t i = 0; i < text.size(); i += 2) {
    auto nibble = [&](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      MOEPEAK_THROW(where, ": malformed hex string");
    };
    out.push_back(static_cast<uint8_t>(nibble(text[i]) * 16 + nibble(text[i + 1])));
  }
  return out;
}

// Reads tensor `name` of `file` into device tensor `t`, checking dtype and shape.
void read_into(const SafetensorsFile& file, const std::string& name, const Tensor& t, Backend& backend,
               Stream& stream) {
  if (!file.contains(name)) MOEPEAK_THROW(file.path(), ": no tensor '", name, "'");
  const SafetensorsTensorInfo& info = file.info(name);
  if (info.dtype != safetensors_dtype_name(t.dtype()) || info.shape != dims(t.shape())) {
    std::ostringstream got;
    for (int64_t d : info.shape) got << d << ",";
    MOEPEAK_THROW(file.path(), ": tensor '", name, "' is ", info.dtype, " (", got.str(),
                  ") but this model expects ", t.str());
  }
  std::vector<char> host(t.nbytes());
  file.read(name, host.data(), host.size());
  upload(t, host, backend, stream);
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

void write_params_safetensors(const std::string& path, const ParamStore& params, bool gradients,
                              Backend& backend, Stream& stream) {
  std::vector<char> flat = copy_to_host(gradients ? params.flat_grads() : params.flat_values(), backend, stream);
  SafetensorsWriter writer;
  const size_t elem = dtype_size(params.dtype());
  for (const ParamInfo& p : params.layout().params()) {
    writer.add(p.name, params.dtype(), dims(p.shape), flat.data() + p.offset * elem,
               static_cast<size_t>(p.shape.numel()) * elem);
  }
  writer.set_metadata("format", "pt");
  writer.write(path);
}

void save_checkpoint(const std::string& folder, int64_t step, const ModelConfig& model,
                     const ParamStore& params, const schedules::ResidentAdamW& optimizer,
                     const DataLoader& loader, Backend& backend, Stream& stream, int64_t keep_latest) {
  create_directories(folder);
  const std::string name = checkpoint_dir_name(step);
  const fs::path final_dir = fs::path(folder) / name;
  const fs::path tmp_dir = fs::path(folder) / (".tmp_" + name);
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  create_directories(tmp_dir.string());

  write_params_safetensors((tmp_dir / "model.safetensors").string(), params, false, backend, stream);
  write_config_json((tmp_dir / "config.json").string(), model);
  {
    std::vector<char> m = copy_to_host(optimizer.m(), backend, stream);
    std::vector<char> v = copy_to_host(optimizer.v(), backend, stream);
    SafetensorsWriter writer;
    const int64_t n = params.layout().total_elements();
    writer.add("optimizer.exp_avg", params.dtype(), {n}, m.data(), m.size());
    writer.add("optimizer.exp_avg_sq", params.dtype(), {n}, v.data(), v.size());
    writer.set_metadata("step", std::to_string(step));
    writer.set_metadata("data_loader_state", hex(loader.state()));
    writer.set_metadata("param_elements", std::to_string(n));
    writer.write((tmp_dir / "rank_00000.safetensors").string());
  }
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) MOEPEAK_THROW("cannot move checkpoint ", tmp_dir.string(), " into place: ", ec.message());
  write_file_atomically((fs::path(folder) / "latest").string(), name + "\n");

  // Keep the newest keep_latest step directories.
  std::vector<std::string> steps;
  for (const auto& entry : fs::directory_iterator(folder)) {
    std::string n = entry.path().filename().string();
    if (entry.is_directory() && n.rfind("step_", 0) == 0) steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + static_cast<size_t>(keep_latest) < steps.size(); ++i) {
    fs::remove_all(fs::path(folder) / steps[i], ec);
  }
}

std::optional<std::string> latest_checkpoint(const std::string& folder) {
  std::ifstream in(fs::path(folder) / "latest");
  std::string name;
  if (!in || !(in >> name)) return std::nullopt;
  fs::path dir = fs::path(folder) / name;
  if (!fs::is_directory(dir)) {
    MOEPEAK_THROW(folder, "/latest names ", name, " but that directory does not exist");
  }
  return dir.string();
}

int64_t load_checkpoint(const std::string& dir, const ModelConfig& model, ParamStore& params,
                        schedules::ResidentAdamW& optimizer, DataLoader& loader, Backend& backend,
                        Stream& stream) {
  const fs::path root(dir);
  {
    std::ifstream in(root / "config.json");
    if (!in) MOEPEAK_THROW("checkpoint ", dir, " has no config.json");
    nlohmann::json j;
    try {
      in >> j;
    } catch (const nlohmann::json::exception& e) {
      MOEPEAK_THROW((root / "config.json").string(), ": ", e.what());
    }
    ModelConfig saved = model_config_from_json(j, (root / "config.json").string());
    ModelConfig expected = model;
    expected.head_dim = expected.head_dim_resolved();  // config.json stores it resolved
    saved.head_dim = saved.head_dim_resolved();
    if (!(saved == expected)) {
      MOEPEAK_THROW("checkpoint ", dir, " was saved for another model shape than [model] in the config");
    }
  }
  SafetensorsFile weights = SafetensorsFile::open((root / "model.safetensors").string());
  for (size_t i = 0; i < params.layout().params().size(); ++i) {
    read_into(weights, params.layout().params()[i].name, params.value(static_cast<int>(i)), backend, stream);
  }
  SafetensorsFile rank = SafetensorsFile::open((root / "rank_00000.safetensors").string());
  read_into(rank, "optimizer.exp_avg", optimizer.m(), backend, stream);
  read_into(rank, "optimizer.exp_avg_sq", optimizer.v(), backend, stream);
  const auto& meta = rank.metadata();
  auto field = [&](const std::string& key) -> const std::string& {
    auto it = meta.find(key);
    if (it == meta.end()) MOEPEAK_THROW(rank.path(), ": metadata has no '", key, "'");
    return it->second;
  };
  loader.restore(unhex(field("data_loader_state"), rank.path()));
  int64_t step = 0;
  try {
    step = std::stoll(field("step"));
  } catch (const std::exception&) {
    MOEPEAK_THROW(rank.path(), ": metadata 'step' is not a number: ", field("step"));
  }
  return step;
}

void write_step_dump(const std::string& dir, const ModelConfig& model, const ParamStore& params,
                     const std::vector<int64_t>& input_ids, const std::vector<int64_t>& labels,
                     int64_t batch, int64_t seq_len, double loss, Backend& backend, Stream& stream) {
  create_directories(dir);
  const fs::path root(dir);
  write_params_safetensors((root / "model.safetensors").string(), params, false, backend, stream);
  write_params_safetensors((root / "grads.safetensors").string(), params, true, backend, stream);
  write_config_json((root / "config.json").string(), model);
  SafetensorsWriter writer;
  writer.add("input_ids", DType::i64, {batch, seq_len}, input_ids.data(), input_ids.size() * 8);
  writer.add("labels", DType::i64, {batch, seq_len}, labels.data(), labels.size() * 8);
  writer.write((root / "batch.safetensors").string());
  nlohmann::json j = {{"loss", loss}};
  write_file_atomically((root / "loss.json").string(), j.dump(2) + "\n");
}

}  // namespace moepeak
