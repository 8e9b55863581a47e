#include "core/train/trainer.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/atomic_file.h"
#include "core/checkpoint/async_checkpoint.h"
#include "core/checkpoint/hf_import.h"
#include "core/checkpoint/mtp_layers.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/comm/watchdog.h"
#include "core/data/batch_shard.h"
#include "core/data/data_loader.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/log.h"  // defines: log::every_rank
#include "core/metrics/flops.h"
#include "core/metrics/tensorboard_writer.h"
#include "core/model/decoder.h"
#include "core/model/decoder_memory.h"  // defines: model_outside_arena
#include "core/model/optimizer_params.h"
#include "core/progress_line.h"
#include "core/run_context.h"
#include "core/runtime/backend.h"
#include "core/train/lr_schedule.h"
#include "core/train/router_balance.h"
#include "core/units.h"
#include "ops/elementwise.h"
#include "ops/fill.h"
#include "ops/schedules/optimizer.h"
#include "ops/schedules/optimizer_choice.h"
#include "topology/auto_budget.h"
#include "topology/binding.h"

namespace moepeak {
namespace fs = std::filesystem;

bool uses_cuda_backend(const Config& cfg) {
  return cfg.runtime.backend == BackendChoice::cuda ||
         (cfg.runtime.backend == BackendChoice::automatic && Backend::cuda_available());
}

DType training_dtype(const Config& cfg) {
  // NOTES: the same reading as `moepeak plan` (plan_inputs): "auto" is bf16 on CUDA, f32 on the
  // CPU, so a run keeps the dtype its plan budgeted.
  switch (cfg.training.dtype) {
    case ComputeDtype::float32:
      return DType::f32;
    case ComputeDtype::bfloat16:
      return DType::bf16;
    case ComputeDtype::automatic:
      break;
  }
  return uses_cuda_backend(cfg) ? DType::bf16 : DType::f32;
}

namespace {

BackendOptions backend_options(const Config& cfg, const RankInfo& ranks,
                               const topology::TrainBinding& binding) {
  BackendOptions o;
  const bool cuda = uses_cuda_backend(cfg);
  o.kind = cuda ? BackendKind::cuda : BackendKind::cpu;
  if (cuda) {
    // One GPU per rank: the probe's placement when it has one, else the local rank's ordinal.
    o.device_index = binding.place.gpu >= 0 ? binding.place.gpu : ranks.local_rank;
  }
  o.device_memory = cfg.runtime.device_memory_bytes().value_or(0);
  if (cuda) {
    // "auto": the card's free memory less the plan's terms outside the arena.
    const ParallelDegrees d = ParallelDegrees::resolve(cfg.parallelism, ranks.world_size);
    o.outside_arena = model_outside_arena(d, cfg).total();
  }
  // "auto": this rank's host budget from runtime.probe_file (`moepeak probe`), else the default.
  o.pinned_budget =
      topology::pinned_memory_budget(cfg, ranks.rank, ranks.local_rank, ranks.local_size,
                                     /*cpu_backend=*/!cuda);
  // -1: the node of the thread that creates the pool, i.e. the one the rank is bound to.
  o.numa_node = static_cast<int>(cfg.runtime.numa_node);
  o.cpu_threads = static_cast<int>(cfg.runtime.threads);
  if (o.cpu_threads == 0 && binding.bound) {
    o.cpu_threads = std::max(1, binding.pus());  // one thread per PU of the rank's share
  } else if (o.cpu_threads == 0 && ranks.local_size > 1) {
    // The ranks on one host share its cores instead of each starting one thread per core.
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    o.cpu_threads = std::max(1, cores / ranks.local_size);
  }
  return o;
}

// "adamw offload_stream (bucket_params 1048576, staging_slots 3)" for the log.
std::string optimizer_text(const OptimizerConfig& o) {
  std::string t = std::string(enum_name(o.name)) + " " + std::string(enum_name(o.placement));
  if (o.placement == OptimizerPlacement::offload_stream) {
    t += " (bucket_params " + std::to_string(o.bucket_params) + ", staging_slots " +
         std::to_string(o.staging_slots) + ")";
  }
  return t;
}

}  // namespace

LinkModel link_model(const RuntimeConfig& runtime) {
  return LinkModel{runtime.cpu_link_gb_per_s * 1e9, runtime.cpu_link_latency_us * 1e-6,
                   runtime.cpu_comm_wait == CpuCommWait::poll};
}

namespace {

// The layout on the launcher's ranks: the [parallelism] degrees, each checked against W.
ParallelDegrees degrees_of(const Config& cfg, const RankInfo& ranks) {
  return ParallelDegrees::resolve(cfg.parallelism, ranks.world_size);
}

// The layout checks, before anything is allocated: every rank reaches the same verdict.
void check_layout(const Config& cfg, const RankInfo& ranks) {
  const int64_t want = cfg.parallelism.world_size;
  if (want != 0 && want != ranks.world_size) {
    MOEPEAK_INPUT_ERROR("parallelism.world_size = ", want, " but the job was started with ",
                        ranks.world_size, " rank", ranks.world_size == 1 ? "" : "s",
                        " (launch it with mpirun -np ", want, " or srun -n ", want,
                        ", or set parallelism.world_size = 0 to take what the launcher starts)");
  }
  try {
    DecoderModel::check_layout(cfg.model, cfg.training.batch_size, cfg.training.seq_len,
                               degrees_of(cfg, ranks));
  } catch (const Error& e) {
    MOEPEAK_INPUT_ERROR("this config cannot train on ", ranks.world_size,
                        " ranks: ", nested_message(e));
  }
}

// sqrt of the sum of squares of the job's gradients: every rank's counted_grads() (each element
// of the job once, the dense shards from one of their replicas); the padding is zero. The device
// sums kSumSquaresParts parts at once (one GPU block each) and the host adds the partials in order:
// the second pass of the reduction.
double global_grad_norm(const ZeroParamStore& params, Backend& backend, Stream& stream) {
  OwnedTensor acc = OwnedTensor::device(backend, Shape{ops::kSumSquaresParts}, DType::f64,
                                        LiveSet::workspace, "grad norm partials");
  ops::fill(acc, 0.0, stream);
  ops::sum_squares(params.counted_grads(), acc, stream);
  std::vector<double> partial(static_cast<size_t>(ops::kSumSquaresParts));
  backend.copy_async(partial.data(), acc.data(), partial.size() * sizeof(double),
                     CopyKind::device_to_host, stream);
  stream.synchronize();
  double sum[1] = {0};
  for (double p : partial) sum[0] += p;
  if (params.world_size() > 1) all_reduce_host(params.comm(), backend, stream, sum);
  return std::sqrt(sum[0]);
}

// tests/faults: one NaN at the start of this rank's flat buffer (a weight or a gradient).
void poison_first_element(const Tensor& flat, Stream& stream) {
  if (flat.numel() == 0) return;
  ops::fill(flat.reshape(Shape{flat.numel(), 1}).rows(0, 1), std::nan(""), stream);
}

// Names the first live set, in the order a step makes them, that holds a non-finite value on
// some rank: a weight (then the forward made the loss from it), else a gradient, else neither
// (the forward's activations or logits overflowed). Collective over `comm`; synchronises.
std::string first_nonfinite(const ZeroParamStore& params, Comm& comm, Backend& backend,
                            Stream& stream) {
  // kinds: 0 none, 1 weights, 2 grads; the first piece of that kind on this rank.
  double mine[2] = {0, -1};
  for (int kind = 1; kind <= 2 && mine[0] == 0; ++kind) {
    for (const ZeroParamStore::LocalPiece& p : params.local_pieces()) {
      const std::vector<double> v =
          copy_to_host_as_double(kind == 1 ? p.value : p.grad, backend, stream);
      if (std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); })) continue;
      mine[0] = kind;
      mine[1] = p.param;
      break;
    }
  }
  const std::vector<double> all = comm.world_size() > 1
                                      ? all_gather_host(comm, backend, stream, mine)
                                      : std::vector<double>(mine, mine + 2);
  int rank = -1;
  for (int r = 0; r < comm.world_size(); ++r) {
    const double kind = all[2 * r];
    if (kind > 0 && (rank < 0 || kind < all[2 * rank])) rank = r;
  }
  if (rank < 0) {
    return "every weight and gradient is finite: the forward's activations or logits overflowed";
  }
  const bool weights = all[2 * rank] == 1;
  const std::string& name =
      params.layout().params().at(static_cast<size_t>(all[2 * rank + 1])).name;
  return std::string("the first non-finite live set is ") + (weights ? "weights" : "grads") + " (" +
         name + (weights ? "" : " gradient") + ", on rank " + std::to_string(rank) + ")";
}

}  // namespace

