#include "model/safetensors.hpp"

#include "core/error.hpp"
#include "core/interrupt.hpp"
#include "io/temp_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

namespace sparsim::safetensors {

using json = nlohmann::json;

namespace {

struct DtypeDesc {
  Dtype t;
  const char* name;
  std::size_t size;
};
constexpr DtypeDesc kDtypes[] = {
    {Dtype::F32, "F32", 4},   {Dtype::F16, "F16", 2},         {Dtype::BF16, "BF16", 2},
    {Dtype::F64, "F64", 8},   {Dtype::I64, "I64", 8},         {Dtype::I32, "I32", 4},
    {Dtype::I16, "I16", 2},   {Dtype::I8, "I8", 1},           {Dtype::U64, "U64", 8},
    {Dtype::U32, "U32", 4},   {Dtype::U16, "U16", 2},         {Dtype::U8, "U8", 1},
    {Dtype::BOOL, "BOOL", 1}, {Dtype::F8_E4M3, "F8_E4M3", 1}, {Dtype::F8_E5M2, "F8_E5M2", 1},
};

const DtypeDesc& desc(Dtype t) {
  for (const auto& d : kDtypes)
    if (d.t == t) return d;
  fail("safetensors: invalid dtype id {}", static_cast<int>(t));
}

/// Multiplies with an overflow check; false on overflow.
bool mul_ok(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  out = a * b;
  return true;
}

std::string json_kind(const json& j) {
  return j.type_name();
}

/// Parses JSON text, rejecting duplicate keys in any object (nlohmann would keep the last).
json parse_strict(const std::string& text, const std::string& what) {
  std::vector<std::set<std::string>> keys;
  std::string dup;
  int dup_depth = 0;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second && dup.empty()) {
          dup = parsed.get<std::string>();
          dup_depth = depth;
        }
        break;
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, cb);
  } catch (const json::exception& e) {
    // e.what() reads "[json.exception.parse_error.101] parse error at line 1, column 10: ..."
    std::string m = e.what();
    if (auto p = m.find("] "); p != std::string::npos) m = m.substr(p + 2);
    fail("{}: malformed JSON: {}", what, m);
  }
  if (!dup.empty()) {
    if (dup_depth <= 1) fail("{}: duplicate entry '{}'", what, dup);
    fail("{}: duplicate key '{}' inside an entry", what, dup);
  }
  return j;
}

std::uint64_t as_u64(const json& v, const std::string& what) {
  require(v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0),
          "{} must be a non-negative integer, got {}", what, v.dump());
  return v.get<std::uint64_t>();
}

}  // namespace

std::string to_string(Dtype t) {
  return desc(t).name;
}

Dtype parse_dtype(std::string_view s) {
  for (const auto& d : kDtypes)
    if (s == d.name) return d.t;
  fail("unknown dtype '{}'", s);
}

std::size_t dtype_size(Dtype t) {
  return desc(t).size;
}

bool is_loadable(Dtype t) {
  return t == Dtype::F32 || t == Dtype::F16 || t == Dtype::BF16;
}

gguf::GGMLType to_ggml(Dtype t) {
  switch (t) {
    case Dtype::F32:
      return gguf::GGMLType::F32;
    case Dtype::F16:
      return gguf::GGMLType::F16;
    case Dtype::BF16:
      return gguf::GGMLType::BF16;
    default:
      break;
  }
  fail("dtype {} cannot be converted to fp32 (supported: F32, F16, BF16)", to_string(t));
}

std::uint64_t TensorInfo::n_elements() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// ---------------------------------------------------------------------------------------------
// File

