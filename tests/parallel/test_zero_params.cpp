// ZeroParamStore (core/model/zero_params.h) on W real rank processes against the single-rank
// ParamStore, which every rank builds locally on a backend of its own as the reference.
//
// Model: vocab 11, hidden 7 (odd, so most dense tensors are not multiples of W and the last
// shards carry zero padding), 2 layers, 4 heads / 2 kv heads, head_dim 4, ffn 6, 4 experts top-2.
// Checked in f32 and f64:
//   0. ParamStore's values (it now generates through param_init) have the fingerprints they had
//      before that refactor;
//   1. after initialize, gather_full of every parameter on every rank is bitwise equal to the
//      reference; shard padding is zero; the all-reduced sum of squares of flat_values() equals
//      the reference's; param_init::element agrees with ParamStore element by element;
//   2. a GatheredGroup of a layer (dense params + this rank's experts) gives the full tensors;
//      gathered grads start at zero; each rank writes f(rank, index), reduce_scatter_grads adds
//      the sum over ranks of its slice to its shard grads (which held known values); padding
//      stays zero; expert grads written through the group are the stored ones, not reduced;
//   3. the weights / grads live sets while a group is gathered equal persistent + gathered
//      (zero_persistent_bytes, zero_gathered_bytes), and drop back to persistent after;
//   4. load_full of known full tensors, then gather_full, round-trips;
//   5. E % W != 0 is an Error naming E and W.
//
//     ctest -R zero_params --output-on-failure
//     mpirun --allow-run-as-root --oversubscribe -np 4 build/tests/parallel/test_zero_params
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/model/param_init.h"
#include "core/model/param_layout.h"
#include "core/model/zero_params.h"
#include "core/model/zero_traffic.h"
#include "core/runtime/backend.h"

namespace moepeak {
namespace {

ModelConfig tiny_model() {
  ModelConfig m;
  m.vocab_size = 11;
  m.hidden_size = 7;
  m.intermediate_size = 6;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 4;
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  return m;
}

constexpr uint64_t kSeed = 1234;
constexpr double kRange = 0.5;

std::unique_ptr<Backend> make_backend() {
  BackendOptions options;
  options.device_memory = 16ull << 20;
  options.cpu_threads = 1;
  return Backend::create(options);
}

std::vector<char> to_host(Backend& backend, const Tensor& t, Stream& stream) {
  std::vector<char> out(t.nbytes());
  backend.copy_async(out.data(), t.data(), out.size(), CopyKind::device_to_host, stream);
  stream.synchronize();
  return out;
}

std::vector<double> to_doubles(const std::vector<char>& bytes, DType dtype) {
  std::vector<double> out(bytes.size() / dtype_size(dtype));
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::f32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      out[i] = f;
    } else {
      std::memcpy(&out[i], bytes.data() + 8 * i, 8);
    }
  }
  return out;
}

std::vector<char> to_bytes(const std::vector<double>& v, DType dtype) {
  std::vector<char> out(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    param_init::store(dtype, v[i], out.data() + i * dtype_size(dtype));
  }
  return out;
}

void write(Backend& backend, const Tensor& t, const std::vector<double>& v, Stream& stream) {
  ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::vector<char> bytes = to_bytes(v, t.dtype());
  backend.copy_async(t.data(), bytes.data(), bytes.size(), CopyKind::host_to_device, stream);
  stream.synchronize();
}

// The single-rank reference: every parameter's bytes after ParamStore::initialize.
std::vector<std::vector<char>> reference_values(const ModelConfig& model, DType dtype) {
  auto backend = make_backend();
  ParamStore ref(*backend, model, dtype);
  Stream& stream = backend->default_stream();
  ref.initialize(kSeed, kRange, stream);
  std::vector<std::vector<char>> out;
  for (size_t i = 0; i < ref.layout().params().size(); ++i) {
    out.push_back(to_host(*backend, ref.value(static_cast<int>(i)), stream));
  }
  return out;
}

class Env {
 public:
  Env() : backend_(make_backend()), comm_(make_comm(*backend_, init_process_group())) {}
  Backend& backend() { return *backend_; }
  Stream& stream() { return backend_->default_stream(); }
  Comm& comm() { return *comm_; }
  MemoryStats stats() { return backend_->arena().stats(); }