struct Trainer::State {
  Config cfg;
  TrainOptions options;
  RankInfo ranks;
  topology::TrainBinding binding;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Comm> comm;
  DType dtype = DType::f32;  // training_dtype: the model's weights, grads and activations
  ParallelDegrees degrees;   // [parallelism] on the launcher's W ranks
  std::unique_ptr<DecoderModel> model;
  std::unique_ptr<schedules::Optimizer> optimizer;  // optimizer.placement's AdamW
  // model.router_bias_update_rate's balancing of the routers' correction biases (deepseek_v3).
  std::unique_ptr<RouterBiasBalance> router_balance;
  std::unique_ptr<DataLoader> loader;
  std::unique_ptr<DataLoader> eval_loader;  // eval.dataset_path's, when set
  std::vector<uint8_t> eval_start;          // its state at the start of the file
  std::string checkpoint_folder;
  // The MTP layers the run carries into each checkpoint (core/checkpoint/mtp_layers.h), on rank 0.
  std::optional<CarriedFile> carried;
  // checkpoint.enable and .async (a preemption save without checkpoint.enable is synchronous)
  std::unique_ptr<AsyncCheckpointWriter> async_checkpoint;
  int64_t completed = 0;
  int64_t skipped_in_row = 0, skipped_total = 0;  // training.on_nonfinite = "skip"
  std::vector<int64_t> ids, labels;          // the step-1 dump's m global micro-batches (m*B*T)
  std::vector<int64_t> dump_positions;       // with packed documents
  std::vector<int32_t> dump_doc_start;       // with training.document_mask
  OwnedTensor d_ids, d_labels, d_positions;  // this rank's N = B*T/W tokens
  // training.document_mask / reset_position_ids (core/data/documents.h); with document_mask the
  // sequence group's document starts, (B/(W/Sp), T) i32.
  DocumentOptions documents;
  OwnedTensor d_doc_start;
  double flops = 0, ceiling_gflops = 0;
};

