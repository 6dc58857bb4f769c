// sparsim probe: a hardware profile of the machine at hand for sparsim predict, measured at each
// thread count: STREAM-like copy and read bandwidth (arrays past the last-level cache), the
// prefill GEMM and decode GEMV rates of sparsim's own linear() kernel, and the cost of an empty
// kernel launch. Each thread count runs in a child process (Kokkos fixes its thread count at
// start-up); medians of repetitions.
#include "common.hpp"
#include "core/blas_core.hpp"
#include "core/device_blas.hpp"
#include "core/timer.hpp"
#include "cost/hardware.hpp"
#include "io/run_file.hpp"
#include "kernels/bandwidth.hpp"
#include "kernels/host_gemv.hpp"
#include "kernels/linear.hpp"
#include "model/weights.hpp"
#include "records.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace sparsim::app {

namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const std::size_t c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "unknown CPU";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

/// The measurements at the current thread count, as the JSON of one ThreadRates row plus
/// details.
template <class E>
nlohmann::json measure(const E& exec, int threads, double array_bytes, int reps, Clock clock) {
  nlohmann::json j;
  j["threads"] = threads;
  // --- copy and read bandwidth over arrays of array_bytes each
  {
    const kernels::StreamBandwidth bw =
        kernels::stream_bandwidth(exec, static_cast<std::size_t>(array_bytes), reps, clock);
    j["copy_bandwidth"] = bw.copy.median;
    j["read_bandwidth"] = bw.read.median;
    j["copy_bandwidth_range"] = {bw.copy.min, bw.copy.max};
    j["runtime_copy_bandwidth"] = bw.runtime_copy.median;
    j["read_bandwidth_range"] = {bw.read.min, bw.read.max};
    j["read_checksum"] = bw.checksum;
  }
  LinearScratch<E> scratch;
  auto make_w = [](int out, int in, std::uint64_t seed) {
    Matrix<E> w;
    w.dtype = DType::F32;
    w.rows = out;
    w.cols = in;
    w.f32 = decltype(w.f32)("sparsim::probe::w", out, in);
    auto h = Kokkos::create_mirror_view(w.f32);
    std::uint64_t s = seed;
    for (int r = 0; r < out; ++r)
      for (int c = 0; c < in; ++c) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        h(r, c) = static_cast<float>(static_cast<std::int64_t>(s >> 40) % 2001 - 1000) * 1e-3f;
      }
    Kokkos::deep_copy(w.f32, h);
    return w;
  };
  constexpr bool host =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename E::memory_space>::accessible;
  // --- prefill GEMM through linear(): token rows against W[out][in]. Host: 512 rows, W[2048]
  // [576 or 2048] (OpenBLAS tiles); a GPU: 2048 rows against W[4096][4096] (cuBLAS), the shape
  // of a 7B model's prefill projections, far too small a product otherwise to fill the device
  {
    nlohmann::json shapes = nlohmann::json::array();
    double best = 0;
    const int rows = host ? 512 : 2048, out = host ? 2048 : 4096;
    const std::vector<int> ins = host ? std::vector<int>{576, 2048} : std::vector<int>{4096};
    for (int in : ins) {
      const Matrix<E> w = make_w(out, in, 7);
      Mat<E> x("sparsim::probe::x", rows, in), y("sparsim::probe::y", rows, out);
      Kokkos::deep_copy(x, 0.5f);
      std::vector<double> t;
      for (int r = 0; r < reps + 1; ++r) {
        exec.fence();
        Stopwatch sw(clock);
        linear(exec, CMat<E>(x), w, y, scratch);
        exec.fence();
        if (r > 0) t.push_back(sw.seconds());
      }
      const double rate = 2.0 * rows * out * in / median_of(t);
      shapes.push_back({{"rows", rows}, {"out", out}, {"in", in}, {"flops_per_s", rate}});
      best = std::max(best, rate);
    }
    j["sgemm_flops"] = best;
    j["sgemm_shapes"] = shapes;
  }
  // --- a GPU: the same product with bf16 weights in bf16 arithmetic (--bf16-compute: rows
  // rounded to bf16, cuBLAS on the tensor cores, fp32 accumulation)
  if (!host && device_blas::available()) {
    const int rows = 2048, out = 4096, in = 4096;
    Matrix<E> w;
    w.dtype = DType::BF16;
    w.rows = out;
    w.cols = in;
    w.bf16 = decltype(w.bf16)("sparsim::probe::w16", out, in);
    Kokkos::deep_copy(w.bf16, bf16_t::from_float(0.01f));
    Mat<E> x("sparsim::probe::x16", rows, in), y("sparsim::probe::y16", rows, out);
    Kokkos::deep_copy(x, 0.5f);
    LinearScratch<E> s16;
    s16.bf16_compute = true;
    std::vector<double> t;
    for (int r = 0; r < reps + 1; ++r) {
      exec.fence();
      Stopwatch sw(clock);
      linear(exec, CMat<E>(x), w, y, s16);
      exec.fence();
      if (r > 0) t.push_back(sw.seconds());
    }
    j["bf16_gemm_flops"] = 2.0 * rows * out * in / median_of(t);
    j["bf16_gemm_shape"] = {{"rows", rows}, {"out", out}, {"in", in}};
  }
  // --- decode GEMV through linear(): one row against W[2048][2048] copies spanning
  // array_bytes, taken in turn so that each comes from memory
  {
    const int out = host ? 2048 : 4096, in = host ? 2048 : 4096;
    const double wbytes = 4.0 * out * in;
    const int copies = std::max(2, static_cast<int>(array_bytes / wbytes) + 1);
    std::vector<Matrix<E>> ws;
    for (int k = 0; k < copies; ++k)
      ws.push_back(make_w(out, in, 11 + static_cast<std::uint64_t>(k)));
    Mat<E> x("sparsim::probe::xv", 1, in), y("sparsim::probe::yv", 1, out);
    Kokkos::deep_copy(x, 0.5f);
    std::vector<double> t;
    for (int r = 0; r < reps + 1; ++r) {
      exec.fence();
      Stopwatch sw(clock);
      for (const Matrix<E>& w : ws) linear(exec, CMat<E>(x), w, y, scratch);
      exec.fence();
      if (r > 0) t.push_back(sw.seconds() / copies);
    }
    j["gemv_bandwidth"] = (wbytes + 4.0 * (in + out)) / median_of(t);
    j["gemv_shape"] = {{"out", out}, {"in", in}, {"copies", copies}};
  }
  // --- launch overhead: an empty kernel and a fence, in batches of 200. On a GPU the kernels
  // of a forward call are issued back to back without fences, so what each one costs beyond
  // its work is the time per launch of such a stream (the host's issue rate or the device's
  // smallest kernel, whichever is slower): measured too, and taken as the profile's figure
  {
    const int batch = 200;
    std::vector<double> t, tb;
    const int lanes = host ? threads : 1024;
    for (int r = 0; r < 5 * reps + 1; ++r) {
      exec.fence();
      Stopwatch sw(clock);
      for (int i = 0; i < batch; ++i) {
        Kokkos::parallel_for("sparsim::probe::empty", Kokkos::RangePolicy<E>(exec, 0, lanes),
                             KOKKOS_LAMBDA(const int){});
        exec.fence();
      }
      if (r > 0) t.push_back(sw.seconds() / batch);
      exec.fence();
      sw.reset();
      for (int i = 0; i < batch; ++i)
        Kokkos::parallel_for("sparsim::probe::empty", Kokkos::RangePolicy<E>(exec, 0, lanes),
                             KOKKOS_LAMBDA(const int){});
      exec.fence();
      if (r > 0) tb.push_back(sw.seconds() / batch);
    }
    j["launch_overhead_sync_s"] = median_of(t);
    j["launch_overhead_stream_s"] = median_of(tb);
    j["launch_overhead_s"] = host ? median_of(t) : median_of(tb);
  }
  return j;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  require(n > 0, "cannot find the sparsim executable (/proc/self/exe)");
  buf[n] = 0;
  return buf;
}