 private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Comm> comm_;
};

const DType kDtypes[] = {DType::f32, DType::f64};

// A layer's dense params and this rank's experts of that layer.
std::vector<int> layer_group(const ZeroParamStore& store, int layer) {
  const LayerParamIndex& L = store.layout().layers[layer];
  std::vector<int> g = {L.input_norm, L.q, L.k, L.v, L.o, L.post_norm, L.router};
  for (size_t j = 0; j < L.w1.size(); ++j) {
    for (int p : {L.w1[j], L.w2[j], L.w3[j]}) {
      if (store.is_local(p)) g.push_back(p);
    }
  }
  return g;
}

// FNV-1a over the bytes of every parameter in layout order.
uint64_t fingerprint(const std::vector<std::vector<char>>& values) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& v : values) {
    for (char c : v) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  }
  return h;
}

// ParamStore::initialize now calls param_init; these fingerprints were taken from its values
// before that refactor (its own generator), so single-rank weights are bit-identical to before.
TEST(ZeroParams, SingleRankValuesUnchanged) {
  const ModelConfig model = tiny_model();
  EXPECT_EQ(fingerprint(reference_values(model, DType::f32)), 0x9901165327619cccull);
  EXPECT_EQ(fingerprint(reference_values(model, DType::f64)), 0xc5c85b1579ebe7ecull);
}

TEST(ZeroParams, InitializeMatchesSingleRank) {
  const ModelConfig model = tiny_model();
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    auto ref = reference_values(model, dtype);
    Env env;
    ZeroParamStore store(env.backend(), model, dtype, env.comm());
    store.initialize(kSeed, kRange, env.stream());
    const auto& params = store.layout().params();
    int experts_here = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<char> full = store.gather_full(static_cast<int>(i), env.stream());
      ASSERT_EQ(full.size(), ref[i].size()) << params[i].name;
      EXPECT_EQ(std::memcmp(full.data(), ref[i].data(), full.size()), 0) << params[i].name;
      if (store.is_expert(static_cast<int>(i))) {
        experts_here += store.is_local(static_cast<int>(i));
        EXPECT_EQ(store.is_local(static_cast<int>(i)),
                  store.expert_owner(static_cast<int>(i)) == env.comm().rank());
      }
    }
    EXPECT_EQ(experts_here, 2 * 3 * 4 / env.comm().world_size());  // layers * (w1,w2,w3) * E/W
    // The generator element by element, without walking the stream, against the reference.
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<double> r = to_doubles(ref[i], dtype);
      for (size_t j = 0; j < r.size(); ++j) {
        double v =
            param_init::element(kSeed, i, params[i].is_norm, kRange, static_cast<int64_t>(j));
        double want = dtype == DType::f32 ? static_cast<double>(static_cast<float>(v)) : v;
        ASSERT_EQ(want, r[j]) << params[i].name << " element " << j;
      }
    }
    // Shard padding is zero; the sum of squares over ranks counts every element once.
    double local = 0, expected = 0;
    for (const auto& piece : store.local_pieces()) {
      std::vector<double> v = to_doubles(to_host(env.backend(), piece.value, env.stream()), dtype);
      if (!piece.is_expert) {
        int64_t n = params[piece.param].shape.numel();
        int64_t s = store.shard_elements(piece.param);
        ASSERT_EQ(static_cast<int64_t>(v.size()), s);
        for (int64_t k = 0; k < s; ++k) {
          if (env.comm().rank() * s + k >= n) {
            EXPECT_EQ(v[k], 0.0) << params[piece.param].name;
          }
        }
      }
    }
    for (double x : to_doubles(to_host(env.backend(), store.flat_values(), env.stream()), dtype)) {
      local += x * x;
    }
    for (const auto& r : ref) {
      for (double x : to_doubles(r, dtype)) expected += x * x;
    }
    double total = local;
    env.comm().all_reduce(&total, &total, 1, DType::f64, ReduceOp::sum, env.stream());
    env.stream().synchronize();
    EXPECT_NEAR(total, expected, 1e-12 * expected);
  }
}