Trainer::Trainer(const Config& config, const TrainOptions& options)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  // [model] from model.init_from's config.json, when there is one (the CLI has done it already;
  // it is idempotent).
  const Config cfg = with_init_from_model(config);
  s.ranks = init_process_group();
  run_context::set_rank(s.ranks.rank);
  run_context::set_step(0);
  check_layout(cfg, s.ranks);
  s.cfg = cfg;
  s.options = options;
  // Bind before the backend starts its threads and pins its pool (runtime.bind).
  s.binding = topology::bind_for_training(cfg, s.ranks.rank, s.ranks.local_rank, s.ranks.local_size,
                                          /*cpu_backend=*/!uses_cuda_backend(cfg));
  // Every rank says where it runs: on a cluster, the line of the rank that is misplaced is the
  // one that matters.
  const std::string place =
      fmt::format("on host {}, local rank {} of {} [{}]", s.ranks.host, s.ranks.local_rank,
                  s.ranks.local_size, local_rank_source());
  if (s.binding.bound) {
    log::every_rank().info("rank {} bound to PUs {} (NUMA node {}; place from {}) {}", s.ranks.rank,
                           s.binding.cpus, s.binding.numa_node, s.binding.place_source, place);
  } else {
    log::every_rank().info("rank {} not bound: {}; it runs on PUs {} {}", s.ranks.rank,
                           s.binding.reason, s.binding.cpus, place);
  }
  s.backend = Backend::create(backend_options(cfg, s.ranks, s.binding));
  s.comm = make_comm(*s.backend, s.ranks, link_model(cfg.runtime));
  start_collective_watchdog(cfg.runtime.collective_timeout);
  Stream& stream = s.backend->default_stream();
  s.dtype = training_dtype(cfg);
  s.degrees = degrees_of(cfg, s.ranks);
  s.model = std::make_unique<DecoderModel>(*s.backend, stream, *s.comm, cfg.model, cfg.schedules,
                                           s.dtype, s.degrees,
                                           static_cast<int>(cfg.parallelism.zero_prefetch_depth));
  ZeroParamStore& params = s.model->params();
  params.initialize(static_cast<uint64_t>(cfg.job.seed), cfg.model.initializer_range, stream);
  // The serial offload's host AdamW gets the rank's share of the cores, as OpenBLAS does.
  s.optimizer = schedules::make_optimizer(*s.backend, optimizer_params(params), cfg.optimizer,
                                          backend_options(cfg, s.ranks, s.binding).cpu_threads);
  s.router_balance =
      std::make_unique<RouterBiasBalance>(params.layout(), cfg.model.router_bias_update_rate);
  s.loader = make_data_loader(cfg.training, cfg.model, cfg.job.seed);
  if (cfg.eval.enabled()) {
    s.eval_loader = make_eval_loader(cfg.eval, cfg.training, cfg.model);
    s.eval_start = s.eval_loader->state();
  }
  s.checkpoint_folder = (fs::path(cfg.job.run_path()) / cfg.checkpoint.folder).string();
  if (cfg.checkpoint.enable && cfg.checkpoint.async) {
    // The snapshot is pinned now, before the first step sizes SCO's "auto" share of the pool.
    s.async_checkpoint = std::make_unique<AsyncCheckpointWriter>(*s.backend);
    s.async_checkpoint->reserve(params, *s.optimizer);
  }

  std::optional<std::string> resume_dir;
  if (!options.resume_from.empty())
    resume_dir = options.resume_from;
  else if (options.resume)
    resume_dir = latest_checkpoint(s.checkpoint_folder);
  if (resume_dir) {
    s.completed = load_checkpoint(*resume_dir, cfg.model, params, *s.optimizer, *s.loader, stream);
    spdlog::info("resumed from {} after step {}", *resume_dir, s.completed);
    s.carried = carry_mtp_layers_of_checkpoint(*resume_dir, s.checkpoint_folder, params, stream);
  } else {
    if (options.resume)
      spdlog::info("no checkpoint in {}: starting from step 1", s.checkpoint_folder);
    if (!cfg.model.init_from.empty()) {
      const HfCheckpoint hf(cfg.model.init_from);
      load_hf_weights(hf, params, stream, cfg.model.num_nextn_predict_layers);
      s.optimizer->load_master_from_weights(stream);
      spdlog::info("weights from the Hugging Face checkpoint {}", cfg.model.init_from);
      // The MTP layers, not trained, carried to the checkpoints and the export as they are.
      s.carried = carry_mtp_layers(hf, cfg.model, s.checkpoint_folder, params, stream);
      if (s.carried) {
        spdlog::info("{} multi-token-prediction layer(s) carried untrained: {} ({})",
                     cfg.model.num_nextn_predict_layers, s.carried->path,
                     format_bytes(s.carried->info.bytes));
      }
    }
  }

  const int64_t B = cfg.training.batch_size, T = cfg.training.seq_len;
  const int64_t m = cfg.training.grad_accum_steps;
  const int64_t N = B * T / s.ranks.world_size;
  s.d_ids = OwnedTensor::device(*s.backend, Shape{N}, DType::i64, LiveSet::workspace, "input ids");
  s.d_labels = OwnedTensor::device(*s.backend, Shape{N}, DType::i64, LiveSet::workspace, "labels");
  s.d_positions =
      OwnedTensor::device(*s.backend, Shape{N}, DType::i64, LiveSet::workspace, "positions");
  s.documents = DocumentOptions::from(cfg.training, cfg.model);
  if (s.documents.mask) {
    const int64_t group_batch = B / s.degrees.sequence_groups();
    s.d_doc_start = OwnedTensor::device(*s.backend, Shape{group_batch, T}, DType::i32,
                                        LiveSet::workspace, "document starts");
  }
  s.flops = static_cast<double>(m) * step_flops(cfg.model, B, T);
  s.ceiling_gflops = measure_gemm_ceiling(512, 3);
}

