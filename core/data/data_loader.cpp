// make_data_loader (the dataset switch) and the loader-state byte string shared by all loaders.
#include "core/data/data_loader.h"

#include <cstring>

#include "core/data/copy_task.h"
#include "core/data/token_dataset.h"
#include "core/error.h"

namespace moepeak {

namespace {

constexpr uint8_t kStateMagic[4] = {'M', 'P', 'D', 'L'};
constexpr uint8_t kStateFormatVersion = 1;
constexpr size_t kStateHeaderBytes = 8;  // magic, version, kind, field count

void append_le(std::vector<uint8_t>& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

uint64_t read_le(std::span<const uint8_t> in, size_t at, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i)
    value |= static_cast<uint64_t>(in[at + static_cast<size_t>(i)]) << (8 * i);
  return value;
}

}  // namespace

std::string_view loader_kind_name(LoaderKind kind) {
  switch (kind) {
    case LoaderKind::copy:
      return "copy";
    case LoaderKind::bin:
      return "bin";
    case LoaderKind::megatron:
      return "megatron";
  }
  return "unknown";
}

std::vector<uint8_t> encode_loader_state(LoaderKind kind, std::span<const uint64_t> fields) {
  MOEPEAK_CHECK(fields.size() <= 0xffff, "too many loader-state fields: ", fields.size());
  std::vector<uint8_t> out(std::begin(kStateMagic), std::end(kStateMagic));
  out.push_back(kStateFormatVersion);
  out.push_back(static_cast<uint8_t>(kind));
  append_le(out, fields.size(), 2);
  for (uint64_t field : fields) append_le(out, field, 8);
  return out;
}

std::vector<uint64_t> decode_loader_state(std::span<const uint8_t> state, LoaderKind kind,
                                          size_t field_count) {
  if (state.size() < kStateHeaderBytes || std::memcmp(state.data(), kStateMagic, 4) != 0) {
    MOEPEAK_INPUT_ERROR("data-loader state: not a moepeak data-loader state (", state.size(),
                        " bytes, expected the \"MPDL\" header)");
  }
  if (state[4] != kStateFormatVersion) {
    MOEPEAK_INPUT_ERROR("data-loader state: format version ", int(state[4]), ", this build reads ",
                        int(kStateFormatVersion));
  }
  const auto saved_kind = static_cast<LoaderKind>(state[5]);
  if (saved_kind != kind) {
    MOEPEAK_INPUT_ERROR("data-loader state: saved by a '", loader_kind_name(saved_kind),
                        "' loader, this run reads training.dataset = ", loader_kind_name(kind));
  }
  const uint64_t saved_fields = read_le(state, 6, 2);
  const size_t expected_bytes = kStateHeaderBytes + 8 * field_count;
  if (saved_fields != field_count || state.size() != expected_bytes) {
    MOEPEAK_INPUT_ERROR("data-loader state: ", state.size(), " bytes with ", saved_fields,
                        " fields; a '", loader_kind_name(kind), "' state has ", expected_bytes,
                        " bytes with ", field_count, " fields");
  }
  std::vector<uint64_t> fields(field_count);
  for (size_t i = 0; i < field_count; ++i) fields[i] = read_le(state, kStateHeaderBytes + 8 * i, 8);
  return fields;
}

std::unique_ptr<DataLoader> make_data_loader(const TrainingConfig& training,
                                             const ModelConfig& model, int64_t seed) {
  if (training.dataset == DatasetKind::copy) {
    return std::make_unique<CopyTaskLoader>(training.batch_size, training.seq_len, model.vocab_size,
                                            seed);
  }
  if (training.dataset_path.empty()) {
    MOEPEAK_INPUT_ERROR("training.dataset_path is required when training.dataset is ",
                        enum_name(training.dataset));
  }
  TokenDataset dataset = training.dataset == DatasetKind::bin
                             ? open_token_bin(training.dataset_path, training.token_dtype)
                             : open_megatron_dataset(training.dataset_path);
  return std::make_unique<TokenWindowLoader>(std::move(dataset), training.batch_size,
                                             training.seq_len, model.vocab_size);
}

}  // namespace moepeak