TEST(ZeroParams, GatherAndReduceScatter) {
  const ModelConfig model = tiny_model();
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    auto ref = reference_values(model, dtype);
    Env env;
    const int rank = env.comm().rank(), world = env.comm().world_size();
    ZeroParamStore store(env.backend(), model, dtype, env.comm());
    store.initialize(kSeed, kRange, env.stream());
    const auto& params = store.layout().params();
    // Known starting shard grads: 100 + k on real elements, 0 on padding.
    for (const auto& piece : store.local_pieces()) {
      int64_t n = params[piece.param].shape.numel(), m = piece.grad.numel();
      std::vector<double> g0(static_cast<size_t>(m));
      for (int64_t k = 0; k < m; ++k) {
        bool real = piece.is_expert || rank * m + k < n;
        g0[k] = real ? 100.0 + static_cast<double>(k) : 0.0;
      }
      write(env.backend(), piece.grad, g0, env.stream());
    }
    auto f = [](int r, int64_t idx) { return (r + 1) + 0.5 * static_cast<double>(idx); };
    for (int layer = 0; layer < 2; ++layer) {
      SCOPED_TRACE("layer " + std::to_string(layer));
      std::vector<int> group_params = layer_group(store, layer);
      {
        ZeroParamStore::GatheredGroup group = store.gather(group_params, env.stream());
        env.stream().synchronize();
        for (int p : group_params) {
          std::vector<char> v = to_host(env.backend(), group.value(p), env.stream());
          ASSERT_EQ(v.size(), ref[p].size()) << params[p].name;
          EXPECT_EQ(std::memcmp(v.data(), ref[p].data(), v.size()), 0) << params[p].name;
          EXPECT_EQ(group.value(p).shape(), params[p].shape);
          int64_t n = params[p].shape.numel();
          std::vector<double> g =
              to_doubles(to_host(env.backend(), group.grad(p), env.stream()), dtype);
          std::vector<double> w(static_cast<size_t>(n));
          for (int64_t idx = 0; idx < n; ++idx) {
            if (!store.is_expert(p)) {
              EXPECT_EQ(g[idx], 0.0) << params[p].name;
            }
            w[idx] = store.is_expert(p) ? -static_cast<double>(idx) : f(rank, idx);
          }
          write(env.backend(), group.grad(p), w, env.stream());
        }
        group.reduce_scatter_grads(env.stream());
        env.stream().synchronize();
      }
      for (int p : group_params) {
        int64_t n = params[p].shape.numel();
        std::vector<double> g =
            to_doubles(to_host(env.backend(), store.local_grad(p), env.stream()), dtype);
        if (store.is_expert(p)) {
          for (int64_t idx = 0; idx < n; ++idx) EXPECT_EQ(g[idx], -static_cast<double>(idx));
          continue;
        }
        int64_t s = store.shard_elements(p);
        ASSERT_EQ(static_cast<int64_t>(g.size()), s);
        for (int64_t k = 0; k < s; ++k) {
          int64_t idx = rank * s + k;
          double want = 0.0;
          if (idx < n) {
            want = 100.0 + static_cast<double>(k);
            for (int q = 0; q < world; ++q) want += f(q, idx);
          }
          EXPECT_EQ(g[k], want) << params[p].name << " shard element " << k;
        }
      }
    }
    // Params outside the groups kept their starting grads.
    Tensor emb_grad = store.local_grad(store.layout().embed);
    std::vector<double> emb = to_doubles(to_host(env.backend(), emb_grad, env.stream()), dtype);
    int64_t n = params[store.layout().embed].shape.numel();
    for (size_t k = 0; k < emb.size(); ++k) {
      bool real = rank * static_cast<int64_t>(emb.size()) + static_cast<int64_t>(k) < n;
      EXPECT_EQ(emb[k], real ? 100.0 + static_cast<double>(k) : 0.0);
    }
    // Another rank's expert cannot be gathered here (with W > 1).
    if (world > 1) {
      const LayerParamIndex& L = store.layout().layers[0];
      int foreign = rank == 0 ? L.w1.back() : L.w1.front();
      std::vector<int> bad = {foreign};
      EXPECT_THROW(store.gather(bad, env.stream()), Error);
    }
  }
}

