// prepare_dataset: see prepare.h.
#include "core/prepare/prepare.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <numeric>
#include <thread>

#include "core/data/megatron_writer.h"
#include "core/error.h"
#include "core/prepare/tokenizer.h"

namespace moepeak {

namespace {

const char* const kPartNames[] = {"train", "eval", "test"};

// The ids of `texts`, one vector per document, tokenized on `workers` threads over contiguous
// slices (the first error any thread meets is rethrown).
void tokenize(const Tokenizer& tokenizer, const std::vector<std::string>& texts,
              const PrepareOptions& options, int workers, std::vector<std::vector<int32_t>>& ids) {
  ids.assign(texts.size(), {});
  const size_t n = texts.size();
  const size_t threads = std::min<size_t>(static_cast<size_t>(workers), std::max<size_t>(n, 1));
  std::vector<std::exception_ptr> errors(threads);
  auto work = [&](size_t t) {
    try {
      for (size_t i = n * t / threads; i < n * (t + 1) / threads; ++i) {
        std::vector<int32_t>& out = ids[i];
        tokenizer.encode(texts[i], out);
        // NOTES: a tokenizer.json's post-processor may already put BOS in front (DeepSeek-V3's,
        // Llama's) and a text may end with the EOS token itself: neither is doubled.
        if (options.prepend_bos && (out.empty() || out.front() != tokenizer.bos_id()))
          out.insert(out.begin(), tokenizer.bos_id());
        if (options.append_eos && (out.empty() || out.back() != tokenizer.eos_id()))
          out.push_back(tokenizer.eos_id());
      }
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (options.output.empty()) MOEPEAK_INPUT_ERROR("--output: an output prefix is required");
  if (!options.split.empty()) {
    if (options.split.size() < 2 || options.split.size() > 3) {
      MOEPEAK_INPUT_ERROR("--split: give 2 or 3 parts (train,eval[,test]), got ",
                          options.split.size());
    }
    for (int part : options.split) {
      if (part < 1) MOEPEAK_INPUT_ERROR("--split: every part must be >= 1, got ", part);
    }
  }
  if (options.chunk_bytes == 0) MOEPEAK_INPUT_ERROR("--chunk-size must be > 0");
  const std::unique_ptr<Tokenizer> opened = open_tokenizer(options.tokenizer, options.eos_token);
  const Tokenizer& tokenizer = *opened;
  if (options.append_eos && tokenizer.eos_id() < 0) {
    MOEPEAK_INPUT_ERROR(tokenizer.path(),
                        ": no EOS to end documents with (neither the tokenizer nor a "
                        "tokenizer_config.json, config.json or generation_config.json beside it "
                        "names one; --eos TOKEN names it, --no-eos writes documents without one)");
  }
  if (options.prepend_bos && tokenizer.bos_id() < 0)
    MOEPEAK_INPUT_ERROR(tokenizer.path(), ": no BOS to begin documents with (--bos)");
  DocumentReader reader(options.inputs, options.format, options.json_key);

  PrepareResult result;
  result.vocab_size = tokenizer.vocab_size();
  result.tokenizer = tokenizer.path();
  result.tokenizer_kind = tokenizer.kind();
  result.eos_id = tokenizer.eos_id();
  result.storage = megatron_token_storage(result.vocab_size);
  result.workers = options.workers > 0
                       ? options.workers
                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<std::unique_ptr<MegatronWriter>> writers;
  if (options.split.empty()) {
    result.parts.push_back({"all", options.output});
  } else {
    for (size_t p = 0; p < options.split.size(); ++p)
      result.parts.push_back({kPartNames[p], options.output + "-" + kPartNames[p]});
  }
  for (const PreparedPart& part : result.parts)
    writers.push_back(std::make_unique<MegatronWriter>(part.prefix, result.storage));
  std::vector<int> bounds;  // cumulative split
  std::partial_sum(options.split.begin(), options.split.end(), std::back_inserter(bounds));
  const int period = bounds.empty() ? 1 : bounds.back();

  // NOTES: two chunks of text at most: the next one is read while the workers tokenize this one.
  std::vector<std::string> current, next;
  std::vector<std::vector<int32_t>> ids;
  uint64_t document = 0, tokens = 0;
  bool more = reader.read(current, options.chunk_bytes);
  while (more) {
    std::exception_ptr error;
    std::thread tokenizing([&] {
      try {
        tokenize(tokenizer, current, options, result.workers, ids);
      } catch (...) {
        error = std::current_exception();
      }
    });
    next.clear();
    try {
      more = reader.read(next, options.chunk_bytes);
    } catch (...) {
      tokenizing.join();
      throw;
    }
    tokenizing.join();
    if (error) std::rethrow_exception(error);
    for (const std::vector<int32_t>& doc : ids) {
      size_t part = 0;
      const int r = static_cast<int>(document % static_cast<uint64_t>(period));
      while (part + 1 < writers.size() && r >= bounds[part]) ++part;
      if (!doc.empty()) writers[part]->add_document(doc);  // no EOS, no text: nothing to write
      tokens += doc.size();
      ++document;
    }
    std::swap(current, next);
    if (options.progress) {
      PrepareProgress p;
      p.bytes_read = reader.bytes_read();
      p.total_bytes = reader.total_bytes();
      p.documents = document;
      p.tokens = tokens;
      p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      options.progress(p);
    }
  }
  for (size_t p = 0; p < writers.size(); ++p) {
    if (writers[p]->documents() == 0) {
      MOEPEAK_INPUT_ERROR("no document for ", result.parts[p].prefix, ".bin: the inputs hold ",
                          document, " non-empty document", document == 1 ? "" : "s",
                          result.parts.size() > 1 ? " (fewer than the split's parts need)" : "");
    }
  }
  for (size_t p = 0; p < writers.size(); ++p) {
    writers[p]->commit();
    result.parts[p].documents = writers[p]->documents();
    result.parts[p].tokens = writers[p]->tokens();
    result.parts[p].bin_bytes = writers[p]->bin_bytes();
  }
  result.input_bytes = reader.total_bytes();
  result.skipped_empty = reader.skipped_empty();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace moepeak
