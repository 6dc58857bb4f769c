#include "recovery/checkpoint.hpp"

#include "core/error.hpp"
#include "io/hdf5.hpp"
#include "io/run_file.hpp"
#include "recovery/hash.hpp"

#include <fmt/format.h>

#include <cstring>

namespace sparsim::recovery {

namespace {

constexpr const char* kFormat = "sparsim recover checkpoint";
constexpr std::int64_t kVersion = 1;

/// The curve's fields, in file order, with their member.
struct Field {
  const char* name;
  double StepRecord::*member;
  const char* units;
};
constexpr Field kFields[] = {
    {"loss", &StepRecord::loss, "nat"},
    {"ce", &StepRecord::ce, "nat"},
    {"kl", &StepRecord::kl, "nat"},
    {"lr", &StepRecord::lr, "1"},
    {"grad_norm", &StepRecord::grad_norm, "1"},
    {"seconds", &StepRecord::seconds, "s"},
    {"teacher_seconds", &StepRecord::teacher_seconds, "s"},
    {"forward_seconds", &StepRecord::forward_seconds, "s"},
    {"backward_seconds", &StepRecord::backward_seconds, "s"},
    {"update_seconds", &StepRecord::update_seconds, "s"},
};

class Checksum {
 public:
  void add(std::uint64_t x) { h_ = mix64(h_ ^ mix64(x + ++n_)); }
  void add(double d) {
    std::uint64_t x;
    std::memcpy(&x, &d, sizeof x);
    add(x);
  }
  void add(const std::vector<double>& v) {
    add(static_cast<std::uint64_t>(v.size()));
    for (double d : v) add(d);
  }
  void add(const std::string& s) {
    add(static_cast<std::uint64_t>(s.size()));
    for (unsigned char c : s) add(static_cast<std::uint64_t>(c));
  }
  std::string hex() const { return fmt::format("{:016x}", h_); }

 private:
  std::uint64_t h_ = 0x5350415253494dull, n_ = 0;
};

std::string checksum(const Checkpoint& c) {
  Checksum h;
  h.add(c.settings);
  const RecoveryState& s = c.state;
  h.add(static_cast<std::uint64_t>(s.step));
  for (const Adapter& a : s.adapters) {
    for (int x : {a.layer, static_cast<int>(a.proj), a.rank, a.in, a.out})
      h.add(static_cast<std::uint64_t>(x));
    h.add(a.a);
    h.add(a.b);
  }
  h.add(s.m);
  h.add(s.v);
  for (const StepRecord& r : s.curve) {
    h.add(static_cast<std::uint64_t>(r.step));
    for (const Field& f : kFields) h.add(r.*f.member);
  }
  return h.hex();
}

}  // namespace

void write_checkpoint(const std::string& path, const Checkpoint& c) {
  const RecoveryState& s = c.state;
  io::RunFile rf(path);
  io::Group root = rf.root();
  root.set_attr("format", kFormat);
  root.set_attr("version", kVersion);
  root.set_attr("settings", c.settings);
  root.set_attr("step", static_cast<std::int64_t>(s.step));
  root.set_attr("sparsim_version", SPARSIM_VERSION);
  root.set_attr("checksum", checksum(c));
  io::Group ag = root.create_group("adapters");
  std::vector<std::string> order;
  for (const Adapter& a : s.adapters) {
    io::Group g = ag.create_group(a.name());
    g.set_attr("layer", static_cast<std::int64_t>(a.layer));
    g.set_attr("proj", std::string(target_name(a.proj)));
    g.write<double>("A", a.a.data(), {static_cast<hsize_t>(a.rank), static_cast<hsize_t>(a.in)},
                    {"1", "LoRA down-projection A [rank][in]"});
    g.write<double>("B", a.b.data(), {static_cast<hsize_t>(a.out), static_cast<hsize_t>(a.rank)},
                    {"1", "LoRA up-projection B [out][rank]"});
    order.push_back(a.name());
  }
  ag.write_strings("order", order, {"", "adapter order of the flat optimizer vectors"});
  io::Group og = root.create_group("optimizer");
  og.write<double>("m", s.m, {"1", "AdamW first moment"});
  og.write<double>("v", s.v, {"1", "AdamW second moment"});
  io::Group cg = root.create_group("curve");
  std::vector<std::int64_t> steps;
  for (const StepRecord& r : s.curve) steps.push_back(r.step);
  cg.write<std::int64_t>("step", steps, {"1", "step number"});
  for (const Field& f : kFields) {
    std::vector<double> v;
    for (const StepRecord& r : s.curve) v.push_back(r.*f.member);
    cg.write<double>(f.name, v, {f.units, ""});
  }
  rf.commit();
}

Checkpoint read_checkpoint(const std::string& path) {
  Checkpoint c;
  try {
    io::H5File f = io::H5File::open_read(path);
    io::Group root = f.root();
    require(root.has_attr("format") && root.get_attr<std::string>("format") == kFormat,
            "not a recovery checkpoint");
    require(root.get_attr<std::int64_t>("version") == kVersion,
            "format version {}, this sparsim reads {}", root.get_attr<std::int64_t>("version"),
            kVersion);
    c.settings = root.get_attr<std::string>("settings");
    RecoveryState& s = c.state;
    s.step = static_cast<int>(root.get_attr<std::int64_t>("step"));
    io::Group ag = root.open_group("adapters");
    for (const std::string& name : ag.read_strings("order")) {
      io::Group g = ag.open_group(name);
      Adapter a;
      a.layer = static_cast<int>(g.get_attr<std::int64_t>("layer"));
      a.proj = parse_targets(g.get_attr<std::string>("proj")).at(0);
      std::vector<hsize_t> da, db;
      a.a = g.read<double>("A", &da);
      a.b = g.read<double>("B", &db);
      require(da.size() == 2 && db.size() == 2 && da[0] == db[1],
              "adapter {}: A and B have inconsistent shapes", name);
      a.rank = static_cast<int>(da[0]);
      a.in = static_cast<int>(da[1]);
      a.out = static_cast<int>(db[0]);
      require(a.name() == name, "adapter group '{}' records layer {} projection {}", name, a.layer,
              target_name(a.proj));
      s.adapters.push_back(std::move(a));
    }
    io::Group og = root.open_group("optimizer");
    s.m = og.read<double>("m");
    s.v = og.read<double>("v");
    io::Group cg = root.open_group("curve");
    const std::vector<std::int64_t> steps = cg.read<std::int64_t>("step");
    s.curve.resize(steps.size());
    for (std::size_t i = 0; i < steps.size(); ++i) s.curve[i].step = static_cast<int>(steps[i]);
    for (const Field& fd : kFields) {
      const std::vector<double> v = cg.read<double>(fd.name);
      require(v.size() == steps.size(), "curve '{}' has {} entries, 'step' {}", fd.name, v.size(),
              steps.size());
      for (std::size_t i = 0; i < v.size(); ++i) s.curve[i].*fd.member = v[i];
    }
    require(root.get_attr<std::string>("checksum") == checksum(c),
            "the checksum does not match the contents (the file is damaged)");
  } catch (const Error& e) {
    fail("recovery checkpoint '{}' cannot be used: {}", path, e.what());
  }
  return c;
}

}  // namespace sparsim::recovery
