#include "core/checkpoint/sharded_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json (sidecars, metadata)

#include "core/atomic_file.h"
#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/shard_io.h"
#include "core/checkpoint/shard_manifest.h"
#include "core/comm/comm.h"
#include "core/error.h"
#include "core/fault_injection.h"

namespace moepeak {
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kBlockBytes = kCheckpointBlockBytes;

std::string shard_name(int rank, const char* ext) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard-%05d.%s", rank, ext);
  return buf;
}

// One flat buffer a checkpoint saves, and the prefix of its tensors' names.
struct SavedFlat {
  std::string prefix;  // "" for the weights, "exp_avg." ...
  Tensor flat;
};

std::vector<SavedFlat> saved_flats(const ZeroParamStore& params,
                                   const schedules::Optimizer& optimizer) {
  std::vector<SavedFlat> flats{{"", params.flat_values()}};
  for (const schedules::OptimizerState& st : optimizer.state()) {
    flats.push_back({st.name + ".", st.flat});
  }
  return flats;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) MOEPEAK_INPUT_ERROR(path.string(), ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Fault injection for the crash tests (tests/cli/test_train_ranks.sh, tests/faults/), inert
// unless MOEPEAK_FAULT asks (core/fault_injection.h): "save_shard", a rank half-way through its
// shard file; "save_manifest" (rank 0), manifest.json written into the temporary directory but
// not yet renamed.
void fault_in_save(int64_t step, std::string_view point) { fault_here(point, step); }

// Streams this rank's pieces into its shard file; returns the sidecar: the file's info and
// every slice it holds.
nlohmann::json write_rank_shard(const fs::path& dir, const ZeroParamStore& params,
                                const std::vector<SavedFlat>& flats, const PieceCopy& copy,
                                uint64_t write_buffer_bytes, int64_t step) {
  // A multiple of kShardAlignBytes, so the free part of the buffer always holds whole elements.
  const size_t buffer =
      static_cast<size_t>(write_buffer_bytes / kShardAlignBytes * kShardAlignBytes);
  ShardFileWriter writer((dir / shard_name(params.rank(), "bin")).string(), buffer, kBlockBytes);
  nlohmann::json slices = nlohmann::json::array();
  const auto& infos = params.layout().params();
  for (size_t k = 0; k < flats.size(); ++k) {
    const SavedFlat& f = flats[k];
    if (k == flats.size() / 2) fault_in_save(step, "save_shard");
    const size_t es = dtype_size(f.flat.dtype());
    for (size_t i = 0; i < infos.size(); ++i) {
      const int p = static_cast<int>(i);
      if (!params.writes_checkpoint(p)) continue;
      const auto [begin, end] = *params.stored_range(p);
      if (begin == end) continue;  // all padding
      const uint64_t offset = writer.begin_slice();
      // NOTES: each piece goes straight from its source (the device, or an asynchronous save's
      // snapshot) into the writer's buffer, as many elements as fit at a time, so the buffer is
      // the write's only host memory.
      for (int64_t done = 0; done < end - begin;) {
        std::span<char> room = writer.space();
        const int64_t n =
            std::min<int64_t>(end - begin - done, static_cast<int64_t>(room.size() / es));
        MOEPEAK_CHECK(n > 0, "a shard buffer's free part holds no element");  // 64-byte multiple
        copy(static_cast<int>(k), p, done, n, room.data());
        writer.commit(static_cast<size_t>(n) * es);
        done += n;
      }
      slices.push_back({{"tensor", f.prefix + infos[i].name},
                        {"offset", offset},
                        {"begin", begin},
                        {"end", end}});
    }
  }
  const nlohmann::json file = shard_file_to_json(writer.finish());
  return {{"file", file}, {"slices", std::move(slices)}};
}

// Rank 0: the manifest from every rank's sidecar, tensors in layout order.
ShardManifest merge_sidecars(const fs::path& dir, const ZeroParamStore& params,
                             const std::vector<SavedFlat>& flats, nlohmann::json metadata) {
  ShardManifest m;
  m.block_bytes = kBlockBytes;
  m.metadata = std::move(metadata);
  const auto& infos = params.layout().params();
  std::map<std::string, size_t> index;
  for (const SavedFlat& f : flats) {
    for (const ParamInfo& p : infos) {
      index[f.prefix + p.name] = m.tensors.size();
      m.tensors.push_back({f.prefix + p.name, f.flat.dtype(), p.shape.dims(), {}});
    }
  }
  for (int r = 0; r < params.world_size(); ++r) {
    const fs::path path = dir / shard_name(r, "json");
    // NOTES: a sidecar another rank wrote moments ago; a damaged one (a full disk, a file system
    // that lost it) is named as the file it is, whatever part of it is wrong.
    try {
      const nlohmann::json side = nlohmann::json::parse(read_text(path));
      ShardFileInfo info = shard_file_from_json(side.at("file"), path.string());
      m.files.push_back(std::move(info));
      for (const nlohmann::json& s : side.at("slices")) {
        const std::string name = s.at("tensor").get<std::string>();
        auto it = index.find(name);
        MOEPEAK_CHECK_INPUT(it != index.end(), path.string(), " names a tensor '", name,
                            "' this model does not have");
        m.tensors[it->second].slices.push_back({r, s.at("offset").get<uint64_t>(),
                                                s.at("begin").get<int64_t>(),
                                                s.at("end").get<int64_t>()});
      }
    } catch (const nlohmann::json::exception& e) {
      MOEPEAK_INPUT_ERROR(path.string(), ": not a shard sidecar (", e.what(), ")");
    }
  }
  for (ShardTensor& t : m.tensors) {
    std::sort(t.slices.begin(), t.slices.end(),
              [](const ShardSlice& a, const ShardSlice& b) { return a.begin < b.begin; });
  }
  m.validate((dir / kShardManifestName).string());  // the pieces must tile every tensor
  return m;
}

void remove_old_steps(const std::string& folder, int64_t keep_latest) {
  std::vector<std::string> steps;
  for (const auto& entry : fs::directory_iterator(folder)) {
    std::string n = entry.path().filename().string();
    if (entry.is_directory() && n.rfind("step_", 0) == 0) steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  std::error_code ec;
  for (size_t i = 0; i + static_cast<size_t>(keep_latest) < steps.size(); ++i) {
    fs::remove_all(fs::path(folder) / steps[i], ec);
  }
}

}  // namespace

void link_or_copy_file(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  if (fs::exists(to) && fs::equivalent(from, to, ec)) return;
  // NOTES: through a temporary name, so that `to` is the whole file or the one it replaces; rename
  // over a hard link of the same file would do nothing (POSIX), which the check above rules out.
  const fs::path tmp = to.parent_path() / (".tmp_" + to.filename().string());
  fs::remove(tmp, ec);
  fs::create_hard_link(from, tmp, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec);
  }
  if (!ec) fs::rename(tmp, to, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    MOEPEAK_INPUT_ERROR("cannot link or copy ", from.string(), " to ", to.string(), ": ",
                        ec.message());
  }
}