Trainer::~Trainer() { stop_collective_watchdog(); }

int64_t Trainer::completed_steps() const { return s_->completed; }
double Trainer::flops_per_step() const { return s_->flops; }
double Trainer::gemm_ceiling_gflops() const { return s_->ceiling_gflops; }

double Trainer::measure_gemm_ceiling(int n, int repeats) const {
  if (s_->backend->kind() == BackendKind::cpu)
    return measure_cpu_gemm_gflops(DType::f32, n, repeats);
  return measure_backend_gemm_gflops(*s_->backend, s_->dtype, n, repeats);
}
int Trainer::rank() const { return s_->ranks.rank; }
int Trainer::world_size() const { return s_->ranks.world_size; }

double Trainer::sum_over_ranks(double value) const {
  double v[1] = {value};
  if (s_->ranks.world_size > 1) {
    all_reduce_host(*s_->comm, *s_->backend, s_->backend->default_stream(), v);
  }
  return v[0];
}

double Trainer::max_over_ranks(double value) const {
  const double mine[1] = {value};
  if (s_->ranks.world_size == 1) return value;
  const std::vector<double> all =
      all_gather_host(*s_->comm, *s_->backend, s_->backend->default_stream(), mine);
  return *std::max_element(all.begin(), all.end());
}

namespace {

// "; packed documents cut after token 2: attention within each, positions restarting" or "".
std::string documents_text(const DocumentOptions& d) {
  if (!d.enabled()) return "";
  const std::string cut = d.boundaries == DocumentBoundaries::index
                              ? "by the dataset's document index"
                              : "after token " + std::to_string(d.eos_token_id);
  std::string what = d.mask ? "attention within each" : "";
  if (d.reset_positions) what += std::string(d.mask ? ", " : "") + "positions restarting";
  return "; packed documents cut " + cut + ": " + what;
}

}  // namespace

std::string Trainer::describe() const {
  const State& s = *s_;
  const ParamLayout& layout = s.model->params().layout();
  const int W = s.ranks.world_size;
  const ParallelDegrees& d = s.degrees;
  std::string ranks =
      W == 1
          ? "1 rank"
          : std::to_string(W) + " ranks (" + std::string(s.comm->kind()) + "; " + d.str() +
                ": ZeRO-3 dense over " + std::to_string(d.data_shard) +
                (d.dense_replicas() > 1 ? " x " + std::to_string(d.dense_replicas()) + " replicas"
                                        : "") +
                ", Ulysses over " + std::to_string(d.sequence) + ", " +
                std::to_string(s.cfg.model.num_local_experts / d.expert) + " experts per rank" +
                (d.expert_replicas() > 1
                     ? " sharded over " + std::to_string(d.expert_replicas()) + " replicas"
                     : "") +
                ")";
  const DecoderSpec& spec = layout.spec();
  const std::string moe_layers =
      spec.any_dense() ? " (" + std::to_string(spec.moe_layers()) + " with experts)" : "";
  return "backend " + s.backend->describe() + "; " + ranks + "; model " +
         std::string(enum_name(s.cfg.model.model_type)) + " " +
         std::to_string(layout.parameter_count()) + " parameters (" +
         std::to_string(layout.active_matmul_parameters()) + " active per token), " +
         std::to_string(s.cfg.model.num_hidden_layers) + " layers" + moe_layers + " x " +
         std::to_string(s.cfg.model.num_local_experts) + " experts (top-" +
         std::to_string(s.cfg.model.num_experts_per_tok) + "); optimizer " +
         optimizer_text(s.cfg.optimizer) + "; data " + s.loader->describe() +
         documents_text(s.documents);
}