File File::open(const std::string& path) {
  File f;
  f.path_ = path;
  f.map_ =
      MappedFile::open(path, "safetensors file", 8, "to hold the 8-byte safetensors header length");
  f.size_ = f.map_.size();
  const auto* base = f.map_.data();

  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
  require(n <= f.size_ - 8,
          "{}: header length {} (first 8 bytes) runs past the end of the file ({} bytes): "
          "truncated, or not a safetensors file",
          path, n, f.size_);
  require(n <= kMaxHeaderBytes, "{}: header length {} exceeds the limit of {} bytes", path, n,
          kMaxHeaderBytes);
  require(n >= 2 && base[8] == '{',
          "{}: the header (byte 8) does not start with '{{': not a safetensors file", path);
  f.header_len_ = n;
  const std::string header(reinterpret_cast<const char*>(base + 8), n);
  const json j = parse_strict(header, path + ": header");
  require(j.is_object(), "{}: header is a JSON {}, expected an object", path, json_kind(j));

  const std::uint64_t data_size = f.size_ - f.data_offset();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      require(v.is_object(), "{}: '__metadata__' is a JSON {}, expected an object of strings", path,
              json_kind(v));
      for (auto m2 = v.begin(); m2 != v.end(); ++m2) {
        require(m2.value().is_string(), "{}: '__metadata__' entry '{}' is not a string", path,
                m2.key());
        f.metadata_[m2.key()] = m2.value().get<std::string>();
      }
      continue;
    }
    const std::string ctx = fmt::format("{}: tensor '{}'", path, name);
    require(v.is_object(), "{}: entry is a JSON {}, expected an object", ctx, json_kind(v));
    for (const char* k : {"dtype", "shape", "data_offsets"})
      require(v.contains(k), "{}: missing '{}'", ctx, k);
    for (auto k2 = v.begin(); k2 != v.end(); ++k2)
      require(k2.key() == "dtype" || k2.key() == "shape" || k2.key() == "data_offsets",
              "{}: unexpected key '{}'", ctx, k2.key());
    TensorInfo t;
    t.name = name;
    require(v["dtype"].is_string(), "{}: 'dtype' must be a string, got {}", ctx, v["dtype"].dump());
    const std::string ds = v["dtype"].get<std::string>();
    bool known = false;
    for (const auto& d : kDtypes)
      if (ds == d.name) {
        t.dtype = d.t;
        known = true;
      }
    require(known,
            "{}: unknown dtype '{}' (known: F32, F16, BF16, F64, I64, I32, I16, I8, U64, "
            "U32, U16, U8, BOOL, F8_E4M3, F8_E5M2)",
            ctx, ds);
    require(v["shape"].is_array(), "{}: 'shape' must be an array, got {}", ctx, v["shape"].dump());
    std::uint64_t count = 1;
    for (const auto& d : v["shape"]) {
      t.shape.push_back(as_u64(d, ctx + ": a 'shape' entry"));
      require(mul_ok(count, t.shape.back(), count), "{}: shape {} overflows", ctx,
              v["shape"].dump());
    }
    const json& off = v["data_offsets"];
    require(off.is_array() && off.size() == 2, "{}: 'data_offsets' must be [begin, end], got {}",
            ctx, off.dump());
    t.begin = as_u64(off[0], ctx + ": 'data_offsets' begin");
    t.end = as_u64(off[1], ctx + ": 'data_offsets' end");
    require(t.begin <= t.end, "{}: data_offsets [{}, {}] end before they begin", ctx, t.begin,
            t.end);
    require(t.end <= data_size,
            "{}: data_offsets [{}, {}] run past the end of the data section ({} bytes; file "
            "truncated?)",
            ctx, t.begin, t.end, data_size);
    std::uint64_t want = 0;
    require(mul_ok(count, dtype_size(t.dtype), want), "{}: shape {} overflows", ctx,
            v["shape"].dump());
    require(t.end - t.begin == want,
            "{}: data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {}", ctx, t.begin,
            t.end, t.end - t.begin, t.shape_string(), ds, want);
    t.data = base + f.data_offset() + t.begin;
    f.tensors_.push_back(std::move(t));
  }
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (std::size_t i = 1; i < f.tensors_.size(); ++i) {
    const TensorInfo &a = f.tensors_[i - 1], &b = f.tensors_[i];
    require(b.begin >= a.end || a.begin == a.end || b.begin == b.end,
            "{}: tensors '{}' (bytes {}..{}) and '{}' (bytes {}..{}) overlap", path, a.name,
            a.begin, a.end, b.name, b.begin, b.end);
  }
  for (std::size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

File::File(File&& o) noexcept = default;
File& File::operator=(File&& o) noexcept = default;
File::~File() = default;

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void File::release(const TensorInfo& t) const {
  map_.release(t.data, t.nbytes(), "tensor '" + t.name + "'");
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

Checkpoint Checkpoint::open_file(const std::string& path) {
  Checkpoint c;
  c.path_ = path;
  c.files_.push_back(std::make_unique<File>(File::open(path)));
  const File* f = c.files_.back().get();
  for (const auto& t : f->tensors()) c.entries_[t.name] = Entry{f, &t};
  return c;
}

Checkpoint Checkpoint::open_index(const std::string& index_path) {
  namespace fs = std::filesystem;
  Checkpoint c;
  c.path_ = index_path;
  std::ifstream in(index_path, std::ios::binary);
  require(static_cast<bool>(in), "{}: cannot open the checkpoint index: {}", index_path,
          std::strerror(errno));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json j = parse_strict(text, index_path);
  require(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
          "{}: expected an object with a 'weight_map' object (tensor name → shard file)",
          index_path);
  const fs::path dir = fs::path(index_path).parent_path();
  std::map<std::string, const File*> shards;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    require(it.value().is_string(), "{}: weight_map entry '{}' is not a file name", index_path,
            it.key());
    const std::string shard = it.value().get<std::string>();
    require(!shard.empty() && shard.find('/') == std::string::npos &&
                shard.find('\\') == std::string::npos && shard != "." && shard != "..",
            "{}: weight_map entry '{}' names '{}', which is not a plain file name in the index's "
            "directory",
            index_path, it.key(), shard);
    auto sit = shards.find(shard);
    if (sit == shards.end()) {
      const std::string p = (dir / shard).string();
      require(fs::exists(p), "{}: shard '{}' (holding tensor '{}') does not exist", index_path, p,
              it.key());
      c.files_.push_back(std::make_unique<File>(File::open(p)));
      sit = shards.emplace(shard, c.files_.back().get()).first;
    }
    const TensorInfo* t = sit->second->find_tensor(it.key());
    require(t != nullptr, "{}: tensor '{}' is mapped to shard '{}', which does not hold it",
            index_path, it.key(), sit->second->path());
    c.entries_[it.key()] = Entry{sit->second, t};
  }
  // Tensors a shard holds beyond the weight map are still reachable, unless ambiguous.
  for (const auto& f : c.files_)
    for (const auto& t : f->tensors()) {
      auto e = c.entries_.find(t.name);
      if (e == c.entries_.end()) {
        c.entries_[t.name] = Entry{f.get(), &t};
      } else {
        require(e->second.file == f.get() || j["weight_map"].contains(t.name),
                "{}: tensor '{}' is held by both '{}' and '{}'", index_path, t.name,
                e->second.file->path(), f->path());
      }
    }
  return c;
}

Checkpoint::Entry Checkpoint::find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? Entry{nullptr, nullptr} : it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> v;
  for (const auto& [k, e] : entries_) v.push_back(k);
  return v;
}