std::string run_child(const std::string& cmd) {
  std::FILE* p = ::popen(cmd.c_str(), "r");
  require(p != nullptr, "cannot start '{}'", cmd);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  require(st == 0, "the probe at one thread count failed ({}): {}", cmd, out);
  return out;
}

/// A GPU's profile: one measurement in this process (no thread counts), its roofs from the
/// device: copy bandwidth (the faster of the copy kernel and the runtime's copy, or the read),
/// sparsim's prefill product in fp32 and in bf16 (cuBLAS), the decode GEMV's bandwidth, and the
/// cost per kernel of a stream of back-to-back launches.
int probe_device(const CommonOptions& co, const std::string& out, const std::string& name, int reps,
                 double size_mb, Clock clock, const std::string& clock_name, int argc,
                 char** argv) {
  io::AtomicTextFile file(out);  // fails now, not after the measurements, if out is unwritable
  const double array_bytes = size_mb > 0 ? size_mb * 1024 * 1024 : 1024.0 * 1024 * 1024;
  Runtime rt(co);
  const double load_start = load_average();
  nlohmann::json r;
  with_backend(co.backend, [&](auto exec) {
    r = measure(exec, 1, array_bytes, reps, clock);
    return 0;
  });
  const double load_end = load_average();
  const device_blas::DeviceInfo dev = device_blas::device_info();
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string when = utc_now();
  const std::string how = fmt::format("measured by `{}` on {} ({}) at {} ({} clock)",
                                      command_line(argc, argv), dev.name, host, when, clock_name);
  const double bw =
      std::max({r["copy_bandwidth"].get<double>(), r["runtime_copy_bandwidth"].get<double>(),
                r["read_bandwidth"].get<double>()});
  nlohmann::json j;
  j["format"] = "sparsim-hardware";
  j["version"] = 1;
  j["name"] = name;
  j["description"] = fmt::format("{}, {} SMs (cuda backend; measured)", dev.name, dev.sm_count);
  j["kind"] = "measured";
  j["peak_flops"] = {{"fp32", r["sgemm_flops"]}};
  if (r.contains("bf16_gemm_flops")) j["peak_flops"]["bf16"] = r["bf16_gemm_flops"];
  j["memory_bandwidth"] = bw;
  if (dev.memory_bytes > 0) j["memory_bytes"] = dev.memory_bytes;
  j["l2_bytes"] = dev.l2_bytes > 0 ? dev.l2_bytes : 1.0;
  j["launch_overhead_s"] = r["launch_overhead_s"];
  j["sources"] = {
      {"peak_flops.fp32",
       fmt::format("{}: sparsim's linear() on 2048 rows x W[4096][4096] fp32 (cuBLAS), median "
                   "of {}",
                   how, reps)},
      {"memory_bandwidth",
       fmt::format("{}: the fastest of a copy kernel of 16-byte words, the runtime's device "
                   "copy (both counting bytes read and written) and a streaming sum, over arrays "
                   "of {:.0f} MiB, median of {}",
                   how, array_bytes / (1024 * 1024), reps)},
      {"l2_bytes", fmt::format("{}: cudaDeviceProp::l2CacheSize", how)},
      {"launch_overhead_s",
       fmt::format("{}: time per launch of 200 empty kernels issued back to back (one fence "
                   "at the end), median of {} batches; with a fence after every launch: {:.2f} us",
                   how, 5 * reps, r["launch_overhead_sync_s"].get<double>() * 1e6)}};
  if (r.contains("bf16_gemm_flops"))
    j["sources"]["peak_flops.bf16"] = fmt::format(
        "{}: sparsim's linear() with --bf16-compute on 2048 rows x W[4096][4096] bf16 (rows "
        "rounded to bf16, cuBLAS tensor cores, fp32 accumulation), median of {}",
        how, reps);
  if (dev.memory_bytes > 0)
    j["sources"]["memory_bytes"] = fmt::format("{}: cudaDeviceProp::totalGlobalMem", how);
  j["measured"] = r;
  j["probe"] = {{"command", command_line(argc, argv)},
                {"date_utc", when},
                {"host", host},
                {"device", dev.name},
                {"sm_count", dev.sm_count},
                {"backend", "cuda"},
                {"load_average_start", load_start},
                {"load_average_end", load_end},
                {"array_bytes", array_bytes},
                {"reps", reps},
                {"clock", clock_name}};
  cost::parse_hardware_profile(j.dump(), out);
  file << io::json_file_text(j);
  file.commit();
  std::cout << fmt::format(
      "wrote {}: {}: fp32 GEMM {:.1f} TFLOP/s, bf16 GEMM {:.1f} TFLOP/s, bandwidth {:.0f} GB/s "
      "(decode GEMV {:.0f} GB/s), {:.2f} us a launch in a stream ({:.2f} us with a fence)\n",
      out, dev.name, r["sgemm_flops"].get<double>() / 1e12, r.value("bf16_gemm_flops", 0.0) / 1e12,
      bw / 1e9, r["gemv_bandwidth"].get<double>() / 1e9, r["launch_overhead_s"].get<double>() * 1e6,
      r["launch_overhead_sync_s"].get<double>() * 1e6);
  return 0;
}

}  // namespace