namespace {

// The scored tokens of the step's blocks over all ranks (each token is on one rank), once every
// rank has read its blocks: one gather of (scored, failed) per rank. When any rank could not
// read, every rank throws moepeak::Error there (`when`: "step 7"): that rank its own error (naming
// the file, offset and value), the others one naming that rank.
int64_t agree_on_batch(Comm& comm, Backend& backend, const std::string& when,
                       const std::vector<LocalBatch>& locals,
                       const std::exception_ptr& read_error) {
  int64_t scored = 0;
  for (const LocalBatch& local : locals) scored += count_scored(local.labels);
  const double mine[2] = {static_cast<double>(scored), read_error ? 1.0 : 0.0};
  const std::vector<double> all =
      comm.world_size() > 1 ? all_gather_host(comm, backend, backend.default_stream(), mine)
                            : std::vector<double>(std::begin(mine), std::end(mine));
  if (read_error) std::rethrow_exception(read_error);
  int64_t total = 0;
  for (size_t r = 0; 2 * r < all.size(); ++r) {
    if (all[2 * r + 1] != 0) {
      MOEPEAK_INPUT_ERROR(when, ": rank ", r,
                          " could not read its block of the batch (its error names the file and "
                          "offset); every rank stops here");
    }
    total += static_cast<int64_t>(all[2 * r]);
  }
  return total;
}

// Reads `count` batches' `block` from `loader` into `locals`, advancing past each;
// `before_advance(i)` runs once batch i's block is read. Returns the error a read threw (bad
// data: the ranks agree on it in agree_on_batch before anything collective), or null.
std::exception_ptr read_blocks(DataLoader& loader, const BatchBlock& block, int64_t count,
                               const DocumentOptions& documents, std::vector<LocalBatch>& locals,
                               const std::function<void(int64_t)>& before_advance = {}) {
  try {
    for (int64_t i = 0; i < count; ++i) {
      locals.push_back(read_local_batch(loader, block, documents));
      if (before_advance) before_advance(i);
      loader.advance();
    }
  } catch (const Error&) {
    return std::current_exception();
  }
  return nullptr;
}

// Copies `local` into the device token buffers (in stream order: the host side must live until
// the stream has run the copies) and describes them as the model's (B, T) batch.
// `doc_start`: the (B/(W/Sp), T) i32 buffer of training.document_mask, else empty.
TokenBatch upload_batch(Backend& backend, OwnedTensor& ids, OwnedTensor& labels,
                        OwnedTensor& positions, OwnedTensor& doc_start, int64_t B, int64_t T,
                        const LocalBatch& local) {
  Stream& stream = backend.default_stream();
  const size_t bytes = local.input_ids.size() * 8;
  backend.copy_async(ids.data(), local.input_ids.data(), bytes, CopyKind::host_to_device, stream);
  backend.copy_async(labels.data(), local.labels.data(), bytes, CopyKind::host_to_device, stream);
  backend.copy_async(positions.data(), local.positions.data(), bytes, CopyKind::host_to_device,
                     stream);
  TokenBatch batch{ids, labels, positions, B, T, count_scored(local.labels)};
  if (doc_start.view().defined()) {
    MOEPEAK_CHECK(local.doc_start.size() == static_cast<size_t>(doc_start.numel()),
                  "document starts of ", local.doc_start.size(), " positions for ",
                  doc_start.view().str());
    backend.copy_async(doc_start.data(), local.doc_start.data(), local.doc_start.size() * 4,
                       CopyKind::host_to_device, stream);
    batch.doc_start = doc_start;
  }
  return batch;
}

}  // namespace