TEST(ZeroParams, PeaksAreShardPlusOneGatheredGroup) {
  const ModelConfig model = tiny_model();
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Env env;
    const int world = env.comm().world_size();
    ZeroParamStore store(env.backend(), model, dtype, env.comm());
    store.initialize(kSeed, kRange, env.stream());
    const ZeroBytes persistent = zero_persistent_bytes(model, dtype, world);
    EXPECT_EQ(env.stats().current()[LiveSet::weights], persistent.weights);
    EXPECT_EQ(env.stats().current()[LiveSet::grads], persistent.grads);
    EXPECT_EQ(store.flat_values().nbytes(), store.flat_grads().nbytes());
    // Without prefetch a pass holds one group at a time: the pass's peaks cover each group.
    const ZeroBytes largest = zero_pass_gathered_bytes(
        model, dtype, ParallelDegrees::uniform(world), LmHeadSharding::zero3, 0);
    auto groups = zero_gather_groups(store.layout());
    groups.push_back(layer_group(store, 1));  // dense + local experts: experts cost nothing extra
    for (const auto& g : groups) {
      const ZeroBytes gathered = zero_gathered_bytes(model, dtype, world, g);
      EXPECT_GT(gathered.weights, 0u);
      EXPECT_LE(gathered.weights, largest.weights);
      EXPECT_LE(gathered.grads, largest.grads);
      env.backend().arena().reset_peaks();
      {
        ZeroParamStore::GatheredGroup group = store.gather(g, env.stream());
        EXPECT_EQ(env.stats().current()[LiveSet::weights], persistent.weights + gathered.weights);
        EXPECT_EQ(env.stats().current()[LiveSet::grads], persistent.grads + gathered.grads);
        group.reduce_scatter_grads(env.stream());
        env.stream().synchronize();
      }
      MemoryStats s = env.stats();
      EXPECT_EQ(s.current()[LiveSet::weights], persistent.weights);
      EXPECT_EQ(s.current()[LiveSet::grads], persistent.grads);
      EXPECT_EQ(s.peak_per_set()[LiveSet::weights], persistent.weights + gathered.weights);
      EXPECT_EQ(s.peak_per_set()[LiveSet::grads], persistent.grads + gathered.grads);
    }
    // The persistent shard is about 1/W of the dense model plus E/W experts.
    ParamLayout layout(model);
    const uint64_t whole =
        DeviceArena::footprint(static_cast<uint64_t>(layout.total_elements()) * dtype_size(dtype));
    EXPECT_LE(persistent.weights, whole);
    if (world > 1) {
      EXPECT_LT(persistent.weights, whole);
    }
  }
}

TEST(ZeroParams, LoadFullRoundTrip) {
  const ModelConfig model = tiny_model();
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Env env;
    ZeroParamStore store(env.backend(), model, dtype, env.comm());
    store.initialize(kSeed, kRange, env.stream());
    const auto& params = store.layout().params();
    std::vector<std::vector<char>> fulls;
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<double> v(static_cast<size_t>(params[i].shape.numel()));
      for (size_t j = 0; j < v.size(); ++j) {
        v[j] = static_cast<double>(i) + static_cast<double>(j) / 128.0;
      }
      fulls.push_back(to_bytes(v, dtype));
      store.load_full(static_cast<int>(i), fulls.back().data(), env.stream());
    }
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<char> full = store.gather_full(static_cast<int>(i), env.stream());
      ASSERT_EQ(full.size(), fulls[i].size());
      EXPECT_EQ(std::memcmp(full.data(), fulls[i].data(), full.size()), 0) << params[i].name;
    }
    for (const auto& piece : store.local_pieces()) {
      if (piece.is_expert) continue;
      std::vector<double> v = to_doubles(to_host(env.backend(), piece.value, env.stream()), dtype);
      int64_t n = params[piece.param].shape.numel(), s = piece.value.numel();
      for (int64_t k = 0; k < s; ++k) {
        if (env.comm().rank() * s + k >= n) {
          EXPECT_EQ(v[k], 0.0) << params[piece.param].name;
        }
      }
    }
  }
}