void run_and_agree(const ZeroParamStore& params, Stream& stream, const std::string& what, bool here,
                   const std::function<void()>& work) {
  std::exception_ptr failure;
  if (here) {
    try {
      work();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  double failed[1] = {failure ? 1.0 : 0.0};
  if (params.world_size() > 1) {
    all_reduce_host(params.comm(), params.backend(), stream, failed, ReduceOp::max);
  }
  if (failure) std::rethrow_exception(failure);
  if (failed[0] != 0) {
    MOEPEAK_INPUT_ERROR("another rank could not write ", what, " (its error is in its log)");
  }
}

CheckpointSave begin_checkpoint_save(const std::string& folder, const std::string& dir_name,
                                     int64_t step, const ModelConfig& model,
                                     const ZeroParamStore& params,
                                     const schedules::Optimizer& optimizer,
                                     const DataLoader& loader, Stream& stream, int64_t keep_latest,
                                     uint64_t write_buffer_bytes,
                                     const std::optional<CarriedFile>& carried) {
  CheckpointSave save;
  save.carried = carried;
  save.folder = folder;
  save.dir_name = dir_name;
  save.step = step;
  save.keep_latest = keep_latest;
  save.write_buffer_bytes = write_buffer_bytes;
  save.model = model;
  const ParallelDegrees& d = params.groups().degrees();
  save.metadata = {{"step", step},
                   {"world_size", params.world_size()},
                   {"expert_parallel", d.expert},
                   {"sequence_parallel", d.sequence},
                   {"data_shard", d.data_shard},
                   {"optimizer_placement", std::string(enum_name(optimizer.placement()))},
                   {"data_loader_state", loader.state()}};
  run_and_agree(params, stream, save.what(), params.rank() == 0, [&] {
    create_directories(folder);
    std::error_code ec;
    fs::remove_all(save.tmp_dir(), ec);  // a save that died part-way
    create_directories(save.tmp_dir().string());
  });
  return save;
}

void write_checkpoint_pieces(const CheckpointSave& save, const ZeroParamStore& params,
                             const schedules::Optimizer& optimizer, const PieceCopy& copy) {
  const nlohmann::json side =
      write_rank_shard(save.tmp_dir(), params, saved_flats(params, optimizer), copy,
                       save.write_buffer_bytes, save.step);
  write_file_atomically((save.tmp_dir() / shard_name(params.rank(), "json")).string(), side.dump());
}

void commit_checkpoint_save(const CheckpointSave& save, const ZeroParamStore& params,
                            const schedules::Optimizer& optimizer, Stream& stream,
                            std::exception_ptr write_failure) {
  try {
    run_and_agree(params, stream, save.what(), true, [&] {
      if (write_failure) std::rethrow_exception(write_failure);
    });
  } catch (...) {
    // Every rank has stopped writing (they agreed on the failure): the part-written directory
    // goes, so a full disk gets its space back; `latest` still names the previous checkpoint.
    if (params.rank() == 0) {
      std::error_code ec;
      fs::remove_all(save.tmp_dir(), ec);
    }
    throw;
  }
  const fs::path tmp_dir = save.tmp_dir(), final_dir = save.final_dir();
  run_and_agree(params, stream, save.what(), params.rank() == 0, [&] {
    ShardManifest m =
        merge_sidecars(tmp_dir, params, saved_flats(params, optimizer), save.metadata);
    if (save.carried) {
      link_or_copy_file(save.carried->path, tmp_dir / save.carried->info.name);
      m.carried.push_back(save.carried->info);
      m.validate((tmp_dir / kShardManifestName).string());
    }
    write_config_json((tmp_dir / "config.json").string(), save.model, params.dtype());
    // NOTES: manifest.json is the directory's last file: a directory without one is never
    // renamed into place, so every checkpoint a reader finds is complete.
    write_file_atomically((tmp_dir / kShardManifestName).string(), m.to_json());
    fault_in_save(save.step, "save_manifest");
    std::error_code ec;
    for (int r = 0; r < params.world_size(); ++r) fs::remove(tmp_dir / shard_name(r, "json"), ec);
    fs::remove_all(final_dir, ec);
    fs::rename(tmp_dir, final_dir, ec);
    if (ec) {
      MOEPEAK_INPUT_ERROR("cannot move checkpoint ", tmp_dir.string(),
                          " into place: ", ec.message());
    }
    write_file_atomically((fs::path(save.folder) / "latest").string(), save.dir_name + "\n");
    remove_old_steps(save.folder, save.keep_latest);
  });
}

void save_sharded_checkpoint(const std::string& folder, const std::string& dir_name, int64_t step,
                             const ModelConfig& model, const ZeroParamStore& params,
                             const schedules::Optimizer& optimizer, const DataLoader& loader,
                             Stream& stream, int64_t keep_latest, uint64_t write_buffer_bytes,
                             const std::optional<CarriedFile>& carried) {
  const CheckpointSave save =
      begin_checkpoint_save(folder, dir_name, step, model, params, optimizer, loader, stream,
                            keep_latest, write_buffer_bytes, carried);
  const std::vector<SavedFlat> flats = saved_flats(params, optimizer);
  std::exception_ptr failure;
  try {
    write_checkpoint_pieces(save, params, optimizer,
                            [&](int flat, int param, int64_t offset, int64_t count, void* dst) {
                              params.copy_piece_to_host(param, flats[flat].flat, offset, count, dst,
                                                        stream);
                            });
  } catch (...) {
    failure = std::current_exception();
  }
  commit_checkpoint_save(save, params, optimizer, stream, failure);
}

std::vector<Tensor> checkpoint_flats(const ZeroParamStore& params,
                                     const schedules::Optimizer& optimizer) {
  std::vector<Tensor> out;
  for (const SavedFlat& f : saved_flats(params, optimizer)) out.push_back(f.flat);
  return out;
}

std::filesystem::path CheckpointSave::final_dir() const {
  return std::filesystem::path(folder) / dir_name;
}
std::filesystem::path CheckpointSave::tmp_dir() const {
  return std::filesystem::path(folder) / (".tmp_" + dir_name);
}
std::string CheckpointSave::what() const { return "checkpoint " + final_dir().string(); }

ShardedCheckpoint::ShardedCheckpoint(std::string dir) : dir_(std::move(dir)) {
  const fs::path path = fs::path(dir_) / kShardManifestName;
  if (!fs::exists(path)) MOEPEAK_INPUT_ERROR("checkpoint ", dir_, " has no ", kShardManifestName);
  manifest_ = ShardManifest::parse(read_text(path), path.string());
  reader_ = std::make_unique<ShardReader>(dir_, manifest_);
}

std::vector<char> ShardedCheckpoint::read(const std::string& name) {
  const ShardTensor& t = manifest_.tensor(name, "checkpoint " + dir_);
  std::vector<char> bytes(static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
  reader_->read(t, 0, t.numel(), bytes.data());
  return bytes;
}

bool is_sharded_checkpoint(const std::string& dir) {
  return fs::exists(fs::path(dir) / kShardManifestName);
}

int64_t load_sharded_checkpoint(const std::string& dir, ZeroParamStore& params,
                                schedules::Optimizer& optimizer, DataLoader& loader,
                                Stream& stream) {
  const fs::path manifest_path = fs::path(dir) / kShardManifestName;
  ShardedCheckpoint checkpoint(dir);
  const ShardManifest& m = checkpoint.manifest();
  const auto& infos = params.layout().params();
  // A master is loaded when the optimizer keeps one apart from the weights and the checkpoint
  // has it; otherwise it is re-derived from the loaded weights below.
  const bool has_master = !infos.empty() && m.has_tensor("master." + infos[0].name);
  std::vector<SavedFlat> flats = saved_flats(params, optimizer);
  auto is_master = [](const SavedFlat& f) { return f.prefix == "master."; };
  if (!has_master) std::erase_if(flats, is_master);
  const bool master_loaded = std::any_of(flats.begin(), flats.end(), is_master);
  std::vector<char> host;
  for (const SavedFlat& f : flats) {
    for (size_t i = 0; i < infos.size(); ++i) {
      const int p = static_cast<int>(i);
      const auto range = params.stored_range(p);
      if (!range) continue;
      const std::string name = f.prefix + infos[i].name;
      const ShardTensor& t = m.tensor(name, manifest_path.string());
      if (t.dtype != f.flat.dtype() || t.shape != infos[i].shape.dims()) {
        std::ostringstream got;
        for (int64_t d : t.shape) got << d << ",";
        MOEPEAK_INPUT_ERROR(manifest_path.string(), ": tensor '", name, "' is ",
                            safetensors_dtype_name(t.dtype), " (", got.str(),
                            ") but this model expects ", safetensors_dtype_name(f.flat.dtype()),
                            " ", infos[i].shape.str());
      }
      host.resize(static_cast<size_t>(range->second - range->first) * dtype_size(t.dtype));
      checkpoint.read(t, range->first, range->second, host.data());
      params.load_stored_range(p, host.data(), f.flat, stream);
    }
  }
  if (!master_loaded) optimizer.load_master_from_weights(stream);
  const nlohmann::json& meta = m.metadata;
  if (!meta.contains("step") || !meta["step"].is_number_integer() ||
      !meta.contains("data_loader_state") || !meta["data_loader_state"].is_array()) {
    MOEPEAK_INPUT_ERROR(manifest_path.string(),
                        ": metadata needs \"step\" (an integer) and \"data_loader_state\"");
  }
  std::vector<uint8_t> cursor;
  for (const nlohmann::json& b : meta["data_loader_state"]) {
    if (!b.is_number_unsigned() || b.get<uint64_t>() > 255) {
      MOEPEAK_INPUT_ERROR(manifest_path.string(), ": data_loader_state holds a non-byte");
    }
    cursor.push_back(static_cast<uint8_t>(b.get<uint64_t>()));
  }
  // NOTES: the loader says what of its state does not match this run's data; the file is named
  // here, where it is known.
  try {
    loader.restore(cursor);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::input) throw;
    MOEPEAK_INPUT_ERROR(manifest_path.string(), ": ", e.message());
  }
  return meta["step"].get<int64_t>();
}

}  // namespace moepeak