StepMetrics Trainer::step() {
  State& s = *s_;
  Backend& backend = *s.backend;
  Stream& stream = backend.default_stream();
  ZeroParamStore& params = s.model->params();
  const int W = s.ranks.world_size;
  const int64_t step = s.completed + 1;
  const int64_t B = s.cfg.training.batch_size, T = s.cfg.training.seq_len;
  const int64_t accum = s.cfg.training.grad_accum_steps;

  run_context::set_step(step);
  fault_here("step");  // tests/faults: a rank killed or slow at a step's start
  backend.arena().set_phase(StepPhase::embedding);  // the batch's upload, the embedding
  backend.arena().reset_peaks();
  auto t0 = std::chrono::steady_clock::now();
  // NOTES: the step's m micro-batches are read first, each rank reading only its block of each,
  // so that each micro-batch's loss is scaled by the scored tokens of the whole step: the summed
  // gradients are then those of one batch of m B sequences. The ranks agree on that count and on
  // whether each could read its blocks (one gather) before the step's first collective, so a bad
  // token id that one rank reads stops every rank at this step instead of leaving the others
  // waiting in a collective. Each micro-batch's gradients are reduced (ZeRO-3's reduce-scatter,
  // the experts' own) as its backward runs and added into the shard's gradients, so the memory of
  // a step is that of one micro-batch (docs/design.md#the-model).
  const BatchBlock block = rank_batch_block(B, T, W, s.ranks.rank, s.degrees.sequence);
  const bool dump = step == 1 && !s.options.dump_step_dir.empty();
  const auto micro = static_cast<ptrdiff_t>(B * T);
  // The host sides of the copies stay alive until the step's end (the stream may read them
  // late); the device buffers are reused in stream order.
  std::vector<LocalBatch> locals;
  locals.reserve(static_cast<size_t>(accum));
  if (dump) {  // the step-1 dump holds the global batch
    s.ids.resize(static_cast<size_t>(accum * micro));
    s.labels.resize(static_cast<size_t>(accum * micro));
  }
  const std::exception_ptr read_error =
      read_blocks(*s.loader, block, accum, s.documents, locals, [&](int64_t i) {
        if (dump && !s.documents.enabled()) {
          s.loader->read_block(s.loader->whole_batch(), s.ids.data() + i * micro,
                               s.labels.data() + i * micro);
        } else if (dump) {  // as the model sees it: labels cut, positions, document starts
          const LocalBatch whole =
              read_local_batch(*s.loader, s.loader->whole_batch(), s.documents);
          std::copy(whole.input_ids.begin(), whole.input_ids.end(), s.ids.begin() + i * micro);
          std::copy(whole.labels.begin(), whole.labels.end(), s.labels.begin() + i * micro);
          s.dump_positions.insert(s.dump_positions.end(), whole.positions.begin(),
                                  whole.positions.end());
          s.dump_doc_start.insert(s.dump_doc_start.end(), whole.doc_start.begin(),
                                  whole.doc_start.end());
        }
      });
  const int64_t step_scored =
      agree_on_batch(*s.comm, backend, "step " + std::to_string(step), locals, read_error);
  params.zero_grads(stream);
  double loss = 0;
  int64_t N = 0;
  for (const LocalBatch& local : locals) {
    N = static_cast<int64_t>(local.input_ids.size());
    const TokenBatch batch =
        upload_batch(backend, s.d_ids, s.d_labels, s.d_positions, s.d_doc_start, B, T, local);
    loss += s.model->forward_backward(batch, step_scored);
    s.router_balance->add(s.model->expert_load());
  }
  if (fault_here("grads")) poison_first_element(params.flat_grads(), stream);
  backend.arena().set_phase(StepPhase::optimizer);  // the grad norm, the update, the metrics
  const double grad_norm = global_grad_norm(params, backend, stream);
  // NOTES: the loss and the grad norm are the job's (every rank has the same), so every rank
  // takes the same branch here and the collectives below stay matched.
  const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
  if (!finite) {
    if (s.cfg.training.on_nonfinite == NonfiniteAction::stop) {
      MOEPEAK_THROW("step ", step, ": the loss is ", loss, " and the gradient norm ", grad_norm,
                    "; ", first_nonfinite(params, *s.comm, backend, stream),
                    ". Stopped (training.on_nonfinite = \"stop\") without updating or saving this "
                    "step; training.on_nonfinite = \"skip\" drops such a step's update.");
    }
    ++s.skipped_total;
    if (++s.skipped_in_row >= s.cfg.training.max_skipped_steps) {
      MOEPEAK_THROW("step ", step, ": ", s.skipped_in_row,
                    " steps in a row had a non-finite loss or gradient norm (training."
                    "max_skipped_steps = ",
                    s.cfg.training.max_skipped_steps, "); ",
                    first_nonfinite(params, *s.comm, backend, stream), ". Stopped.");
    }
    spdlog::warn(
        "step {}: the loss is {} and the gradient norm {}: its update is skipped ({} in "
        "a row, training.on_nonfinite = \"skip\")",
        step, loss, grad_norm, s.skipped_in_row);
  } else {
    s.skipped_in_row = 0;
  }
  if (dump) {
    write_step_dump(s.options.dump_step_dir, s.cfg.model, params, s.ids, s.labels, accum * B, T,
                    loss, stream, s.dump_positions, s.dump_doc_start);
    spdlog::info("wrote the step-1 dump to {}", s.options.dump_step_dir);
  }
  const double max_norm = s.cfg.training.max_norm;
  const double clip = max_norm > 0 && grad_norm > max_norm ? max_norm / (grad_norm + 1e-6) : 1.0;
  const double lr = learning_rate(s.cfg.optimizer, s.cfg.lr_scheduler, s.cfg.training.steps, step);
  if (finite) s.optimizer->step(step, lr, clip, stream);
  s.router_balance->apply(params, *s.optimizer, stream, /*moved=*/finite);
  // tests/faults: an update that wrote a non-finite weight (the next step's forward reads it).
  if (fault_here("weights")) poison_first_element(params.flat_values(), stream);
  stream.synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.completed = step;

  MemoryStats mem = backend.arena().stats();
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.grad_norm = grad_norm;
  m.lr = lr;
  m.skipped = !finite;
  m.skipped_steps = s.skipped_total;
  m.world_size = W;
  m.peak_total = mem.peak_total();
  m.peak_per_set = mem.peak_per_set();
  m.at_peak = mem.at_peak();
  m.phase_peaks = mem.phase_peaks();
  for (StepPhase ph : kAllStepPhases) {
    m.phase_at_peak[static_cast<size_t>(ph)] = mem.phase_at_peak(ph);
    m.phase_peak_per_set[static_cast<size_t>(ph)] = mem.phase_peak_per_set(ph);
  }
  m.host_peak_per_set = backend.pinned().stats().peak_per_set();
  m.capacity = backend.arena().capacity();
  m.arena_high_water = backend.arena().high_water();
  if (backend.kind() == BackendKind::cuda) {
    const MemoryInfo info = backend.memory_info();
    m.device_used = info.physical_total - info.physical_free;
    m.used_before_arena = info.used_before_arena;
  }
  m.data_shares = s.loader->shares();
  // Every rank's time and peak (after the step, so gathering them is not timed).
  const double mine[2] = {seconds, static_cast<double>(m.peak_total)};
  const std::vector<double> all =
      W > 1 ? all_gather_host(*s.comm, backend, stream, mine) : std::vector<double>(mine, mine + 2);
  double slowest = 0;
  for (int r = 0; r < W; ++r) {
    const double t = all[2 * r];
    slowest = std::max(slowest, t);
    m.rank_tokens_per_s.push_back(static_cast<double>(accum * N) / t);
    m.rank_peak_bytes.push_back(static_cast<uint64_t>(all[2 * r + 1]));
  }
  m.step_time_s = slowest;
  m.tokens_per_s = static_cast<double>(accum * B * T) / slowest;
  m.tflops = s.flops / slowest / 1e12;
  m.mfu = s.flops / W / slowest / 1e9 / s.ceiling_gflops;  // per rank, against one rank's ceiling
  return m;
}

