#pragma once
/// A small RAII layer over the HDF5 C API (written against 1.10, works with 1.12/1.14).
///
/// - Every hid_t lives in a Handle that closes it with the matching H5?close call.
/// - HDF5's automatic error printing is switched off; every failure becomes a sparsim::Error
///   whose message names the file, the object path and HDF5's own innermost complaint.
/// - Datasets carry the attributes "units" and "meaning" (see Attrs); datasets with more than
///   kChunkThreshold elements are chunked and compressed (shuffle + deflate level 4), smaller
///   ones are contiguous.
///
/// Files are opened with the "strong" close degree: H5File::close() closes every Group and
/// Dataset still open in that file, so a closed file really is closed (rename/unlink safe).
/// Handles that outlive their file become invalid; using them throws, destroying them is fine.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace sparsim::io {

/// Datasets with more elements than this are chunked and deflate-compressed.
inline constexpr std::uint64_t kChunkThreshold = 64 * 1024;
/// Target number of elements per chunk of a chunked dataset.
inline constexpr std::uint64_t kChunkElements = 64 * 1024;
/// Deflate (zlib) level used for chunked datasets.
inline constexpr unsigned kDeflateLevel = 4;

/// Owns one HDF5 identifier. Copies share the identifier through HDF5's reference count
/// (H5Iinc_ref); the last owner closes it. Closing an identifier that HDF5 already
/// invalidated (its file was closed) is silently skipped.
class Handle {
 public:
  enum class Kind : std::uint8_t { File, Group, Dataset, Dataspace, Datatype, PropList, Attribute };

  Handle() noexcept = default;
  /// Takes ownership of `id` (which must be >= 0; negative ids are rejected by callers).
  Handle(hid_t id, Kind kind) noexcept : id_(id), kind_(kind) {}
  ~Handle() { close(); }
  Handle(const Handle& o) noexcept;
  Handle& operator=(const Handle& o) noexcept;
  Handle(Handle&& o) noexcept : id_(o.id_), kind_(o.kind_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;

  hid_t id() const noexcept { return id_; }
  Kind kind() const noexcept { return kind_; }
  /// True when this handle holds an identifier HDF5 still considers valid.
  bool valid() const noexcept;
  explicit operator bool() const noexcept { return id_ >= 0; }
  /// Gives up ownership without closing.
  hid_t release() noexcept;
  /// Closes now; returns HDF5's status (0 also when there was nothing to close).
  herr_t close() noexcept;

 private:
  hid_t id_ = H5I_INVALID_HID;
  Kind kind_ = Kind::File;
};

/// Descriptive attributes written on a dataset: "units" (e.g. "s", "FLOP", "byte", "1") and
/// "meaning" (one sentence). Empty fields are not written.
struct Attrs {
  std::string units;
  std::string meaning;
};

class Group;
class Dataset;

/// Common part of groups and datasets: identity and attributes.
class Object {
 public:
  hid_t id() const noexcept { return h_.id(); }
  /// Absolute path inside the file ("/" for the root group).
  const std::string& path() const noexcept { return path_; }
  /// Name of the file on disk this object lives in.
  const std::string& file_path() const noexcept { return file_; }

  /// Sets (or replaces) a scalar attribute. Strings are variable-length UTF-8, floating-point
  /// values are float64, integers (and bools) are int64.
  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, const char* value) { set_attr(name, std::string(value)); }
  void set_attr(const std::string& name, double value);
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  void set_attr(const std::string& name, I value) {
    set_attr_int(name, static_cast<std::int64_t>(value));
  }

  bool has_attr(const std::string& name) const;
  /// Reads a scalar attribute as std::string, double or std::int64_t; throws sparsim::Error when
  /// it is missing or of another kind (string / floating-point / integer).
  template <class T>
  T get_attr(const std::string& name) const;
  /// Names of all attributes, sorted.
  std::vector<std::string> attr_names() const;

 protected:
  Object() = default;
  Object(Handle h, std::string file, std::string path)
      : h_(std::move(h)), file_(std::move(file)), path_(std::move(path)) {}
  void set_attr_int(const std::string& name, std::int64_t value);
  /// "'<path>' in file '<file>'" for error messages.
  std::string where() const;

  Handle h_;
  std::string file_;
  std::string path_;
};

template <>
std::string Object::get_attr<std::string>(const std::string& name) const;
template <>
double Object::get_attr<double>(const std::string& name) const;
template <>
std::int64_t Object::get_attr<std::int64_t>(const std::string& name) const;