std::uint64_t Checkpoint::total_bytes() const {
  std::uint64_t n = 0;
  for (const auto& f : files_) n += f->file_size();
  return n;
}

// ---------------------------------------------------------------------------------------------
// Writing

std::vector<std::uint8_t> encode(Dtype t, const float* src, std::size_t n) {
  std::vector<std::uint8_t> out(n * dtype_size(t));
  gguf::quantize(to_ggml(t), src, out.data(), n);
  return out;
}

void write_file(const std::string& path, const std::vector<WriteTensor>& tensors,
                const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::uint64_t off = 0;
  for (const auto& t : tensors) {
    require(t.name != "__metadata__" && !h.contains(t.name),
            "{}: cannot write tensor '{}' twice (or under a reserved name)", path, t.name);
    std::uint64_t n = dtype_size(t.dtype);
    for (auto d : t.shape) n *= d;
    require(n == t.bytes.size(), "{}: tensor '{}' has {} bytes, shape {} of {} needs {}", path,
            t.name, t.bytes.size(), fmt::join(t.shape, "x"), to_string(t.dtype), n);
    h[t.name] = {
        {"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  io::TempFile tmp(path);
  {
    std::ofstream out(tmp.path(), std::ios::binary | std::ios::trunc);
    require(static_cast<bool>(out), "{}: cannot create: {}", tmp.path(), std::strerror(errno));
    std::uint8_t len[8];
    std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const auto& t : tensors) {
      interruption_point("write");  // SIGINT / SIGTERM: the temporary is removed on unwinding
      out.write(reinterpret_cast<const char*>(t.bytes.data()),
                static_cast<std::streamsize>(t.bytes.size()));
    }
    out.close();
    require(static_cast<bool>(out), "{}: write failed", tmp.path());
  }
  tmp.commit();
}

}  // namespace sparsim::safetensors