EvalMetrics Trainer::evaluate() {
  State& s = *s_;
  MOEPEAK_CHECK(s.eval_loader != nullptr, "Trainer::evaluate without eval.dataset_path");
  Backend& backend = *s.backend;
  Stream& stream = backend.default_stream();
  const int64_t B = s.cfg.training.batch_size, T = s.cfg.training.seq_len;
  const auto t0 = std::chrono::steady_clock::now();
  // NOTES: the step's metrics were taken before this, and the next step resets the peaks again,
  // so the evaluation's own peaks are measured here without touching the step's.
  backend.arena().set_phase(StepPhase::embedding);
  backend.arena().reset_peaks();
  s.eval_loader->restore(s.eval_start);
  const BatchBlock block =
      rank_batch_block(B, T, s.ranks.world_size, s.ranks.rank, s.degrees.sequence);
  std::vector<LocalBatch> locals;
  const std::exception_ptr read_error =
      read_blocks(*s.eval_loader, block, s.cfg.eval.batches, s.documents, locals);
  const int64_t scored =
      agree_on_batch(*s.comm, backend, "the evaluation after step " + std::to_string(s.completed),
                     locals, read_error);
  // Each batch's sum of cross-entropies over the scored tokens of all eval batches: their sum is
  // the mean over the whole evaluation.
  double loss = 0;
  for (const LocalBatch& local : locals) {
    const TokenBatch batch =
        upload_batch(backend, s.d_ids, s.d_labels, s.d_positions, s.d_doc_start, B, T, local);
    loss += s.model->forward_cross_entropy(batch, scored);
  }
  stream.synchronize();
  const MemoryStats mem = backend.arena().stats();
  EvalMetrics e;
  e.loss = loss;
  e.perplexity = std::exp(loss);
  e.tokens = scored;
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  e.peak_total = mem.peak_total();
  e.peak_per_set = mem.peak_per_set();
  return e;
}

void Trainer::save_checkpoint() const {
  State& s = *s_;
  Stream& stream = s.backend->default_stream();
  if (s.async_checkpoint) {
    const int64_t before = s.async_checkpoint->last_committed_step();
    s.async_checkpoint->start(s.checkpoint_folder, checkpoint_dir_name(s.completed), s.completed,
                              s.cfg.model, s.model->params(), *s.optimizer, *s.loader, stream,
                              s.cfg.checkpoint.keep_latest, s.cfg.checkpoint.write_buffer_bytes(),
                              s.carried);
    log_committed(before);
    spdlog::info("checkpoint: {}/{} snapshotted, writing in the background", s.checkpoint_folder,
                 checkpoint_dir_name(s.completed));
    return;
  }
  moepeak::save_checkpoint(s.checkpoint_folder, s.completed, s.cfg.model, s.model->params(),
                           *s.optimizer, *s.loader, stream, s.cfg.checkpoint.keep_latest,
                           s.cfg.checkpoint.write_buffer_bytes(), s.carried);
  spdlog::info("checkpoint: {}/{}", s.checkpoint_folder, checkpoint_dir_name(s.completed));
}