/// An open dataset (for its shape, type and attributes; data go through Group::read/write).
class Dataset : public Object {
 public:
  Dataset() = default;
  std::vector<hsize_t> dims() const;
  /// Element type in words: "float32", "int64", "uint8", "string", ...
  std::string type_name() const;
  /// True when the dataset's layout is chunked.
  bool chunked() const;

 private:
  friend class Group;
  Dataset(Handle h, std::string file, std::string path)
      : Object(std::move(h), std::move(file), std::move(path)) {}
};

/// An open group. Names given to its methods are relative paths ("x" or "a/b/x").
class Group : public Object {
 public:
  Group() = default;

  /// Creates a group (and any missing intermediate groups for "a/b"); fails if it exists.
  Group create_group(const std::string& name);
  /// Opens an existing group; fails with the full path if it is missing.
  Group open_group(const std::string& name) const;
  /// Opens the group if it exists, otherwise creates it.
  Group require_group(const std::string& name);
  /// Opens an existing dataset.
  Dataset dataset(const std::string& name) const;

  /// True when a link `name` (possibly "a/b/c") resolves to an object.
  bool has(const std::string& name) const;
  bool has_group(const std::string& name) const;
  bool has_dataset(const std::string& name) const;
  /// Names of the direct members (groups and datasets), sorted.
  std::vector<std::string> list() const;

  /// Writes a new dataset of shape `dims` (row-major; empty dims = scalar) from `data`.
  /// T: float, double, int32_t, int64_t, uint8_t, uint64_t. Fails if `name` exists.
  template <class T>
  void write(const std::string& name, const T* data, const std::vector<hsize_t>& dims,
             const Attrs& attrs = {});
  /// 1-D convenience.
  template <class T>
  void write(const std::string& name, const std::vector<T>& data, const Attrs& attrs = {}) {
    write<T>(name, data.data(), {static_cast<hsize_t>(data.size())}, attrs);
  }
  /// Scalar dataset.
  template <class T>
  void write_scalar(const std::string& name, T value, const Attrs& attrs = {}) {
    write<T>(name, &value, {}, attrs);
  }
  /// Scalar variable-length UTF-8 string dataset.
  void write_string(const std::string& name, const std::string& value, const Attrs& attrs = {});
  /// 1-D dataset of variable-length UTF-8 strings.
  void write_strings(const std::string& name, const std::vector<std::string>& values,
                     const Attrs& attrs = {});

  /// Reads a whole dataset whose element type is exactly T (no silent conversion); throws
  /// sparsim::Error naming the dataset and both types otherwise. `dims` receives the shape.
  template <class T>
  std::vector<T> read(const std::string& name, std::vector<hsize_t>* dims = nullptr) const;
  /// Reads a scalar dataset (or a one-element one).
  template <class T>
  T read_scalar(const std::string& name) const;
  /// Reads a scalar string dataset (variable- or fixed-length).
  std::string read_string(const std::string& name) const;
  /// Reads a 1-D (or any-rank, flattened) string dataset.
  std::vector<std::string> read_strings(const std::string& name) const;

 private:
  friend class H5File;
  Group(Handle h, std::string file, std::string path)
      : Object(std::move(h), std::move(file), std::move(path)) {}
  std::string child_path(const std::string& name) const;
};

/// An open HDF5 file; move-only, closes on destruction.
class H5File {
 public:
  /// Creates (truncating any existing file).
  static H5File create(const std::string& path);
  /// Opens an existing file read-only.
  static H5File open_read(const std::string& path);
  /// Opens an existing file for reading and writing.
  static H5File open_rw(const std::string& path);

  H5File() = default;
  H5File(H5File&&) noexcept = default;
  H5File& operator=(H5File&&) noexcept = default;
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;
  ~H5File() = default;

  Group root() const;
  /// Flushes all buffers of this file to disk.
  void flush();
  /// Flushes and closes (closing every object still open in it); throws on failure.
  void close();
  bool is_open() const noexcept { return static_cast<bool>(h_); }
  const std::string& path() const noexcept { return path_; }
  hid_t id() const noexcept { return h_.id(); }

 private:
  H5File(Handle h, std::string path) : h_(std::move(h)), path_(std::move(path)) {}
  Handle h_;
  std::string path_;
};

/// Turns off HDF5's automatic error printing for the calling thread (done implicitly by every
/// function here; exposed for code that calls the C API directly).
void silence_hdf5_errors();
/// The innermost message on HDF5's current error stack ("" when empty).
std::string hdf5_error_detail();

}  // namespace sparsim::io