// The LM head stored by vocabulary rows (Ring-DTP): rank r keeps rows [floor(rV/W),
// floor((r+1)V/W)) — V = 11 splits unevenly on 2 and 4 ranks — whole and never gathered; the
// other params keep their ZeRO-3 layout; gather_full and load_full see the full tensor.
TEST(ZeroParams, LmHeadByVocabularyRows) {
  const ModelConfig model = tiny_model();
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    auto ref = reference_values(model, dtype);
    Env env;
    const int rank = env.comm().rank(), world = env.comm().world_size();
    env.backend().arena().reset_peaks();
    ZeroParamStore store(env.backend(), model, dtype, env.comm(), LmHeadSharding::vocab_rows);
    store.initialize(kSeed, kRange, env.stream());
    const ParamLayout& layout = store.layout();
    const int head = layout.lm_head;
    const int64_t V = model.vocab_size, H = model.hidden_size;
    const auto [begin, end] = lm_head_rows(V, world, rank);
    EXPECT_EQ(begin, rank * V / world);
    EXPECT_EQ(end, (rank + 1) * V / world);
    ASSERT_TRUE(store.is_row_sharded(head));
    const Tensor rows = store.local_value(head);
    ASSERT_EQ(rows.shape(), (Shape{end - begin, H}));
    // This rank's rows are the reference's rows [begin, end), bit for bit.
    std::vector<char> mine = to_host(env.backend(), rows, env.stream());
    const size_t b = dtype_size(dtype);
    EXPECT_EQ(std::memcmp(mine.data(), ref[head].data() + static_cast<size_t>(begin * H) * b,
                          mine.size()),
              0);
    for (size_t i = 0; i < layout.params().size(); ++i) {
      std::vector<char> full = store.gather_full(static_cast<int>(i), env.stream());
      EXPECT_EQ(full, ref[i]) << layout.params()[i].name;
    }
    // The final group gathers the norm only; naming the head in a gather is an error.
    const auto groups = zero_gather_groups(layout, LmHeadSharding::vocab_rows);
    EXPECT_EQ(groups.back(), std::vector<int>{layout.final_norm});
    std::vector<int> with_head{head};
    EXPECT_THROW(store.gather(with_head, env.stream()), Error);
    // Persistent bytes: this rank's buffers, at most the planner's (largest-rank) number.
    const ZeroBytes planned =
        zero_persistent_bytes(model, dtype, world, LmHeadSharding::vocab_rows);
    const uint64_t measured = env.backend().arena().stats().peak_per_set()[LiveSet::weights];
    EXPECT_LE(measured, planned.weights);
    if (end - begin == (V + world - 1) / world) {
      EXPECT_EQ(measured, planned.weights);
    }
    // load_full keeps this rank's rows.
    std::vector<char> poisoned(ref[head].size());
    for (size_t k = 0; k < poisoned.size(); ++k) poisoned[k] = static_cast<char>(k * 7 + 1);
    store.load_full(head, poisoned.data(), env.stream());
    EXPECT_EQ(store.gather_full(head, env.stream()), poisoned);
  }
}

TEST(ZeroParams, ExpertsMustDivideWorld) {
  Env env;
  const int world = env.comm().world_size();
  if (world == 1) GTEST_SKIP() << "every E divides W = 1";
  ModelConfig model = tiny_model();
  model.num_local_experts = world + 1;
  // Ep = W here (the Comm& form: every degree W).
  const std::string e = "E = " + std::to_string(world + 1), w = "Ep = " + std::to_string(world);
  try {
    ZeroParamStore store(env.backend(), model, DType::f32, env.comm());
    ADD_FAILURE() << "no error for E % W != 0";
  } catch (const Error& err) {
    EXPECT_NE(err.message().find(e), std::string::npos) << err.message();
    EXPECT_NE(err.message().find(w), std::string::npos) << err.message();
  }
  EXPECT_THROW(zero_persistent_bytes(model, DType::f32, world), Error);
}

}  // namespace
}  // namespace moepeak
