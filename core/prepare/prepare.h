// prepare_dataset: text to tokens (`moepeak data prepare`). Reads documents from text or JSONL
// files (core/prepare/document_reader.h), tokenizes them with a tokenizer.json or SentencePiece
// model (core/prepare/tokenizer.h) on `workers` threads, appends EOS to each unless its ids
// already end with it (and optionally prepends BOS unless they begin with it), and writes a
// Megatron .bin/.idx indexed dataset (core/data/megatron_writer.h), one indexed document per input
// document, in input order whatever the thread count.
//
// Split: with split = {a, b} (or {a, b, c}) document i goes to part p where i mod (a + b [+ c])
// first falls below a, a + b, ...: the parts interleave through the corpus in the ratio a : b,
// known as the documents stream past (no second pass), and the held-out part samples the whole
// corpus rather than its end. The parts are PREFIX-train, PREFIX-eval (and PREFIX-test).
//
// Memory is bounded by the chunk size, not the corpus: one chunk of text being read while the
// previous one is tokenized, its ids, and 12 bytes of index per written document.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/data/token_dataset.h"
#include "core/prepare/document_reader.h"

namespace moepeak {

struct PrepareProgress {
  uint64_t bytes_read = 0, total_bytes = 0;
  uint64_t documents = 0, tokens = 0;
  double seconds = 0;
};

struct PrepareOptions {
  // A tokenizer.json, a SentencePiece .model, or a model directory (core/prepare/tokenizer.h).
  std::string tokenizer;
  std::string eos_token;            // the EOS token, when not the tokenizer's files' (--eos)
  std::vector<std::string> inputs;  // text or JSONL files
  InputFormat format = InputFormat::automatic;
  std::string json_key = "text";
  std::string output;              // the output prefix: PREFIX.bin/.idx, or PREFIX-<part>.bin/.idx
  std::vector<int> split;          // empty: one output; 2 or 3 positive parts
  int workers = 0;                 // tokenizing threads; 0 = the machine's hardware threads
  size_t chunk_bytes = 16u << 20;  // text handed to the workers at a time
  bool append_eos = true;
  bool prepend_bos = false;
  // Called after every chunk, from the calling thread.
  std::function<void(const PrepareProgress&)> progress;
};

struct PreparedPart {
  std::string name;    // "all", "train", "eval", "test"
  std::string prefix;  // where its .bin/.idx are
  uint64_t documents = 0, tokens = 0, bin_bytes = 0;
};

struct PrepareResult {
  std::vector<PreparedPart> parts;
  TokenStorage storage = TokenStorage::u16;
  int64_t vocab_size = 0;
  std::string tokenizer, tokenizer_kind;  // the file read and its kind
  int32_t eos_id = -1;
  int workers = 0;
  uint64_t input_bytes = 0, skipped_empty = 0;
  double seconds = 0;
};

// Throws moepeak::Error (naming the file, line or option) on a missing or bad tokenizer, input,
// JSONL line or split, a tokenizer without EOS when append_eos (or BOS when prepend_bos), or an
// input with no document; no output file is then written or changed.
PrepareResult prepare_dataset(const PrepareOptions& options);

}  // namespace moepeak