int cmd_probe(int argc, char** argv) {
  CommonOptions co;
  std::string out, threads_s, name = "local", clock_name = "wall";
  int reps = 7;
  double size_mb = 0;
  bool single = false;
  po::options_description d("sparsim probe options");
  d.add_options()("out,o", po::value(&out), "hardware profile to write (JSON)")(
      "thread-counts", po::value(&threads_s),
      "thread counts to measure, comma separated (default: 1, 2, 4, … up to all cores, and all "
      "cores)")("reps", po::value(&reps)->default_value(7),
                "repetitions of each measurement (medians are kept; one more warms up)")(
      "size-mb", po::value(&size_mb)->default_value(0),
      "bytes of each streaming array and of the GEMV weights in MiB (0: 4 x the last-level "
      "cache, within 256 ... 1024)")("name", po::value(&name)->default_value("local"),
                                     "profile name written into the file")(
      "clock", po::value(&clock_name)->default_value("wall"),
      "what the timings measure: wall (elapsed time) or cpu (the process's CPU time; with one "
      "thread, the work's own time on a machine shared with other jobs)")(
      "single", po::bool_switch(&single),
      "measure at --threads only and print that row as JSON (what each child process does)");
  add_common_options(d, co);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: sparsim probe --out PROFILE.json [--thread-counts 1,2] [--reps 7]\n\n"
             "Measures this machine for sparsim predict: copy and read bandwidth, the GEMM rate "
             "of sparsim's prefill kernel, the bandwidth of its decode GEMV and the cost of a "
             "kernel launch, at each thread count. The profile's headline roofs are those at "
             "the largest count; predict takes the row of the run's thread count.",
             d, vm))
    return 0;
  require(clock_name == "wall" || clock_name == "cpu", "--clock must be wall or cpu, got '{}'",
          clock_name);
  const Clock clock = clock_name == "cpu" ? Clock::ProcessCpu : Clock::Wall;
  require(reps >= 1 && reps <= 1000, "--reps must be between 1 and 1000, got {}", reps);
  require(size_mb >= 0 && size_mb <= 65536, "--size-mb must be between 0 and 65536, got {}",
          size_mb);
  const auto [llc, llc_where] = kernels::last_level_cache();
  // 4 x the last-level cache, within [256 MiB, 1 GiB]: virtual machines may report the host's
  // whole (shared) cache
  const double array_bytes =
      size_mb > 0 ? size_mb * 1024 * 1024 : static_cast<double>(kernels::host_stream_bytes());
  if (single) {
    Runtime rt(co);
    return with_backend(co.backend, [&](auto exec) {
      std::cout << measure(exec, rt.threads(), array_bytes, reps, clock).dump() << "\n";
      return 0;
    });
  }
  require(!out.empty(), "--out is required: the profile file to write");
  if (resolve_backend(co.backend) == "cuda")
    return probe_device(co, out, name, reps, size_mb, clock, clock_name, argc, argv);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> counts;
  if (threads_s.empty()) {
    for (int t = 1; t < cores; t *= 2) counts.push_back(t);
    counts.push_back(cores);
  } else {
    counts = parse_int_list(threads_s, "--thread-counts");
    for (int t : counts) require(t >= 1 && t <= 4096, "--thread-counts: {} is out of range", t);
  }
  io::AtomicTextFile file(out);  // fails now, not after the measurements, if out is unwritable
  const double load_start = load_average();
  const std::string exe = self_exe();
  const std::string backend = co.backend.empty() ? "default" : co.backend;
  nlohmann::json rows = nlohmann::json::array();
  for (int t : counts) {
    const std::string cmd = fmt::format(
        "'{}' probe --single --threads {} --reps {} --size-mb {} --backend {} --clock {} "
        "--log-level error",
        exe, t, reps, array_bytes / (1024 * 1024), backend, clock_name);
    std::cerr << fmt::format("probe: {} thread{} ...\n", t, t == 1 ? "" : "s");
    const nlohmann::json r = nlohmann::json::parse(run_child(cmd));
    std::cerr << fmt::format(
        "  copy {:.2f} GB/s, read {:.2f} GB/s, GEMM {:.2f} GFLOP/s, GEMV {:.2f} GB/s, launch "
        "{:.2f} us\n",
        r["copy_bandwidth"].get<double>() / 1e9, r["read_bandwidth"].get<double>() / 1e9,
        r["sgemm_flops"].get<double>() / 1e9, r["gemv_bandwidth"].get<double>() / 1e9,
        r["launch_overhead_s"].get<double>() * 1e6);
    rows.push_back(r);
  }
  const double load_end = load_average();
  // Headline roofs: the row of the largest thread count.
  std::size_t top = 0;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i]["threads"].get<int>() > rows[top]["threads"].get<int>()) top = i;
  const nlohmann::json& t = rows[top];
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string when = utc_now();
  const std::string how =
      fmt::format("measured by `{}` on {} at {} ({} clock; load average {:.2f} → {:.2f})",
                  command_line(argc, argv), host, when, clock_name, load_start, load_end);
  const std::string resolved = resolve_backend(co.backend);
  nlohmann::json j;
  j["format"] = "sparsim-hardware";
  j["version"] = 1;
  j["name"] = name;
  j["description"] =
      fmt::format("{}, {} cores ({} backend; measured)", cpu_model(), cores, resolved);
  j["kind"] = "measured";
  j["peak_flops"] = {{"fp32", t["sgemm_flops"]}};
  j["memory_bandwidth"] =
      std::max(t["copy_bandwidth"].get<double>(), t["read_bandwidth"].get<double>());
  j["l2_bytes"] = llc > 0 ? llc : 1.0;
  j["launch_overhead_s"] = t["launch_overhead_s"];
  j["sources"] = {
      {"peak_flops.fp32",
       fmt::format("{}: sparsim's linear() on 512 rows x W[2048][576 or 2048] (prefill GEMM, "
                   "OpenBLAS tiles), the faster shape, median of {}, at {} threads",
                   how, reps, t["threads"].get<int>())},
      {"memory_bandwidth",
       fmt::format("{}: the faster of STREAM copy (bytes read + written) and a streaming sum, "
                   "over arrays of {:.0f} MiB, median of {}, at {} threads",
                   how, array_bytes / (1024 * 1024), reps, t["threads"].get<int>())},
      {"l2_bytes", llc > 0 ? fmt::format("the last-level cache from sysfs: {}", llc_where)
                           : std::string("unknown (sysfs lists no cache); 1 byte recorded")},
      {"launch_overhead_s",
       fmt::format("{}: an empty parallel_for and a fence, median of batches of 200, at {} "
                   "threads",
                   how, t["threads"].get<int>())}};
  j["threads"] = rows;
  j["probe"] = {{"command", command_line(argc, argv)},
                {"date_utc", when},
                {"host", host},
                {"cpu", cpu_model()},
                {"host_kernels", {{"gemv_isa", host::gemv_isa()}, {"blas_core", blas_core_name()}}},
                {"cores", cores},
                {"backend", resolved},
                {"load_average_start", load_start},
                {"load_average_end", load_end},
                {"array_bytes", array_bytes},
                {"reps", reps},
                {"clock", clock_name}};
  // What predict will read back must be a valid profile.
  cost::parse_hardware_profile(j.dump(), out);
  file << io::json_file_text(j);
  file.commit();
  std::cout << fmt::format(
      "wrote {}: {} at {} threads: {:.2f} GFLOP/s, {:.2f} GB/s, launch {:.2f} us\n", out, name,
      t["threads"].get<int>(), t["sgemm_flops"].get<double>() / 1e9,
      j["memory_bandwidth"].get<double>() / 1e9, t["launch_overhead_s"].get<double>() * 1e6);
  return 0;
}

}  // namespace sparsim::app
