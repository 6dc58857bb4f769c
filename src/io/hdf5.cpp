#include "io/hdf5.hpp"

#include "core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace sparsim::io {

// ---------------------------------------------------------------------------------------------
// Errors

void silence_hdf5_errors() {
  // With a thread-safe HDF5 build the error stack (and its auto-print setting) is per thread.
  thread_local bool done = false;
  if (!done) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    done = true;
  }
}

namespace {

herr_t innermost_cb(unsigned n, const H5E_error2_t* e, void* data) {
  if (n == 0 && e != nullptr && e->desc != nullptr) *static_cast<std::string*>(data) = e->desc;
  return 0;
}

}  // namespace

std::string hdf5_error_detail() {
  std::string s;
  // Walking upward starts at the most specific entry. H5E calls leave the stack intact.
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_cb, &s);
  return s;
}

namespace {

/// Throws sparsim::Error with `what`, followed by HDF5's innermost message if there is one.
/// Must be called before any other HDF5 call, which would clear the error stack.
[[noreturn]] void h5fail(const std::string& what) {
  const std::string detail = hdf5_error_detail();
  H5Eclear2(H5E_DEFAULT);
  if (detail.empty()) throw Error(what);
  throw Error(fmt::format("{} (HDF5: {})", what, detail));
}

/// Returns `id` wrapped in a Handle, or throws with the message built by `what()`.
template <class F>
Handle own(hid_t id, Handle::Kind kind, F&& what) {
  if (id < 0) h5fail(what());
  return Handle(id, kind);
}

template <class F>
void check(herr_t status, F&& what) {
  if (status < 0) h5fail(what());
}

std::string quote_where(const std::string& path, const std::string& file) {
  return fmt::format("'{}' in file '{}'", path, file);
}

// ---------------------------------------------------------------------------------------------
// Element types

template <class T>
struct TypeInfo;
template <>
struct TypeInfo<float> {
  static hid_t mem() { return H5T_NATIVE_FLOAT; }
  static hid_t file() { return H5T_IEEE_F32LE; }
  static constexpr H5T_class_t cls = H5T_FLOAT;
  static constexpr bool is_signed = true;
  static constexpr const char* name = "float32";
};
template <>
struct TypeInfo<double> {
  static hid_t mem() { return H5T_NATIVE_DOUBLE; }
  static hid_t file() { return H5T_IEEE_F64LE; }
  static constexpr H5T_class_t cls = H5T_FLOAT;
  static constexpr bool is_signed = true;
  static constexpr const char* name = "float64";
};
template <>
struct TypeInfo<std::int32_t> {
  static hid_t mem() { return H5T_NATIVE_INT32; }
  static hid_t file() { return H5T_STD_I32LE; }
  static constexpr H5T_class_t cls = H5T_INTEGER;
  static constexpr bool is_signed = true;
  static constexpr const char* name = "int32";
};
template <>
struct TypeInfo<std::int64_t> {
  static hid_t mem() { return H5T_NATIVE_INT64; }
  static hid_t file() { return H5T_STD_I64LE; }
  static constexpr H5T_class_t cls = H5T_INTEGER;
  static constexpr bool is_signed = true;
  static constexpr const char* name = "int64";
};
template <>
struct TypeInfo<std::uint8_t> {
  static hid_t mem() { return H5T_NATIVE_UINT8; }
  static hid_t file() { return H5T_STD_U8LE; }
  static constexpr H5T_class_t cls = H5T_INTEGER;
  static constexpr bool is_signed = false;
  static constexpr const char* name = "uint8";
};
template <>
struct TypeInfo<std::uint64_t> {
  static hid_t mem() { return H5T_NATIVE_UINT64; }
  static hid_t file() { return H5T_STD_U64LE; }
  static constexpr H5T_class_t cls = H5T_INTEGER;
  static constexpr bool is_signed = false;
  static constexpr const char* name = "uint64";
};

/// The element type of a stored dataset or attribute, in the words used by error messages.
std::string describe_type(hid_t t) {
  const H5T_class_t c = H5Tget_class(t);
  const std::size_t bits = H5Tget_size(t) * 8;
  switch (c) {
    case H5T_INTEGER:
      return fmt::format("{}{}", H5Tget_sign(t) == H5T_SGN_NONE ? "uint" : "int", bits);
    case H5T_FLOAT:
      return fmt::format("float{}", bits);
    case H5T_STRING:
      return H5Tis_variable_str(t) > 0 ? "string" : "fixed-length string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "variable-length sequence";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_REFERENCE:
      return "reference";
    case H5T_BITFIELD:
      return "bitfield";
    case H5T_TIME:
      return "time";
    default:
      return "unknown type";
  }
}

template <class T>
bool type_matches(hid_t t) {
  if (H5Tget_class(t) != TypeInfo<T>::cls) return false;
  if (H5Tget_size(t) != sizeof(T)) return false;
  if (TypeInfo<T>::cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(t) != H5T_SGN_NONE;
    if (is_signed != TypeInfo<T>::is_signed) return false;
  }
  return true;
}

/// Variable-length UTF-8 string type.
Handle vlen_utf8_type() {
  Handle t =
      own(H5Tcopy(H5T_C_S1), Handle::Kind::Datatype, [] { return "cannot copy string type"; });
  check(H5Tset_size(t.id(), H5T_VARIABLE),
        [] { return "cannot make string type variable-length"; });
  check(H5Tset_cset(t.id(), H5T_CSET_UTF8), [] { return "cannot set UTF-8 on string type"; });
  return t;
}

Handle scalar_space() {
  return own(H5Screate(H5S_SCALAR), Handle::Kind::Dataspace,
             [] { return "cannot create scalar dataspace"; });
}

Handle simple_space(const std::vector<hsize_t>& dims) {
  if (dims.empty()) return scalar_space();
  return own(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
             Handle::Kind::Dataspace,
             [&] { return fmt::format("cannot create a dataspace of rank {}", dims.size()); });
}

hsize_t element_count(const std::vector<hsize_t>& dims) {
  hsize_t n = 1;
  for (hsize_t d : dims) n *= d;
  return n;
}

/// Link creation properties that create missing intermediate groups ("a/b/x").
Handle intermediate_lcpl() {
  Handle p = own(H5Pcreate(H5P_LINK_CREATE), Handle::Kind::PropList,
                 [] { return "cannot create link property list"; });
  check(H5Pset_create_intermediate_group(p.id(), 1),
        [] { return "cannot enable intermediate group creation"; });
  return p;
}

/// Dataset creation properties: contiguous for small datasets, chunked with shuffle + deflate
/// for datasets of more than kChunkThreshold elements. Chunks span the trailing dimensions first,
/// so a chunk is a contiguous row-major slab of at most kChunkElements elements.
Handle dataset_dcpl(const std::vector<hsize_t>& dims, bool compressible, const std::string& where) {
  Handle p = own(H5Pcreate(H5P_DATASET_CREATE), Handle::Kind::PropList,
                 [] { return "cannot create dataset property list"; });
  const hsize_t n = element_count(dims);
  if (compressible && !dims.empty() && n > kChunkThreshold) {
    std::vector<hsize_t> chunk(dims.size(), 1);
    hsize_t budget = kChunkElements;
    for (std::size_t i = dims.size(); i-- > 0;) {
      chunk[i] = std::max<hsize_t>(1, std::min<hsize_t>(dims[i], budget));
      budget = std::max<hsize_t>(1, budget / chunk[i]);
    }
    auto what = [&] {
      return fmt::format("cannot set chunking/compression for dataset {}", where);
    };
    check(H5Pset_chunk(p.id(), static_cast<int>(chunk.size()), chunk.data()), what);
    check(H5Pset_shuffle(p.id()), what);
    check(H5Pset_deflate(p.id(), kDeflateLevel), what);
  }
  return p;
}

void write_attrs(Object& o, const Attrs& a) {
  if (!a.units.empty()) o.set_attr("units", a.units);
  if (!a.meaning.empty()) o.set_attr("meaning", a.meaning);
}

/// Reads `n` strings (variable- or fixed-length) from a dataset or attribute of type `ftype`.
std::vector<std::string> read_string_elements(hid_t obj, bool is_attr, hid_t ftype, hid_t space,
                                              std::size_t n, const std::string& where) {
  std::vector<std::string> out;
  out.reserve(n);
  if (n == 0) return out;
  Handle mem = own(H5Tcopy(ftype), Handle::Kind::Datatype,
                   [&] { return fmt::format("cannot copy string type of {}", where); });
  auto what = [&] { return fmt::format("cannot read strings from {}", where); };
  if (H5Tis_variable_str(ftype) > 0) {
    std::vector<char*> ptrs(n, nullptr);
    const herr_t st = is_attr ? H5Aread(obj, mem.id(), ptrs.data())
                              : H5Dread(obj, mem.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data());
    check(st, what);
    for (char* p : ptrs) out.emplace_back(p != nullptr ? p : "");
#if H5_VERSION_GE(1, 12, 0)
    H5Treclaim(mem.id(), space, H5P_DEFAULT, ptrs.data());
#else
    H5Dvlen_reclaim(mem.id(), space, H5P_DEFAULT, ptrs.data());
#endif
  } else {
    const std::size_t size = H5Tget_size(ftype);
    std::vector<char> buf(n * size + 1, '\0');
    const herr_t st = is_attr ? H5Aread(obj, mem.id(), buf.data())
                              : H5Dread(obj, mem.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    check(st, what);
    const bool space_padded = H5Tget_strpad(ftype) == H5T_STR_SPACEPAD;
    for (std::size_t i = 0; i < n; ++i) {
      const char* p = buf.data() + i * size;
      std::size_t len = 0;
      while (len < size && p[len] != '\0') ++len;
      if (space_padded)
        while (len > 0 && p[len - 1] == ' ') --len;
      out.emplace_back(p, len);
    }
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Handle

Handle::Handle(const Handle& o) noexcept : kind_(o.kind_) {
  if (o.valid() && H5Iinc_ref(o.id_) >= 0) id_ = o.id_;
}

Handle& Handle::operator=(const Handle& o) noexcept {
  if (this != &o) {
    Handle copy(o);
    *this = std::move(copy);
  }
  return *this;
}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    close();
    id_ = o.id_;
    kind_ = o.kind_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

bool Handle::valid() const noexcept {
  return id_ >= 0 && H5Iis_valid(id_) > 0;
}

hid_t Handle::release() noexcept {
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  return id;
}

herr_t Handle::close() noexcept {
  if (id_ < 0) return 0;
  const hid_t id = release();
  // The file's "strong" close degree may already have closed it.
  if (H5Iis_valid(id) <= 0) return 0;
  switch (kind_) {
    case Kind::File:
      return H5Fclose(id);
    case Kind::Group:
      return H5Gclose(id);
    case Kind::Dataset:
      return H5Dclose(id);
    case Kind::Dataspace:
      return H5Sclose(id);
    case Kind::Datatype:
      return H5Tclose(id);
    case Kind::PropList:
      return H5Pclose(id);
    case Kind::Attribute:
      return H5Aclose(id);
  }
  return -1;
}

// ---------------------------------------------------------------------------------------------
// Object: attributes

std::string Object::where() const {
  return quote_where(path_, file_);
}

namespace {

/// Deletes attribute `name` if present and creates it anew as a scalar of `ftype`.
Handle recreate_attr(hid_t obj, const std::string& name, hid_t ftype, const std::string& where) {
  silence_hdf5_errors();
  const htri_t exists = H5Aexists(obj, name.c_str());
  if (exists < 0) h5fail(fmt::format("cannot query attribute '{}' on {}", name, where));
  if (exists > 0)
    check(H5Adelete(obj, name.c_str()),
          [&] { return fmt::format("cannot replace attribute '{}' on {}", name, where); });
  Handle space = scalar_space();
  return own(H5Acreate2(obj, name.c_str(), ftype, space.id(), H5P_DEFAULT, H5P_DEFAULT),
             Handle::Kind::Attribute,
             [&] { return fmt::format("cannot create attribute '{}' on {}", name, where); });
}

}  // namespace

void Object::set_attr(const std::string& name, const std::string& value) {
  Handle t = vlen_utf8_type();
  Handle a = recreate_attr(id(), name, t.id(), where());
  const char* p = value.c_str();
  check(H5Awrite(a.id(), t.id(), &p),
        [&] { return fmt::format("cannot write attribute '{}' on {}", name, where()); });
}

void Object::set_attr(const std::string& name, double value) {
  Handle a = recreate_attr(id(), name, H5T_IEEE_F64LE, where());
  check(H5Awrite(a.id(), H5T_NATIVE_DOUBLE, &value),
        [&] { return fmt::format("cannot write attribute '{}' on {}", name, where()); });
}

void Object::set_attr_int(const std::string& name, std::int64_t value) {
  Handle a = recreate_attr(id(), name, H5T_STD_I64LE, where());
  check(H5Awrite(a.id(), H5T_NATIVE_INT64, &value),
        [&] { return fmt::format("cannot write attribute '{}' on {}", name, where()); });
}

bool Object::has_attr(const std::string& name) const {
  silence_hdf5_errors();
  const htri_t r = H5Aexists(id(), name.c_str());
  if (r < 0) h5fail(fmt::format("cannot query attribute '{}' on {}", name, where()));
  return r > 0;
}

namespace {

herr_t collect_attr_name(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

/// Opens scalar attribute `name`, checks its class; returns (attribute, file type).
std::pair<Handle, Handle> open_scalar_attr(hid_t obj, const std::string& name, H5T_class_t want,
                                           const char* want_name, const std::string& where) {
  silence_hdf5_errors();
  const htri_t exists = H5Aexists(obj, name.c_str());
  if (exists < 0) h5fail(fmt::format("cannot query attribute '{}' on {}", name, where));
  if (exists == 0) fail("no attribute '{}' on {}", name, where);
  Handle a = own(H5Aopen(obj, name.c_str(), H5P_DEFAULT), Handle::Kind::Attribute,
                 [&] { return fmt::format("cannot open attribute '{}' on {}", name, where); });
  Handle t = own(H5Aget_type(a.id()), Handle::Kind::Datatype, [&] {
    return fmt::format("cannot get type of attribute '{}' on {}", name, where);
  });
  if (H5Tget_class(t.id()) != want)
    fail("attribute '{}' on {} holds {} but {} was requested", name, where, describe_type(t.id()),
         want_name);
  Handle s = own(H5Aget_space(a.id()), Handle::Kind::Dataspace, [&] {
    return fmt::format("cannot get space of attribute '{}' on {}", name, where);
  });
  const hssize_t n = H5Sget_simple_extent_npoints(s.id());
  if (n != 1) fail("attribute '{}' on {} has {} elements, expected a scalar", name, where, n);
  return {std::move(a), std::move(t)};
}

}  // namespace

template <>
std::string Object::get_attr<std::string>(const std::string& name) const {
  auto [a, t] = open_scalar_attr(id(), name, H5T_STRING, "string", where());
  Handle s = own(H5Aget_space(a.id()), Handle::Kind::Dataspace, [&] {
    return fmt::format("cannot get space of attribute '{}' on {}", name, where());
  });
  return read_string_elements(a.id(), true, t.id(), s.id(), 1,
                              fmt::format("attribute '{}' on {}", name, where()))
      .at(0);
}

template <>
double Object::get_attr<double>(const std::string& name) const {
  auto [a, t] = open_scalar_attr(id(), name, H5T_FLOAT, "float64", where());
  double v = 0;
  check(H5Aread(a.id(), H5T_NATIVE_DOUBLE, &v),
        [&] { return fmt::format("cannot read attribute '{}' on {}", name, where()); });
  return v;
}

template <>
std::int64_t Object::get_attr<std::int64_t>(const std::string& name) const {
  auto [a, t] = open_scalar_attr(id(), name, H5T_INTEGER, "int64", where());
  std::int64_t v = 0;
  check(H5Aread(a.id(), H5T_NATIVE_INT64, &v),
        [&] { return fmt::format("cannot read attribute '{}' on {}", name, where()); });
  return v;
}

std::vector<std::string> Object::attr_names() const {
  silence_hdf5_errors();
  std::vector<std::string> names;
  check(H5Aiterate2(id(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attr_name, &names),
        [&] { return fmt::format("cannot list attributes of {}", where()); });
  std::sort(names.begin(), names.end());
  return names;
}

// ---------------------------------------------------------------------------------------------
// Dataset

std::vector<hsize_t> Dataset::dims() const {
  silence_hdf5_errors();
  Handle s = own(H5Dget_space(id()), Handle::Kind::Dataspace,
                 [&] { return fmt::format("cannot get dataspace of dataset {}", where()); });
  const int rank = H5Sget_simple_extent_ndims(s.id());
  if (rank < 0) h5fail(fmt::format("cannot get rank of dataset {}", where()));
  std::vector<hsize_t> d(static_cast<std::size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(s.id(), d.data(), nullptr) < 0)
    h5fail(fmt::format("cannot get shape of dataset {}", where()));
  return d;
}

std::string Dataset::type_name() const {
  silence_hdf5_errors();
  Handle t = own(H5Dget_type(id()), Handle::Kind::Datatype,
                 [&] { return fmt::format("cannot get type of dataset {}", where()); });
  return describe_type(t.id());
}

bool Dataset::chunked() const {
  silence_hdf5_errors();
  Handle p = own(H5Dget_create_plist(id()), Handle::Kind::PropList, [&] {
    return fmt::format("cannot get creation properties of dataset {}", where());
  });
  return H5Pget_layout(p.id()) == H5D_CHUNKED;
}

// ---------------------------------------------------------------------------------------------
// Group

std::string Group::child_path(const std::string& name) const {
  if (!name.empty() && name.front() == '/') return name;
  if (path_ == "/") return "/" + name;
  return path_ + "/" + name;
}

bool Group::has(const std::string& name) const {
  silence_hdf5_errors();
  if (name.empty() || name == "." || name == "/") return true;
  // H5Lexists fails (rather than answering false) when an intermediate link is missing,
  // so check the path one component at a time.
  std::string prefix = name.front() == '/' ? "/" : "";
  std::size_t pos = 0;
  while (pos <= name.size()) {
    std::size_t next = name.find('/', pos);
    if (next == std::string::npos) next = name.size();
    const std::string part = name.substr(pos, next - pos);
    pos = next + 1;
    if (part.empty() || part == ".") continue;
    if (!prefix.empty() && prefix.back() != '/') prefix += '/';
    prefix += part;
    const htri_t r = H5Lexists(id(), prefix.c_str(), H5P_DEFAULT);
    if (r < 0) h5fail(fmt::format("cannot look up {}", quote_where(child_path(prefix), file_)));
    if (r == 0) return false;
  }
  const htri_t r = H5Oexists_by_name(id(), name.c_str(), H5P_DEFAULT);
  return r > 0;  // a dangling soft link does not count
}

namespace {

/// Opens object `name` below `loc` and reports its identifier type.
std::pair<hid_t, H5I_type_t> open_object(hid_t loc, const std::string& name) {
  const hid_t o = H5Oopen(loc, name.c_str(), H5P_DEFAULT);
  if (o < 0) return {o, H5I_BADID};
  return {o, H5Iget_type(o)};
}

}  // namespace

bool Group::has_group(const std::string& name) const {
  if (!has(name)) return false;
  auto [o, type] = open_object(id(), name);
  if (o >= 0) H5Oclose(o);
  return type == H5I_GROUP;
}

bool Group::has_dataset(const std::string& name) const {
  if (!has(name)) return false;
  auto [o, type] = open_object(id(), name);
  if (o >= 0) H5Oclose(o);
  return type == H5I_DATASET;
}

Group Group::create_group(const std::string& name) {
  silence_hdf5_errors();
  const std::string p = child_path(name);
  require(!name.empty(), "cannot create a group with an empty name in {}", where());
  if (has(name)) fail("cannot create group {}: it already exists", quote_where(p, file_));
  Handle lcpl = intermediate_lcpl();
  Handle g =
      own(H5Gcreate2(id(), name.c_str(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT), Handle::Kind::Group,
          [&] { return fmt::format("cannot create group {}", quote_where(p, file_)); });
  return Group(std::move(g), file_, p);
}

Group Group::open_group(const std::string& name) const {
  silence_hdf5_errors();
  const std::string p = child_path(name);
  if (!has(name)) fail("no group {}", quote_where(p, file_));
  auto [o, type] = open_object(id(), name);
  if (o < 0) h5fail(fmt::format("cannot open group {}", quote_where(p, file_)));
  if (type != H5I_GROUP) {
    H5Oclose(o);
    fail("{} is not a group", quote_where(p, file_));
  }
  return Group(Handle(o, Handle::Kind::Group), file_, p);
}

Group Group::require_group(const std::string& name) {
  return has(name) ? open_group(name) : create_group(name);
}

Dataset Group::dataset(const std::string& name) const {
  silence_hdf5_errors();
  const std::string p = child_path(name);
  if (!has(name)) fail("no dataset {}", quote_where(p, file_));
  auto [o, type] = open_object(id(), name);
  if (o < 0) h5fail(fmt::format("cannot open dataset {}", quote_where(p, file_)));
  if (type != H5I_DATASET) {
    H5Oclose(o);
    fail("{} is not a dataset", quote_where(p, file_));
  }
  return Dataset(Handle(o, Handle::Kind::Dataset), file_, p);
}

std::vector<std::string> Group::list() const {
  silence_hdf5_errors();
  H5G_info_t info{};
  check(H5Gget_info(id(), &info), [&] { return fmt::format("cannot list group {}", where()); });
  std::vector<std::string> names;
  names.reserve(info.nlinks);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len =
        H5Lget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) h5fail(fmt::format("cannot list group {}", where()));
    std::string s(static_cast<std::size_t>(len) + 1, '\0');
    if (H5Lget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, s.data(), s.size(),
                           H5P_DEFAULT) < 0)
      h5fail(fmt::format("cannot list group {}", where()));
    s.resize(static_cast<std::size_t>(len));
    names.push_back(std::move(s));
  }
  std::sort(names.begin(), names.end());
  return names;
}

namespace {

/// Creates dataset `name` below `g` (creating intermediate groups); fails if it exists.
Handle create_dataset(Group& g, const std::string& name, const std::string& p, hid_t ftype,
                      const std::vector<hsize_t>& dims, bool compressible) {
  silence_hdf5_errors();
  const std::string where = quote_where(p, g.file_path());
  require(!name.empty(), "cannot create a dataset with an empty name in group {}",
          quote_where(g.path(), g.file_path()));
  if (g.has(name)) fail("cannot write dataset {}: it already exists", where);
  Handle space = simple_space(dims);
  Handle dcpl = dataset_dcpl(dims, compressible, where);
  Handle lcpl = intermediate_lcpl();
  return own(H5Dcreate2(g.id(), name.c_str(), ftype, space.id(), lcpl.id(), dcpl.id(), H5P_DEFAULT),
             Handle::Kind::Dataset, [&] { return fmt::format("cannot create dataset {}", where); });
}

}  // namespace

template <class T>
void Group::write(const std::string& name, const T* data, const std::vector<hsize_t>& dims,
                  const Attrs& attrs) {
  const std::string p = child_path(name);
  const hsize_t n = element_count(dims);
  require(data != nullptr || n == 0, "no data given for dataset {}", quote_where(p, file_));
  Handle d = create_dataset(*this, name, p, TypeInfo<T>::file(), dims, true);
  if (n > 0)
    check(H5Dwrite(d.id(), TypeInfo<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
          [&] { return fmt::format("cannot write dataset {}", quote_where(p, file_)); });
  Dataset ds(std::move(d), file_, p);
  write_attrs(ds, attrs);
}

void Group::write_string(const std::string& name, const std::string& value, const Attrs& attrs) {
  const std::string p = child_path(name);
  Handle t = vlen_utf8_type();
  Handle d = create_dataset(*this, name, p, t.id(), {}, false);
  const char* ptr = value.c_str();
  check(H5Dwrite(d.id(), t.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &ptr),
        [&] { return fmt::format("cannot write dataset {}", quote_where(p, file_)); });
  Dataset ds(std::move(d), file_, p);
  write_attrs(ds, attrs);
}

void Group::write_strings(const std::string& name, const std::vector<std::string>& values,
                          const Attrs& attrs) {
  const std::string p = child_path(name);
  Handle t = vlen_utf8_type();
  // String datasets stay contiguous: filters would only see heap references, not the text.
  Handle d = create_dataset(*this, name, p, t.id(), {static_cast<hsize_t>(values.size())}, false);
  if (!values.empty()) {
    std::vector<const char*> ptrs;
    ptrs.reserve(values.size());
    for (const auto& s : values) ptrs.push_back(s.c_str());
    check(H5Dwrite(d.id(), t.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()),
          [&] { return fmt::format("cannot write dataset {}", quote_where(p, file_)); });
  }
  Dataset ds(std::move(d), file_, p);
  write_attrs(ds, attrs);
}

template <class T>
std::vector<T> Group::read(const std::string& name, std::vector<hsize_t>* dims) const {
  const Dataset d = dataset(name);
  const std::string where = quote_where(d.path(), file_);
  Handle t = own(H5Dget_type(d.id()), Handle::Kind::Datatype,
                 [&] { return fmt::format("cannot get type of dataset {}", where); });
  if (!type_matches<T>(t.id()))
    fail("dataset {} holds {} but {} was requested", where, describe_type(t.id()),
         TypeInfo<T>::name);
  const std::vector<hsize_t> shape = d.dims();
  Handle s = own(H5Dget_space(d.id()), Handle::Kind::Dataspace,
                 [&] { return fmt::format("cannot get dataspace of dataset {}", where); });
  const hssize_t n = H5Sget_simple_extent_npoints(s.id());
  if (n < 0) h5fail(fmt::format("cannot get size of dataset {}", where));
  std::vector<T> out(static_cast<std::size_t>(n));
  if (n > 0)
    check(H5Dread(d.id(), TypeInfo<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()),
          [&] { return fmt::format("cannot read dataset {}", where); });
  if (dims != nullptr) *dims = shape;
  return out;
}

template <class T>
T Group::read_scalar(const std::string& name) const {
  const std::vector<T> v = read<T>(name);
  if (v.size() != 1)
    fail("dataset {} has {} elements, expected a scalar", quote_where(child_path(name), file_),
         v.size());
  return v[0];
}

std::vector<std::string> Group::read_strings(const std::string& name) const {
  const Dataset d = dataset(name);
  const std::string where = fmt::format("dataset {}", quote_where(d.path(), file_));
  Handle t = own(H5Dget_type(d.id()), Handle::Kind::Datatype,
                 [&] { return fmt::format("cannot get type of {}", where); });
  if (H5Tget_class(t.id()) != H5T_STRING)
    fail("{} holds {} but string was requested", where, describe_type(t.id()));
  Handle s = own(H5Dget_space(d.id()), Handle::Kind::Dataspace,
                 [&] { return fmt::format("cannot get dataspace of {}", where); });
  const hssize_t n = H5Sget_simple_extent_npoints(s.id());
  if (n < 0) h5fail(fmt::format("cannot get size of {}", where));
  return read_string_elements(d.id(), false, t.id(), s.id(), static_cast<std::size_t>(n), where);
}

std::string Group::read_string(const std::string& name) const {
  std::vector<std::string> v = read_strings(name);
  if (v.size() != 1)
    fail("dataset {} has {} strings, expected one", quote_where(child_path(name), file_), v.size());
  return std::move(v[0]);
}

#define SPARSIM_IO_INSTANTIATE(T)                                                          \
  template void Group::write<T>(const std::string&, const T*, const std::vector<hsize_t>&, \
                                const Attrs&);                                             \
  template std::vector<T> Group::read<T>(const std::string&, std::vector<hsize_t>*) const; \
  template T Group::read_scalar<T>(const std::string&) const;
SPARSIM_IO_INSTANTIATE(float)
SPARSIM_IO_INSTANTIATE(double)
SPARSIM_IO_INSTANTIATE(std::int32_t)
SPARSIM_IO_INSTANTIATE(std::int64_t)
SPARSIM_IO_INSTANTIATE(std::uint8_t)
SPARSIM_IO_INSTANTIATE(std::uint64_t)
#undef SPARSIM_IO_INSTANTIATE

// ---------------------------------------------------------------------------------------------
// H5File

namespace {

Handle strong_close_fapl() {
  Handle p = own(H5Pcreate(H5P_FILE_ACCESS), Handle::Kind::PropList,
                 [] { return "cannot create file access property list"; });
  check(H5Pset_fclose_degree(p.id(), H5F_CLOSE_STRONG),
        [] { return "cannot set file close degree"; });
  return p;
}

}  // namespace

H5File H5File::create(const std::string& path) {
  silence_hdf5_errors();
  Handle fapl = strong_close_fapl();
  Handle f = own(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id()), Handle::Kind::File,
                 [&] { return fmt::format("cannot create HDF5 file '{}'", path); });
  return H5File(std::move(f), path);
}

H5File H5File::open_read(const std::string& path) {
  silence_hdf5_errors();
  Handle fapl = strong_close_fapl();
  Handle f = own(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.id()), Handle::Kind::File,
                 [&] { return fmt::format("cannot open HDF5 file '{}' for reading", path); });
  return H5File(std::move(f), path);
}

H5File H5File::open_rw(const std::string& path) {
  silence_hdf5_errors();
  Handle fapl = strong_close_fapl();
  Handle f = own(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl.id()), Handle::Kind::File,
                 [&] { return fmt::format("cannot open HDF5 file '{}' for writing", path); });
  return H5File(std::move(f), path);
}

Group H5File::root() const {
  silence_hdf5_errors();
  require(is_open(), "HDF5 file '{}' is not open", path_);
  Handle g = own(H5Gopen2(h_.id(), "/", H5P_DEFAULT), Handle::Kind::Group,
                 [&] { return fmt::format("cannot open the root group of file '{}'", path_); });
  return Group(std::move(g), path_, "/");
}

void H5File::flush() {
  silence_hdf5_errors();
  require(is_open(), "HDF5 file '{}' is not open", path_);
  check(H5Fflush(h_.id(), H5F_SCOPE_GLOBAL),
        [&] { return fmt::format("cannot flush HDF5 file '{}'", path_); });
}

void H5File::close() {
  silence_hdf5_errors();
  if (!is_open()) return;
  const hid_t id = h_.release();
  check(H5Fclose(id), [&] { return fmt::format("cannot close HDF5 file '{}'", path_); });
}

}  // namespace sparsim::io
