// probe_file.h: the probe file written by hand (keys in a readable order, shortest round-trip
// floats) and read with toml++, every entry checked. Tests: ctest -R test_probe_file.
#include "topology/probe_file.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>

#include "core/atomic_file.h"
#include "core/error.h"

namespace moepeak::topology {
namespace {

// ---- writing ------------------------------------------------------------------------------------

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Shortest text that reads back to the same double; a non-finite value is written as 0 (TOML
// has inf and nan, but a probe file never holds one) unless kept for an error message.
std::string number(double v, bool keep_nonfinite = false) {
  if (!std::isfinite(v)) {
    if (keep_nonfinite) return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
    v = 0;
  }
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, p);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

class Writer {
 public:
  void header(const std::string& h) { out_ += "\n" + h + "\n"; }
  void kv(const char* k, const std::string& v) { out_ += std::string(k) + " = " + quote(v) + "\n"; }
  void kv(const char* k, const char* v) { kv(k, std::string(v)); }
  void kv(const char* k, int64_t v) { out_ += std::string(k) + " = " + std::to_string(v) + "\n"; }
  void kv(const char* k, int v) { kv(k, static_cast<int64_t>(v)); }
  void kv(const char* k, uint64_t v) { kv(k, static_cast<int64_t>(v)); }
  void kv(const char* k, bool v) { out_ += std::string(k) + " = " + (v ? "true" : "false") + "\n"; }
  void kv(const char* k, double v) { out_ += std::string(k) + " = " + number(v) + "\n"; }
  void kv(const char* k, const std::vector<std::string>& v) {
    out_ += std::string(k) + " = [";
    for (size_t i = 0; i < v.size(); ++i) out_ += (i ? ", " : "") + quote(v[i]);
    out_ += "]\n";
  }
  void raw(const std::string& s) { out_ += s; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

void write_pci(Writer& w, const char* header, const PciDeviceInfo& d) {
  w.header(header);
  w.kv("bus_id", d.bus_id);
  w.kv("class_id", static_cast<int>(d.class_id));
  w.kv("vendor_id", static_cast<int>(d.vendor_id));
  w.kv("device_id", static_cast<int>(d.device_id));
  w.kv("os_names", d.os_names);
  w.kv("numa_node", d.numa_node);
}

// ---- reading ------------------------------------------------------------------------------------

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const toml::node& at, const std::string& what) const {
    MOEPEAK_INPUT_ERROR(path_, ":", at.source().begin.line, ": ", what);
  }
  const toml::table& table(const toml::table& parent, const std::string& key,
                           const std::string& where) const {
    const toml::node* n = parent.get(key);
    if (!n) fail(parent, "missing [" + where + "]");
    if (!n->is_table()) fail(*n, where + " must be a table");
    return *n->as_table();
  }
  // Entries of an array of tables; absent = none.
  std::vector<const toml::table*> tables(const toml::table& parent, const std::string& key,
                                         const std::string& where) const {
    std::vector<const toml::table*> out;
    const toml::node* n = parent.get(key);
    if (!n) return out;
    if (!n->is_array_of_tables()) fail(*n, where + " must be written [[" + where + "]]");
    for (const auto& e : *n->as_array()) out.push_back(e.as_table());
    return out;
  }
  const toml::node& at(const toml::table& t, const char* key, const std::string& where) const {
    const toml::node* n = t.get(key);
    if (!n) fail(t, where + " lacks the key " + key);
    return *n;
  }
  int64_t i64(const toml::table& t, const char* key, const std::string& where,
              int64_t lo = INT64_MIN) const {
    const toml::node& n = at(t, key, where);
    if (!n.is_integer()) fail(n, where + "." + key + " must be an integer");
    const int64_t v = n.as_integer()->get();
    if (v < lo)
      fail(n, where + "." + key + " must be at least " + std::to_string(lo) + ", got " +
                  std::to_string(v));
    return v;
  }
  int i32(const toml::table& t, const char* key, const std::string& where, int64_t lo = -1) const {
    const int64_t v = i64(t, key, where, lo);
    if (v > INT32_MAX) fail(at(t, key, where), where + "." + key + " is too large");
    return static_cast<int>(v);
  }
  uint64_t u64(const toml::table& t, const char* key, const std::string& where) const {
    return static_cast<uint64_t>(i64(t, key, where, 0));
  }
  uint16_t u16(const toml::table& t, const char* key, const std::string& where) const {
    const int64_t v = i64(t, key, where, 0);
    if (v > 0xffff) fail(at(t, key, where), where + "." + key + " must fit in 16 bits");
    return static_cast<uint16_t>(v);
  }
  double f64(const toml::table& t, const char* key, const std::string& where) const {
    const toml::node& n = at(t, key, where);
    if (n.is_integer()) return static_cast<double>(n.as_integer()->get());
    if (!n.is_floating_point()) fail(n, where + "." + key + " must be a number");
    return n.as_floating_point()->get();
  }
  // A rate: a number > 0 (>= 0 with `zero_ok`) and finite.
  double rate(const toml::table& t, const char* key, const std::string& where,
              bool zero_ok = false) const {
    const double v = f64(t, key, where);
    if (!std::isfinite(v) || v < 0 || (v == 0 && !zero_ok)) {
      fail(at(t, key, where), where + "." + key + " must be a " +
                                  (zero_ok ? "finite number >= 0" : "positive finite number") +
                                  ", got " + number(v, /*keep_nonfinite=*/true));
    }
    return v;
  }
  // A string that is one of `allowed`.
  std::string one_of(const toml::table& t, const char* key, const std::string& where,
                     const std::vector<std::string>& allowed) const {
    std::string v = str(t, key, where);
    if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
      fail(at(t, key, where),
           where + "." + key + " must be one of " + list + ", got \"" + v + "\"");
    }
    return v;
  }
  bool boolean(const toml::table& t, const char* key, const std::string& where) const {
    const toml::node& n = at(t, key, where);
    if (!n.is_boolean()) fail(n, where + "." + key + " must be true or false");
    return n.as_boolean()->get();
  }
  std::string str(const toml::table& t, const char* key, const std::string& where) const {
    const toml::node& n = at(t, key, where);
    if (!n.is_string()) fail(n, where + "." + key + " must be a string");
    return n.as_string()->get();
  }
  std::vector<std::string> strings(const toml::table& t, const char* key,
                                   const std::string& where) const {
    const toml::node& n = at(t, key, where);
    if (!n.is_array()) fail(n, where + "." + key + " must be an array of strings");
    std::vector<std::string> out;
    for (const auto& e : *n.as_array()) {
      if (!e.is_string()) fail(e, where + "." + key + " must be an array of strings");
      out.push_back(e.as_string()->get());
    }
    return out;
  }
  PciDeviceInfo pci(const toml::table& t, const std::string& where, PciKind kind) const {
    PciDeviceInfo d;
    d.bus_id = str(t, "bus_id", where);
    d.class_id = u16(t, "class_id", where);
    d.vendor_id = u16(t, "vendor_id", where);
    d.device_id = u16(t, "device_id", where);
    d.os_names = str(t, "os_names", where);
    d.numa_node = i32(t, "numa_node", where);
    d.kind = kind;
    return d;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

std::string probe_to_toml(const ProbeResult& r) {
  const NodeTopology& t = r.topology;
  Writer w;
  w.raw(
      "# moepeak probe file: written by `moepeak probe`, read by plan, train and tune through\n"
      "# runtime.probe_file. Keys and the budget formula: docs/probe.md. Bytes are plain "
      "integers.\n");
  w.header("[probe]");
  w.kv("format", ProbeResult::kFormat);
  w.kv("host", r.host);
  w.kv("date", r.date);
  w.kv("moepeak", r.moepeak);
  w.kv("source", t.source);
  w.kv("bench_run", r.bench_run);

  w.header("[machine]");
  w.kv("hostname", t.hostname);
  w.kv("cores", t.cores);
  w.kv("pus", t.pus);
  w.kv("memory_bytes", t.memory_bytes());
  w.kv("gpu_status", t.gpu_status);
  w.kv("cuda_driver", t.cuda_driver);
  w.kv("cuda_runtime", t.cuda_runtime);
  w.kv("nccl", t.nccl);
  w.kv("nvml", t.nvml);
  for (const auto& p : t.packages) {
    w.header("[[package]]");
    w.kv("os_index", p.os_index);
    w.kv("cpu_model", p.cpu_model);
    w.kv("cores", p.cores);
    w.kv("pus", p.pus);
  }
  for (const auto& n : t.numa_nodes) {
    w.header("[[numa]]");
    w.kv("os_index", n.os_index);
    w.kv("package", n.package);
    w.kv("memory_bytes", n.memory_bytes);
    w.kv("cpus", n.cpus);
    w.kv("cores", n.cores);
    w.kv("pus", n.pus);
  }
  for (const auto& d : t.pci_gpus) write_pci(w, "[[pci_gpu]]", d);
  for (const auto& d : t.nics) write_pci(w, "[[nic]]", d);
  for (const auto& g : t.gpus) {
    w.header("[[gpu]]");
    w.kv("index", g.index);
    w.kv("name", g.name);
    w.kv("memory_bytes", g.memory_bytes);
    w.kv("cc_major", g.cc_major);
    w.kv("cc_minor", g.cc_minor);
    w.kv("bus_id", g.bus_id);
    w.kv("numa_node", g.numa_node);
    w.kv("nvlinks", g.nvlinks);
  }
  for (const auto& l : t.gpu_links) {
    w.header("[[gpu_link]]");
    w.kv("a", l.a);
    w.kv("b", l.b);
    w.kv("peer_access", l.peer_access);
    w.kv("perf_rank", l.perf_rank);
    w.kv("nvlinks", l.nvlinks);
  }

  const HostBudgets& b = r.budgets;
  w.header("[budget]");
  w.kv("ranks_per_node", b.ranks_per_node);
  w.kv("node_reserve_fraction", b.policy.node_reserve_fraction);
  w.kv("node_reserve_min_bytes", b.policy.node_reserve_min_bytes);
  w.kv("rank_reserve_bytes", b.policy.rank_reserve_bytes);
  w.kv("cpu_device_memory_bytes", b.policy.cpu_device_memory_bytes);
  w.kv("optimizer_share", b.policy.optimizer_share);
  for (const auto& n : b.nodes) {
    w.header("[[budget.node]]");
    w.kv("numa_node", n.numa_node);
    w.kv("memory_bytes", n.memory_bytes);
    w.kv("ranks", n.ranks);
    w.kv("reserve_bytes", n.reserve_bytes);
    w.kv("rank_reserve_bytes", n.rank_reserve_bytes);
    w.kv("usable_bytes", n.usable_bytes);
  }
  for (const auto& k : b.ranks) {
    w.header("[[rank]]");
    w.kv("local_rank", k.place.local_rank);
    w.kv("gpu", k.place.gpu);
    w.kv("numa_node", k.place.numa_node);
    w.kv("cpus", k.place.cpus);
    w.kv("host_budget_bytes", k.host_budget_bytes);
    w.kv("optimizer_budget_bytes", k.optimizer_budget_bytes);
    w.kv("sco_budget_bytes", k.sco_budget_bytes);
  }

  if (r.bench_run) {
    const HostLinkBench& h = r.bench;
    w.header("[bench]");
    w.kv("bytes", h.bytes);
    w.kv("iters", h.iters);
    w.kv("notes", h.notes);
    for (const auto& row : h.rows) {
      w.header("[[bench.row]]");
      w.kv("kind", row.kind);
      w.kv("memory", row.memory);
      w.kv("gpu", row.gpu);
      w.kv("numa_node", row.numa_node);
      w.kv("local", row.local);
      w.kv("bytes", row.bytes);
      w.kv("gb_per_s", row.gb_per_s);
    }
    w.header("[bench.pinning]");
    w.kv("numa_node", h.pinning.numa_node);
    w.kv("bytes", h.pinning.bytes);
    w.kv("alloc_touch_s", h.pinning.alloc_touch_s);
    w.kv("mlock_s", h.pinning.mlock_s);
    w.kv("mlock_ok", h.pinning.mlock_ok);
    w.kv("cuda_register_s", h.pinning.cuda_register_s);
  }

  if (r.rates_measured) {
    const ProbeRates& x = r.rates;
    w.header("[rates]");
    w.kv("backend", x.backend);
    w.kv("device", x.device);
    w.kv("dtype", x.dtype);
    w.kv("ranks_sharing", x.ranks_sharing);
    w.kv("shapes", x.shapes);
    for (const ProbeRateField& f : kProbeRateFields) w.kv(f.key, x.*f.member);
  }
  return w.take();
}

void write_probe_file(const std::string& path, const ProbeResult& r) {
  write_file_atomically(path, probe_to_toml(r));
}

ProbeResult read_probe_file(const std::string& path) {
  toml::table doc;
  try {
    doc = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    if (src.begin.line == 0)
      MOEPEAK_INPUT_ERROR("cannot read probe file ", path, ": ", e.description());
    MOEPEAK_INPUT_ERROR(path, ":", src.begin.line,
                        ": not a valid probe file (TOML): ", e.description());
  }
  Reader rd(path);
  ProbeResult r;
  const toml::table& probe = rd.table(doc, "probe", "probe");
  const int format = rd.i32(probe, "format", "probe", 0);
  if (format != ProbeResult::kFormat) {
    rd.fail(*probe.get("format"),
            "probe file format " + std::to_string(format) + " is not the format " +
                std::to_string(ProbeResult::kFormat) +
                " this moepeak reads; rerun `moepeak probe` with this moepeak");
  }
  r.host = rd.str(probe, "host", "probe");
  r.date = rd.str(probe, "date", "probe");
  r.moepeak = rd.str(probe, "moepeak", "probe");
  NodeTopology& t = r.topology;
  t.source = rd.str(probe, "source", "probe");
  r.bench_run = rd.boolean(probe, "bench_run", "probe");

  const toml::table& m = rd.table(doc, "machine", "machine");
  t.hostname = rd.str(m, "hostname", "machine");
  t.cores = rd.i32(m, "cores", "machine", 0);
  t.pus = rd.i32(m, "pus", "machine", 0);
  t.gpu_status = rd.str(m, "gpu_status", "machine");
  t.cuda_driver = rd.str(m, "cuda_driver", "machine");
  t.cuda_runtime = rd.str(m, "cuda_runtime", "machine");
  t.nccl = rd.str(m, "nccl", "machine");
  t.nvml = rd.str(m, "nvml", "machine");
  for (const toml::table* p : rd.tables(doc, "package", "package")) {
    PackageInfo pk;
    pk.os_index = rd.i32(*p, "os_index", "package", 0);
    pk.cpu_model = rd.str(*p, "cpu_model", "package");
    pk.cores = rd.i32(*p, "cores", "package", 0);
    pk.pus = rd.i32(*p, "pus", "package", 0);
    t.packages.push_back(pk);
  }
  for (const toml::table* n : rd.tables(doc, "numa", "numa")) {
    NumaNodeInfo nn;
    nn.os_index = rd.i32(*n, "os_index", "numa", 0);
    nn.package = rd.i32(*n, "package", "numa");
    nn.memory_bytes = rd.u64(*n, "memory_bytes", "numa");
    nn.cpus = rd.str(*n, "cpus", "numa");
    try {
      parse_index_list(nn.cpus);
    } catch (const Error& e) {
      rd.fail(*n->get("cpus"), "numa.cpus: " + e.message());
    }
    nn.cores = rd.i32(*n, "cores", "numa", 0);
    nn.pus = rd.i32(*n, "pus", "numa", 0);
    t.numa_nodes.push_back(nn);
  }
  if (t.numa_nodes.empty()) rd.fail(doc, "no [[numa]] entry: a node has at least one NUMA node");
  for (const toml::table* d : rd.tables(doc, "pci_gpu", "pci_gpu"))
    t.pci_gpus.push_back(rd.pci(*d, "pci_gpu", PciKind::gpu));
  for (const toml::table* d : rd.tables(doc, "nic", "nic"))
    t.nics.push_back(rd.pci(*d, "nic", PciKind::nic));
  for (const toml::table* g : rd.tables(doc, "gpu", "gpu")) {
    GpuInfo gi;
    gi.index = rd.i32(*g, "index", "gpu", 0);
    gi.name = rd.str(*g, "name", "gpu");
    gi.memory_bytes = rd.u64(*g, "memory_bytes", "gpu");
    gi.cc_major = rd.i32(*g, "cc_major", "gpu", 0);
    gi.cc_minor = rd.i32(*g, "cc_minor", "gpu", 0);
    gi.bus_id = rd.str(*g, "bus_id", "gpu");
    gi.numa_node = rd.i32(*g, "numa_node", "gpu");
    gi.nvlinks = rd.i32(*g, "nvlinks", "gpu");
    t.gpus.push_back(gi);
  }
  for (const toml::table* l : rd.tables(doc, "gpu_link", "gpu_link")) {
    GpuLinkInfo li;
    li.a = rd.i32(*l, "a", "gpu_link", 0);
    li.b = rd.i32(*l, "b", "gpu_link", 0);
    li.peer_access = rd.boolean(*l, "peer_access", "gpu_link");
    li.perf_rank = rd.i32(*l, "perf_rank", "gpu_link");
    li.nvlinks = rd.i32(*l, "nvlinks", "gpu_link");
    if (li.a >= li.b || li.b >= static_cast<int>(t.gpus.size())) {
      rd.fail(*l, "gpu_link " + std::to_string(li.a) + "-" + std::to_string(li.b) +
                      " does not name two [[gpu]] entries (a < b)");
    }
    t.gpu_links.push_back(li);
  }

  HostBudgets& b = r.budgets;
  const toml::table& bt = rd.table(doc, "budget", "budget");
  b.ranks_per_node = rd.i32(bt, "ranks_per_node", "budget", 1);
  b.policy.node_reserve_fraction = rd.f64(bt, "node_reserve_fraction", "budget");
  b.policy.node_reserve_min_bytes = rd.u64(bt, "node_reserve_min_bytes", "budget");
  b.policy.rank_reserve_bytes = rd.u64(bt, "rank_reserve_bytes", "budget");
  b.policy.cpu_device_memory_bytes = rd.u64(bt, "cpu_device_memory_bytes", "budget");
  b.policy.optimizer_share = rd.f64(bt, "optimizer_share", "budget");
  for (const toml::table* n : rd.tables(bt, "node", "budget.node")) {
    NodeBudget nb;
    nb.numa_node = rd.i32(*n, "numa_node", "budget.node", 0);
    nb.memory_bytes = rd.u64(*n, "memory_bytes", "budget.node");
    nb.ranks = rd.i32(*n, "ranks", "budget.node", 0);
    nb.reserve_bytes = rd.u64(*n, "reserve_bytes", "budget.node");
    nb.rank_reserve_bytes = rd.u64(*n, "rank_reserve_bytes", "budget.node");
    nb.usable_bytes = rd.u64(*n, "usable_bytes", "budget.node");
    b.nodes.push_back(nb);
  }
  for (const toml::table* k : rd.tables(doc, "rank", "rank")) {
    RankBudget rb;
    rb.place.local_rank = rd.i32(*k, "local_rank", "rank", 0);
    rb.place.gpu = rd.i32(*k, "gpu", "rank");
    rb.place.numa_node = rd.i32(*k, "numa_node", "rank", 0);
    rb.place.cpus = rd.str(*k, "cpus", "rank");
    try {
      parse_index_list(rb.place.cpus);  // binding reads it back (topology/binding.cpp)
    } catch (const Error& e) {
      rd.fail(*k->get("cpus"), "rank.cpus: " + e.message());
    }
    rb.host_budget_bytes = rd.u64(*k, "host_budget_bytes", "rank");
    rb.optimizer_budget_bytes = rd.u64(*k, "optimizer_budget_bytes", "rank");
    rb.sco_budget_bytes = rd.u64(*k, "sco_budget_bytes", "rank");
    if (rb.place.local_rank != static_cast<int>(b.ranks.size())) {
      rd.fail(*k,
              "[[rank]] entries must list local ranks 0, 1, ... in order; expected local_rank = " +
                  std::to_string(b.ranks.size()));
    }
    if (rb.optimizer_budget_bytes + rb.sco_budget_bytes > rb.host_budget_bytes) {
      rd.fail(*k, "rank " + std::to_string(rb.place.local_rank) +
                      ": optimizer_budget_bytes + sco_budget_bytes exceed host_budget_bytes");
    }
    b.ranks.push_back(rb);
  }
  if (static_cast<int>(b.ranks.size()) != b.ranks_per_node) {
    rd.fail(bt, "budget.ranks_per_node = " + std::to_string(b.ranks_per_node) +
                    " but the file has " + std::to_string(b.ranks.size()) + " [[rank]] entries");
  }

  if (r.bench_run) {
    const toml::table& h = rd.table(doc, "bench", "bench");
    r.bench.bytes = rd.u64(h, "bytes", "bench");
    r.bench.iters = rd.i32(h, "iters", "bench", 0);
    r.bench.notes = rd.strings(h, "notes", "bench");
    for (const toml::table* row : rd.tables(h, "row", "bench.row")) {
      BandwidthRow br;
      br.kind = rd.str(*row, "kind", "bench.row");
      br.memory = rd.str(*row, "memory", "bench.row");
      br.gpu = rd.i32(*row, "gpu", "bench.row");
      br.numa_node = rd.i32(*row, "numa_node", "bench.row", 0);
      br.local = rd.boolean(*row, "local", "bench.row");
      br.bytes = rd.u64(*row, "bytes", "bench.row");
      br.gb_per_s = rd.f64(*row, "gb_per_s", "bench.row");
      r.bench.rows.push_back(br);
    }
    const toml::table& p = rd.table(h, "pinning", "bench.pinning");
    r.bench.pinning.numa_node = rd.i32(p, "numa_node", "bench.pinning", 0);
    r.bench.pinning.bytes = rd.u64(p, "bytes", "bench.pinning");
    r.bench.pinning.alloc_touch_s = rd.f64(p, "alloc_touch_s", "bench.pinning");
    r.bench.pinning.mlock_s = rd.f64(p, "mlock_s", "bench.pinning");
    r.bench.pinning.mlock_ok = rd.boolean(p, "mlock_ok", "bench.pinning");
    r.bench.pinning.cuda_register_s = rd.f64(p, "cuda_register_s", "bench.pinning");
  }

  if (doc.get("rates") != nullptr) {  // optional: older files and --no-bench have none
    const toml::table& t = rd.table(doc, "rates", "rates");
    ProbeRates& x = r.rates;
    x.backend = rd.one_of(t, "backend", "rates", {"cpu", "cuda"});
    x.device = rd.str(t, "device", "rates");
    x.dtype = rd.one_of(t, "dtype", "rates", {"f32", "bf16"});
    x.ranks_sharing = rd.i32(t, "ranks_sharing", "rates", 1);
    x.shapes = rd.str(t, "shapes", "rates");
    for (const ProbeRateField& f : kProbeRateFields)
      x.*f.member = rd.rate(t, f.key, "rates", f.zero_ok);
    r.rates_measured = true;
  }
  return r;
}

const RankBudget& rank_budget(const ProbeResult& r, int local_rank, const std::string& path) {
  if (local_rank < 0 || local_rank >= static_cast<int>(r.budgets.ranks.size())) {
    MOEPEAK_INPUT_ERROR(
        "probe file ", path, " has budgets for ", r.budgets.ranks.size(), " rank",
        r.budgets.ranks.size() == 1 ? "" : "s", " per node, but this is local rank ", local_rank,
        ": rerun `moepeak probe --ranks-per-node N` with this job's ranks per node");
  }
  return r.budgets.ranks[local_rank];
}

nlohmann::json probe_to_json(const ProbeResult& r) {
  // The TOML document, parsed back and turned into JSON: one source for both layouts.
  toml::table doc = toml::parse(probe_to_toml(r));
  std::function<nlohmann::json(const toml::node&)> conv =
      [&](const toml::node& n) -> nlohmann::json {
    if (auto t = n.as_table()) {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& [k, v] : *t) o[std::string(k.str())] = conv(v);
      return o;
    }
    if (auto a = n.as_array()) {
      nlohmann::json o = nlohmann::json::array();
      for (const auto& v : *a) o.push_back(conv(v));
      return o;
    }
    if (auto s = n.as_string()) return s->get();
    if (auto i = n.as_integer()) return i->get();
    if (auto f = n.as_floating_point()) return f->get();
    if (auto b = n.as_boolean()) return b->get();
    return nullptr;
  };
  return conv(doc);
}

}  // namespace moepeak::topology
