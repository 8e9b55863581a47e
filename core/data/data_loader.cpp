// make_data_loader (the dataset switch) and the loader-state byte string shared by all loaders.
#include "core/data/data_loader.h"

#include <algorithm>
#include <cstring>

#include "core/data/blend_loader.h"
#include "core/data/copy_task.h"
#include "core/data/token_dataset.h"
#include "core/data/window_loader.h"
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
    case LoaderKind::blend:
      return "blend";
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
                                          std::span<const size_t> field_counts) {
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
                        "' loader, but this run reads its data with a '", loader_kind_name(kind),
                        "' loader (training.dataset", kind == LoaderKind::blend ? "s" : "", ")");
  }
  const uint64_t saved_fields = read_le(state, 6, 2);
  const bool known = field_counts.empty() || std::find(field_counts.begin(), field_counts.end(),
                                                       saved_fields) != field_counts.end();
  if (!known || state.size() != kStateHeaderBytes + 8 * saved_fields) {
    std::string expected;
    for (size_t n : field_counts)
      expected += detail::concat(expected.empty() ? "" : " or ", kStateHeaderBytes + 8 * n,
                                 " bytes with ", n, " fields");
    MOEPEAK_INPUT_ERROR("data-loader state: ", state.size(), " bytes with ", saved_fields,
                        " fields; a '", loader_kind_name(kind), "' state has ", expected);
  }
  std::vector<uint64_t> fields(saved_fields);
  for (size_t i = 0; i < saved_fields; ++i)
    fields[i] = read_le(state, kStateHeaderBytes + 8 * i, 8);
  return fields;
}

std::vector<uint64_t> decode_loader_state(std::span<const uint8_t> state, LoaderKind kind,
                                          size_t field_count) {
  const size_t counts[] = {field_count};
  return decode_loader_state(state, kind, counts);
}

void check_block(const BatchBlock& block, int64_t batch, int64_t seq_len) {
  MOEPEAK_CHECK(block.rows >= 1 && block.cols >= 1 && block.row_begin >= 0 &&
                    block.col_begin >= 0 && block.row_begin + block.rows <= batch &&
                    block.col_begin + block.cols <= seq_len,
                "block rows [", block.row_begin, ", ", block.row_begin + block.rows,
                ") x columns [", block.col_begin, ", ", block.col_begin + block.cols,
                ") is not inside a ", batch, " x ", seq_len, " batch");
}

void throw_no_document_index(const std::string& source) {
  MOEPEAK_INPUT_ERROR(
      "training.document_boundaries = \"index\" needs a Megatron dataset (its .idx lists the "
      "documents); ",
      source, " has no document index — use \"eos\"");
}

void DataLoader::read_document_starts(int64_t /*row*/, std::vector<int64_t>& /*starts*/) {
  throw_no_document_index(describe());
}

void DataLoader::next_batch(int64_t* input_ids, int64_t* labels) {
  read_block(whole_batch(), input_ids, labels);
  advance();
}

std::unique_ptr<DataLoader> make_data_loader(const TrainingConfig& training,
                                             const ModelConfig& model, int64_t seed) {
  if (training.dataset == DatasetKind::copy && training.datasets.empty()) {
    return std::make_unique<CopyTaskLoader>(training.batch_size, training.seq_len, model.vocab_size,
                                            seed);
  }
  const WindowOrder order{training.shuffle, static_cast<uint64_t>(seed)};
  if (training.datasets.empty()) {
    if (training.dataset_path.empty()) {
      MOEPEAK_INPUT_ERROR("training.dataset_path is required when training.dataset is ",
                          enum_name(training.dataset));
    }
    return std::make_unique<TokenWindowLoader>(
        open_token_dataset(training.dataset, training.dataset_path, training.token_dtype),
        training.batch_size, training.seq_len, model.vocab_size, order);
  }
  std::vector<TokenWindowLoader> members;
  std::vector<double> weights;
  for (size_t d = 0; d < training.datasets.size(); ++d) {
    const DatasetSource& source = training.datasets[d];
    const DatasetKind kind = source.dataset.value_or(training.dataset);
    if (kind == DatasetKind::copy) {
      MOEPEAK_INPUT_ERROR("training.datasets[", d, "] (", source.path,
                          ") names no token-file format; set training.dataset or its dataset");
    }
    TokenDataset dataset = open_token_dataset(kind, source.path, training.token_dtype);
    if (!members.empty()) {
      check_same_token_type(members.front().dataset(), "training.datasets[0]", dataset,
                            detail::concat("training.datasets[", d, "]"));
    }
    members.emplace_back(std::move(dataset), training.batch_size, training.seq_len,
                         model.vocab_size, order);
    weights.push_back(source.weight);
  }
  return std::make_unique<BlendLoader>(std::move(members), std::move(weights));
}

std::unique_ptr<DataLoader> make_eval_loader(const EvalConfig& eval, const TrainingConfig& training,
                                             const ModelConfig& model) {
  MOEPEAK_CHECK(eval.enabled(), "make_eval_loader without eval.dataset_path");
  if (training.dataset == DatasetKind::copy) {
    MOEPEAK_INPUT_ERROR("eval.dataset_path ", eval.dataset_path,
                        " is read in training.dataset's format, but training.dataset is copy");
  }
  TokenDataset held_out =
      open_token_dataset(training.dataset, eval.dataset_path, training.token_dtype);
  const bool blend = !training.datasets.empty();
  const TokenDataset trained = open_token_dataset(
      blend ? training.datasets[0].dataset.value_or(training.dataset) : training.dataset,
      blend ? training.datasets[0].path : training.dataset_path, training.token_dtype);
  check_same_token_type(trained, blend ? "training.datasets[0]" : "training.dataset_path", held_out,
                        "eval.dataset_path");
  const auto needed = static_cast<unsigned __int128>(eval.batches) *
                          static_cast<uint64_t>(training.batch_size) *
                          static_cast<uint64_t>(training.seq_len) +
                      1;
  if (held_out.token_count() < needed) {
    MOEPEAK_INPUT_ERROR("eval.dataset_path ", held_out.path(), " holds ", held_out.token_count(),
                        " tokens, fewer than eval.batches x training.batch_size x "
                        "training.seq_len + 1 = ",
                        static_cast<uint64_t>(needed),
                        " (an evaluation would read its windows twice); lower eval.batches");
  }
  return std::make_unique<TokenWindowLoader>(std::move(held_out), training.batch_size,
                                             training.seq_len, model.vocab_size,
                                             WindowOrder{/*shuffle=*/false, 0});
}

}  // namespace moepeak