void Trainer::poll_checkpoint() const {
  State& s = *s_;
  if (!s.async_checkpoint || !s.async_checkpoint->in_flight()) return;
  const int64_t before = s.async_checkpoint->last_committed_step();
  s.async_checkpoint->poll(s.model->params(), *s.optimizer, s.backend->default_stream());
  log_committed(before);
}

void Trainer::finish_checkpoint() const {
  State& s = *s_;
  if (!s.async_checkpoint) return;
  const int64_t before = s.async_checkpoint->last_committed_step();
  s.async_checkpoint->finish(s.model->params(), *s.optimizer, s.backend->default_stream());
  log_committed(before);
}

void Trainer::log_committed(int64_t before) const {
  const State& s = *s_;
  const int64_t step = s.async_checkpoint->last_committed_step();
  if (step != before) {
    spdlog::info("checkpoint: {}/{} written", s.checkpoint_folder, checkpoint_dir_name(step));
  }
}

TrainResult train(const Config& cfg, const TrainOptions& options) {
  TrainResult result;
  result.run_dir = cfg.job.run_path();
  result.metrics_file = cfg.metrics.file.empty()
                            ? (fs::path(result.run_dir) / "metrics.jsonl").string()
                            : cfg.metrics.file;
  if (cfg.metrics.tensorboard)
    result.tensorboard_dir = (fs::path(result.run_dir) / "tensorboard").string();
  Trainer trainer(cfg, options);
  spdlog::info("{}", trainer.describe());
  result.first_step = trainer.completed_steps() + 1;
  result.last_step = cfg.training.steps;
  if (trainer.completed_steps() >= cfg.training.steps) {
    spdlog::info("the run is at step {} >= training.steps = {}: nothing to do",
                 trainer.completed_steps(), cfg.training.steps);
    return result;
  }
  // Rank 0 writes the metrics (every rank has the job's loss and the per-rank figures).
  std::unique_ptr<MetricsLog> metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;  // metrics.tensorboard
  if (trainer.rank() == 0) {
    create_directories(result.run_dir);
    const bool progress = draws_progress(cfg.metrics.progress, STDOUT_FILENO);
    metrics = std::make_unique<MetricsLog>(result.metrics_file, progress, result.first_step,
                                           result.last_step);
    if (cfg.metrics.tensorboard) {
      tensorboard = std::make_unique<TensorBoardWriter>(result.tensorboard_dir, result.first_step);
    }
  }
  while (trainer.completed_steps() < cfg.training.steps) {
    StepMetrics m = trainer.step();
    trainer.poll_checkpoint();  // commits an asynchronous save whose writes are done
    const bool evaluates =
        cfg.eval.enabled() && ((cfg.eval.interval > 0 && m.step % cfg.eval.interval == 0) ||
                               m.step == cfg.training.steps);
    if (evaluates) {
      m.eval = trainer.evaluate();
      result.evals.push_back({m.step, *m.eval});
    }
    if (metrics) {
      metrics->record(
          m, m.step % cfg.metrics.log_freq == 0 || m.step == cfg.training.steps || evaluates);
    }
    if (tensorboard) tensorboard->write_step(m.step, step_metrics_scalars(m));
    result.losses.push_back(m.loss);
    result.last = m;
    const bool at_interval = cfg.checkpoint.interval > 0 && m.step % cfg.checkpoint.interval == 0;
    const bool saved = cfg.checkpoint.enable && (at_interval || m.step == cfg.training.steps);
    if (saved) trainer.save_checkpoint();
    if (options.stop_signal == nullptr || m.step == cfg.training.steps) continue;
    // NOTES: every rank takes part in this collective after every step, signalled or not, so the
    // ranks leave the loop at the same step whichever of them the signal reached (srun forwards
    // it to all, a node's SIGTERM reaches only that node's ranks).
    const int signal = static_cast<int>(trainer.max_over_ranks(options.stop_signal->load()));
    if (signal == 0) continue;
    spdlog::warn("signal {} received: stopping at the step {} boundary to be requeued", signal,
                 m.step);
    // The preemption checkpoint is written even with checkpoint.enable = false: without it the
    // requeued job would start over.
    if (!saved) trainer.save_checkpoint();
    result.last_step = m.step;
    result.stopped_by_signal = signal;
    break;
  }
  trainer.finish_checkpoint();  // the end of training (or a stop) waits for the last save
  return result;
}

}  // namespace moepeak
