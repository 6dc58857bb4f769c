// Tests of the HDF5 layer (io/hdf5) and of atomic output files (io/run_file).
#include "core/error.hpp"
#include "io/hdf5.hpp"
#include "io/run_file.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using sparsim::Error;
using namespace sparsim::io;

namespace {

/// A fresh directory per test, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("sparsim_io_" + std::to_string(::getpid()) + "_" +
                                        info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  std::size_t entries() const {
    return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir_), {}));
  }

 private:
  fs::path dir_;
};

/// Runs `f` and returns the sparsim::Error message it throws (fails the test if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected sparsim::Error, got another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected sparsim::Error, nothing was thrown";
  return {};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

template <class T>
std::vector<T> ramp(std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>((i * 7 + 3) % 101);
  return v;
}

template <class T>
void round_trip_shapes(Group& g, const std::string& tag) {
  const std::vector<std::vector<hsize_t>> shapes = {{}, {1}, {5}, {3, 4}, {2, 3, 4}, {2, 1, 3, 2}};
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const auto& dims = shapes[k];
    hsize_t n = 1;
    for (auto d : dims) n *= d;
    const std::vector<T> data = ramp<T>(n);
    const std::string name = tag + "_" + std::to_string(k);
    g.write<T>(name, data.data(), dims, {"1", "test data"});
    std::vector<hsize_t> got_dims{99};
    const std::vector<T> back = g.read<T>(name, &got_dims);
    EXPECT_EQ(got_dims, dims) << name;
    EXPECT_EQ(back, data) << name;
    EXPECT_FALSE(g.dataset(name).chunked()) << name;
  }
  // Extreme values survive.
  const std::vector<T> ext = {std::numeric_limits<T>::lowest(), std::numeric_limits<T>::max(),
                              static_cast<T>(0)};
  g.write(tag + "_ext", ext);
  EXPECT_EQ(g.read<T>(tag + "_ext"), ext);
  g.write_scalar<T>(tag + "_scalar", static_cast<T>(42));
  EXPECT_EQ(g.read_scalar<T>(tag + "_scalar"), static_cast<T>(42));
  EXPECT_TRUE(g.dataset(tag + "_scalar").dims().empty());
}

}  // namespace

TEST(Hdf5, RoundTripEveryTypeAndShape) {
  ScratchDir dir;
  const std::string path = dir.file("types.h5");
  {
    H5File f = H5File::create(path);
    Group g = f.root().create_group("types");
    round_trip_shapes<float>(g, "f32");
    round_trip_shapes<double>(g, "f64");
    round_trip_shapes<std::int32_t>(g, "i32");
    round_trip_shapes<std::int64_t>(g, "i64");
    round_trip_shapes<std::uint8_t>(g, "u8");
    round_trip_shapes<std::uint64_t>(g, "u64");
    f.close();
  }
  // And again from a freshly opened read-only file.
  H5File f = H5File::open_read(path);
  Group g = f.root().open_group("types");
  std::vector<hsize_t> dims;
  EXPECT_EQ(g.read<double>("f64_4", &dims), ramp<double>(24));
  EXPECT_EQ(dims, (std::vector<hsize_t>{2, 3, 4}));
  EXPECT_EQ(g.read<std::uint8_t>("u8_3"), ramp<std::uint8_t>(12));
  EXPECT_EQ(g.dataset("f32_3").type_name(), "float32");
  EXPECT_EQ(g.dataset("i64_3").type_name(), "int64");
  EXPECT_EQ(g.dataset("u8_3").type_name(), "uint8");
  EXPECT_EQ(g.dataset("u64_3").type_name(), "uint64");
  EXPECT_EQ(g.read_scalar<std::int32_t>("i32_scalar"), 42);
}

TEST(Hdf5, EmptyAndSpecialValues) {
  ScratchDir dir;
  H5File f = H5File::create(dir.file("empty.h5"));
  Group r = f.root();
  r.write("empty", std::vector<float>{});
  std::vector<hsize_t> dims;
  EXPECT_TRUE(r.read<float>("empty", &dims).empty());
  EXPECT_EQ(dims, (std::vector<hsize_t>{0}));
  r.write<double>("zero_rows", nullptr, {0, 4});
  EXPECT_TRUE(r.read<double>("zero_rows", &dims).empty());
  EXPECT_EQ(dims, (std::vector<hsize_t>{0, 4}));
  const std::vector<float> special = {std::numeric_limits<float>::infinity(),
                                      -std::numeric_limits<float>::infinity(), -0.0f, 1e-45f};
  r.write("special", special);
  const auto back = r.read<float>("special");
  ASSERT_EQ(back.size(), 4u);
  EXPECT_EQ(back[0], special[0]);
  EXPECT_EQ(back[1], special[1]);
  EXPECT_TRUE(std::signbit(back[2]));
  EXPECT_EQ(back[3], special[3]);
  EXPECT_NE(error_of([&] { r.write<float>("nodata", nullptr, {3}); }).find("/nodata"),
            std::string::npos);
}

TEST(Hdf5, LargeDatasetIsChunkedAndCompressed) {
  ScratchDir dir;
  const std::string path = dir.file("large.h5");
  const hsize_t rows = 300, cols = 1000;  // 300,000 elements > 64 Ki
  std::vector<float> data(rows * cols);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 977) * 0.5f;
  std::vector<std::int64_t> ints(70000);
  std::iota(ints.begin(), ints.end(), -5);
  {
    H5File f = H5File::create(path);
    Group r = f.root();
    r.write("big/matrix", data.data(), {rows, cols}, {"1", "a compressible matrix"});
    r.write("big/ints", ints);
    std::vector<float> at_threshold(kChunkThreshold, 1.0f);
    std::vector<float> above_threshold(kChunkThreshold + 1, 1.0f);
    r.write("edge/at", at_threshold);
    r.write("edge/above", above_threshold);
    f.close();
  }
  H5File f = H5File::open_read(path);
  Group r = f.root();
  std::vector<hsize_t> dims;
  EXPECT_EQ(r.read<float>("big/matrix", &dims), data);
  EXPECT_EQ(dims, (std::vector<hsize_t>{rows, cols}));
  EXPECT_EQ(r.read<std::int64_t>("big/ints"), ints);

  const Dataset ds = r.dataset("big/matrix");
  EXPECT_TRUE(ds.chunked());
  const hid_t dcpl = H5Dget_create_plist(ds.id());
  ASSERT_GE(dcpl, 0);
  EXPECT_EQ(H5Pget_layout(dcpl), H5D_CHUNKED);
  hsize_t chunk[2] = {0, 0};
  ASSERT_EQ(H5Pget_chunk(dcpl, 2, chunk), 2);
  EXPECT_LE(chunk[0] * chunk[1], kChunkElements);
  EXPECT_EQ(chunk[1], cols);  // the trailing dimension is kept whole
  bool deflate = false, shuffle = false;
  unsigned deflate_level = 0;
  const int nfilters = H5Pget_nfilters(dcpl);
  for (int i = 0; i < nfilters; ++i) {
    unsigned flags = 0;
    std::size_t nvals = 4;
    unsigned vals[4] = {0, 0, 0, 0};
    char name[64];
    const H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nvals, vals,
                                           sizeof(name), name, nullptr);
    if (id == H5Z_FILTER_DEFLATE) {
      deflate = true;
      deflate_level = nvals > 0 ? vals[0] : 0;
    }
    if (id == H5Z_FILTER_SHUFFLE) shuffle = true;
  }
  EXPECT_TRUE(deflate);
  EXPECT_TRUE(shuffle);
  EXPECT_EQ(deflate_level, kDeflateLevel);
  H5Pclose(dcpl);
  // The compression really happened.
  EXPECT_LT(H5Dget_storage_size(ds.id()), rows * cols * sizeof(float) / 2);

  EXPECT_TRUE(r.dataset("big/ints").chunked());
  EXPECT_FALSE(r.dataset("edge/at").chunked());
  EXPECT_TRUE(r.dataset("edge/above").chunked());
}

TEST(Hdf5, Strings) {
  ScratchDir dir;
  const std::string path = dir.file("strings.h5");
  const std::string utf8 = "na\xc3\xafve \xe2\x80\x94 \xce\xbb=0.5";
  const std::vector<std::string> many = {"alpha", "", utf8, std::string(1000, 'x')};
  {
    H5File f = H5File::create(path);
    Group r = f.root();
    r.write_string("one", utf8, {"", "a UTF-8 string"});
    r.write_string("empty", "");
    r.write_strings("many", many);
    r.write_strings("none", {});
    f.close();
  }
  H5File f = H5File::open_read(path);
  Group r = f.root();
  EXPECT_EQ(r.read_string("one"), utf8);
  EXPECT_EQ(r.read_string("empty"), "");
  EXPECT_EQ(r.read_strings("many"), many);
  EXPECT_TRUE(r.read_strings("none").empty());
  EXPECT_EQ(r.dataset("one").type_name(), "string");
  EXPECT_EQ(r.dataset("one").get_attr<std::string>("meaning"), "a UTF-8 string");
  EXPECT_FALSE(r.dataset("one").has_attr("units"));

  // The stored type is variable-length UTF-8.
  const hid_t t = H5Dget_type(r.dataset("many").id());
  EXPECT_GT(H5Tis_variable_str(t), 0);
  EXPECT_EQ(H5Tget_cset(t), H5T_CSET_UTF8);
  H5Tclose(t);

  const std::string msg = error_of([&] { r.read_string("many"); });
  EXPECT_NE(msg.find("/many"), std::string::npos) << msg;
  const std::string msg2 = error_of([&] { r.read<float>("one"); });
  EXPECT_NE(msg2.find("string"), std::string::npos) << msg2;
}

TEST(Hdf5, FixedLengthStringsAreReadable) {
  ScratchDir dir;
  H5File f = H5File::create(dir.file("fixed.h5"));
  Group r = f.root();
  // Written through the C API the way other tools store fixed-length strings.
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, 6);
  H5Tset_strpad(t, H5T_STR_NULLPAD);
  const hsize_t n = 2;
  const hid_t s = H5Screate_simple(1, &n, nullptr);
  const hid_t d = H5Dcreate2(r.id(), "fixed", t, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const char buf[12] = {'a', 'b', 'c', 0, 0, 0, 's', 'i', 'x', 'x', 'x', 'x'};
  ASSERT_GE(H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), 0);
  H5Dclose(d);
  H5Sclose(s);
  H5Tclose(t);
  EXPECT_EQ(r.read_strings("fixed"), (std::vector<std::string>{"abc", "sixxxx"}));
}

TEST(Hdf5, Attributes) {
  ScratchDir dir;
  const std::string path = dir.file("attrs.h5");
  {
    H5File f = H5File::create(path);
    Group r = f.root();
    r.write("t", std::vector<double>{1.0, 2.0}, {"s", "time per step"});
    Dataset t = r.dataset("t");
    t.set_attr("note", "first");
    t.set_attr("note", std::string("second"));  // replaced
    t.set_attr("scale", 0.25);
    t.set_attr("count", 7);
    t.set_attr("big", std::uint64_t{1} << 40);
    t.set_attr("flag", true);
    r.set_attr("model", "llama");
    r.set_attr("n_layers", std::int64_t{32});
    r.set_attr("sparsity", 0.9f);
    f.close();
  }
  H5File f = H5File::open_read(path);
  Group r = f.root();
  const Dataset t = r.dataset("t");
  EXPECT_EQ(t.get_attr<std::string>("units"), "s");
  EXPECT_EQ(t.get_attr<std::string>("meaning"), "time per step");
  EXPECT_EQ(t.get_attr<std::string>("note"), "second");
  EXPECT_DOUBLE_EQ(t.get_attr<double>("scale"), 0.25);
  EXPECT_EQ(t.get_attr<std::int64_t>("count"), 7);
  EXPECT_EQ(t.get_attr<std::int64_t>("big"), std::int64_t{1} << 40);
  EXPECT_EQ(t.get_attr<std::int64_t>("flag"), 1);
  EXPECT_EQ(t.attr_names(), (std::vector<std::string>{"big", "count", "flag", "meaning", "note",
                                                      "scale", "units"}));
  EXPECT_EQ(r.get_attr<std::string>("model"), "llama");
  EXPECT_EQ(r.get_attr<std::int64_t>("n_layers"), 32);
  EXPECT_FLOAT_EQ(static_cast<float>(r.get_attr<double>("sparsity")), 0.9f);
  EXPECT_TRUE(r.has_attr("model"));
  EXPECT_FALSE(r.has_attr("nope"));

  const std::string missing = error_of([&] { r.get_attr<double>("nope"); });
  EXPECT_NE(missing.find("nope"), std::string::npos) << missing;
  EXPECT_NE(missing.find(path), std::string::npos) << missing;
  const std::string kind = error_of([&] { t.get_attr<double>("units"); });
  EXPECT_NE(kind.find("string"), std::string::npos) << kind;
  EXPECT_NE(kind.find("/t"), std::string::npos) << kind;
  EXPECT_NE(error_of([&] { t.get_attr<std::int64_t>("scale"); }).find("float64"),
            std::string::npos);
}

TEST(Hdf5, NestedGroups) {
  ScratchDir dir;
  H5File f = H5File::create(dir.file("groups.h5"));
  Group r = f.root();
  EXPECT_EQ(r.path(), "/");
  Group c = r.create_group("a/b/c");
  EXPECT_EQ(c.path(), "/a/b/c");
  Group z = r.create_group("z");
  z.write("values", std::vector<std::int32_t>{1, 2, 3});
  r.write("a/x/deep", std::vector<float>{1.5f});  // intermediate groups appear
  EXPECT_TRUE(r.has("a"));
  EXPECT_TRUE(r.has("a/b/c"));
  EXPECT_TRUE(r.has("/a/b"));
  EXPECT_TRUE(r.has("a/x/deep"));
  EXPECT_FALSE(r.has("a/q/c"));
  EXPECT_FALSE(r.has("nothing"));
  EXPECT_TRUE(r.has_group("a/b"));
  EXPECT_FALSE(r.has_group("z/values"));
  EXPECT_TRUE(r.has_dataset("z/values"));
  EXPECT_FALSE(r.has_dataset("a"));
  EXPECT_EQ(r.list(), (std::vector<std::string>{"a", "z"}));
  EXPECT_EQ(r.open_group("a").list(), (std::vector<std::string>{"b", "x"}));
  Group b = r.open_group("a/b");
  EXPECT_EQ(b.path(), "/a/b");
  EXPECT_EQ(b.list(), (std::vector<std::string>{"c"}));
  EXPECT_EQ(b.require_group("c").path(), "/a/b/c");
  EXPECT_EQ(b.require_group("d").path(), "/a/b/d");
  EXPECT_EQ(r.open_group("a").read<float>("x/deep"), std::vector<float>{1.5f});
  EXPECT_EQ(r.dataset("a/x/deep").path(), "/a/x/deep");

  EXPECT_NE(error_of([&] { r.create_group("a/b"); }).find("already exists"), std::string::npos);
  EXPECT_NE(error_of([&] { z.write("values", std::vector<float>{1}); }).find("/z/values"),
            std::string::npos);
  EXPECT_NE(error_of([&] { r.open_group("z/values"); }).find("not a group"), std::string::npos);
  EXPECT_NE(error_of([&] { r.dataset("a/b"); }).find("not a dataset"), std::string::npos);
  const std::string msg = error_of([&] { r.open_group("a/nope"); });
  EXPECT_NE(msg.find("/a/nope"), std::string::npos) << msg;
}

TEST(Hdf5, TypeMismatchNamesDatasetAndTypes) {
  ScratchDir dir;
  H5File f = H5File::create(dir.file("mismatch.h5"));
  Group g = f.root().create_group("grp");
  g.write("f", std::vector<float>{1.0f});
  g.write("i", std::vector<std::int64_t>{1});
  const std::string m1 = error_of([&] { g.read<double>("f"); });
  EXPECT_NE(m1.find("/grp/f"), std::string::npos) << m1;
  EXPECT_NE(m1.find("float32"), std::string::npos) << m1;
  EXPECT_NE(m1.find("float64"), std::string::npos) << m1;
  const std::string m2 = error_of([&] { g.read<std::int32_t>("i"); });
  EXPECT_NE(m2.find("int64"), std::string::npos) << m2;
  EXPECT_NE(m2.find("int32"), std::string::npos) << m2;
  const std::string m3 = error_of([&] { g.read<std::uint64_t>("i"); });
  EXPECT_NE(m3.find("uint64"), std::string::npos) << m3;
  EXPECT_NE(error_of([&] { g.read_scalar<float>("missing"); }).find("/grp/missing"),
            std::string::npos);
}

TEST(Hdf5, MissingDatasetAndFileNameThePath) {
  ScratchDir dir;
  const std::string path = dir.file("missing.h5");
  H5File f = H5File::create(path);
  Group g = f.root().create_group("results");
  const std::string msg = error_of([&] { g.read<float>("logits"); });
  EXPECT_NE(msg.find("/results/logits"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  const std::string deep = error_of([&] { g.read<float>("no/such/thing"); });
  EXPECT_NE(deep.find("/results/no/such/thing"), std::string::npos) << deep;

  // HDF5's own error stack is not printed; the message says what went wrong instead.
  const std::string absent = dir.file("absent.h5");
  ::testing::internal::CaptureStderr();
  const std::string m2 = error_of([&] { H5File::open_read(absent); });
  const std::string m3 = error_of([&] { H5File::create(dir.file("no_dir/x.h5")); });
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(printed, "");
  EXPECT_NE(m2.find(absent), std::string::npos) << m2;
  EXPECT_NE(m3.find("no_dir/x.h5"), std::string::npos) << m3;

  // Not an HDF5 file.
  const std::string text = dir.file("text.h5");
  std::ofstream(text) << "hello";
  const std::string m4 = error_of([&] { H5File::open_read(text); });
  EXPECT_NE(m4.find(text), std::string::npos) << m4;
}

TEST(Hdf5, ReadOnlyFileRefusesWrites) {
  ScratchDir dir;
  const std::string path = dir.file("ro.h5");
  H5File::create(path).close();
  H5File f = H5File::open_read(path);
  Group r = f.root();
  const std::string msg = error_of([&] { r.write("x", std::vector<float>{1}); });
  EXPECT_NE(msg.find("/x"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  f.close();
  H5File w = H5File::open_rw(path);
  w.root().write("x", std::vector<float>{1});
  w.flush();
  EXPECT_EQ(w.root().read<float>("x"), std::vector<float>{1});
}

TEST(Hdf5, HandlesShareAndOutliveTheirFile) {
  ScratchDir dir;
  H5File f = H5File::create(dir.file("handles.h5"));
  Group copy;
  {
    Group g = f.root().create_group("g");
    copy = g;  // shares the identifier
  }
  copy.write("v", std::vector<std::uint8_t>{1, 2});
  EXPECT_EQ(copy.read<std::uint8_t>("v"), (std::vector<std::uint8_t>{1, 2}));
  Group other = copy;
  other = Group();  // dropping one copy leaves the other usable
  EXPECT_TRUE(copy.has("v"));

  H5File moved = std::move(f);
  EXPECT_FALSE(f.is_open());  // NOLINT(bugprone-use-after-move)
  moved.close();
  EXPECT_FALSE(moved.is_open());
  // The group was closed together with the file: using it throws, destroying it is harmless.
  EXPECT_THROW(copy.list(), Error);
  moved.close();  // closing twice is a no-op
  EXPECT_THROW(moved.root(), Error);
}

namespace {
/// Groups, datasets, attributes and named types open in file `f` (the file itself excluded).
ssize_t open_objects(const H5File& f) {
  return H5Fget_obj_count(
      f.id(), H5F_OBJ_GROUP | H5F_OBJ_DATASET | H5F_OBJ_ATTR | H5F_OBJ_DATATYPE | H5F_OBJ_LOCAL);
}
}  // namespace

// The strong close degree would hide leaks at file close, so count while the file is open.
TEST(Hdf5, NoIdentifierLeaks) {
  ScratchDir dir;
  const std::string path = dir.file("leaks.h5");
  {
    H5File f = H5File::create(path);
    Group r = f.root();
    EXPECT_EQ(open_objects(f), 1);  // r
    r.write("big", std::vector<double>(100000, 2.0), {"1", "x"});
    r.write_strings("s", {"a", "b"});
    r.create_group("g/h").set_attr("k", "v");
    (void)r.read<double>("big");
    (void)r.read_strings("s");
    (void)r.list();
    (void)r.open_group("g/h").get_attr<std::string>("k");
    (void)r.open_group("g").attr_names();
    (void)r.has_group("g");
    (void)r.has_dataset("g");
    EXPECT_THROW(r.read<float>("big"), Error);
    EXPECT_THROW(r.read<float>("absent"), Error);
    EXPECT_THROW(r.open_group("big"), Error);
    EXPECT_THROW(r.dataset("g"), Error);
    EXPECT_THROW(r.get_attr<double>("absent"), Error);
    EXPECT_THROW(r.open_group("g/h").get_attr<double>("k"), Error);
    EXPECT_EQ(open_objects(f), 1);
  }
  H5File f = H5File::open_read(path);
  {
    Group r = f.root();
    (void)r.dataset("big").chunked();
    (void)r.dataset("big").dims();
    (void)r.dataset("s").type_name();
    EXPECT_THROW(r.write("x", std::vector<float>{1}), Error);
    EXPECT_EQ(open_objects(f), 1);
  }
  EXPECT_EQ(open_objects(f), 0);
}

// ---------------------------------------------------------------------------------------------
// RunFile and atomic text files

TEST(RunFile, CommitPublishesReadableFile) {
  ScratchDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunFile rf(path);
    EXPECT_EQ(rf.temp_path(), temp_path_for(path));
    EXPECT_NE(rf.temp_path().find(".sparsim-" + std::to_string(::getpid()) + "-"),
              std::string::npos);
    EXPECT_TRUE(fs::exists(rf.temp_path()));
    EXPECT_FALSE(fs::exists(path));
    Group cfg = rf.root().create_group("config");
    cfg.write_string("model", "llama-7b");
    cfg.set_attr("seed", 1234);
    rf.root().write("timings/step_s", std::vector<double>{0.5, 0.25}, {"s", "wall time"});
    rf.commit();
    EXPECT_TRUE(rf.committed());
    EXPECT_FALSE(fs::exists(rf.temp_path()));
    EXPECT_TRUE(fs::exists(path));
    EXPECT_THROW(rf.root(), Error);
    EXPECT_THROW(rf.commit(), Error);
  }
  EXPECT_TRUE(fs::exists(path));  // the destructor of a committed file leaves it alone
  EXPECT_EQ(dir.entries(), 1u);
  H5File f = H5File::open_read(path);
  EXPECT_EQ(f.root().open_group("config").read_string("model"), "llama-7b");
  EXPECT_EQ(f.root().open_group("config").get_attr<std::int64_t>("seed"), 1234);
  EXPECT_EQ(f.root().read<double>("timings/step_s"), (std::vector<double>{0.5, 0.25}));
}

TEST(RunFile, AbortLeavesNothingAndKeepsOldFile) {
  ScratchDir dir;
  const std::string path = dir.file("run.h5");
  std::string tmp;
  {
    RunFile rf(path);
    tmp = rf.temp_path();
    rf.root().write("x", std::vector<float>(100000, 1.0f));
    rf.file().flush();
    EXPECT_TRUE(fs::exists(tmp));
  }
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(dir.entries(), 0u);

  // A failing run does not touch the result of an earlier one.
  {
    RunFile first(path);
    first.root().write_string("who", "first");
    first.commit();
  }
  try {
    RunFile second(path);
    second.root().write_string("who", "second");
    throw std::runtime_error("simulated failure");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(dir.entries(), 1u);
  EXPECT_EQ(H5File::open_read(path).root().read_string("who"), "first");

  // Explicit abort, then the destructor has nothing left to do.
  {
    RunFile third(path);
    third.abort();
    EXPECT_FALSE(fs::exists(third.temp_path()));
    EXPECT_THROW(third.root(), Error);
  }
  EXPECT_EQ(dir.entries(), 1u);
}

TEST(RunFile, OverwriteFlag) {
  ScratchDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunFile a(path);
    a.root().write_string("who", "a");
    a.commit();
  }
  const std::string msg = error_of([&] { RunFile b(path, /*overwrite=*/false); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_EQ(dir.entries(), 1u);
  {
    RunFile c(path, /*overwrite=*/true);
    c.root().write_string("who", "c");
    c.commit();
  }
  EXPECT_EQ(H5File::open_read(path).root().read_string("who"), "c");

  // The final path appears while the run is in progress: commit refuses, nothing is lost.
  const std::string late = dir.file("late.h5");
  {
    RunFile d(late, /*overwrite=*/false);
    d.root().write_string("who", "d");
    std::ofstream(late) << "someone else";
    EXPECT_THROW(d.commit(), Error);
  }
  EXPECT_EQ(slurp(late), "someone else");
  EXPECT_EQ(dir.entries(), 2u);

  // Without an existing file, overwrite == false publishes normally.
  const std::string fresh = dir.file("fresh.h5");
  {
    RunFile e(fresh, false);
    e.root().write_scalar("n", 3.0);
    e.commit();
  }
  EXPECT_EQ(H5File::open_read(fresh).root().read_scalar<double>("n"), 3.0);
  EXPECT_EQ(dir.entries(), 3u);
}

TEST(RunFile, MissingDirectoryIsReported) {
  ScratchDir dir;
  const std::string path = dir.file("missing/run.h5");
  const std::string msg = error_of([&] { RunFile rf(path); });
  EXPECT_NE(msg.find("missing/run.h5"), std::string::npos) << msg;
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(RunFile, JsonTextOfAnIllFormedString) {
  // nlohmann's dump() throws on a string that is not UTF-8; a JSON output never does.
  const nlohmann::json j = {{"output", std::string("42\xAC")}, {"n", 1}};
  EXPECT_THROW((void)j.dump(), nlohmann::json::exception);
  EXPECT_EQ(json_file_text(j, -1), "{\"n\":1,\"output\":\"42\xEF\xBF\xBD\"}\n");
  EXPECT_EQ(nlohmann::json::parse(json_file_text(j))["output"], "42\xEF\xBF\xBD");
}

TEST(RunFile, JsonTextKeepsTheKeyOrderOfAnOrderedObject) {
  nlohmann::ordered_json j;
  j["zeta"] = 1;
  j["alpha"] = 2;
  EXPECT_EQ(json_file_text(j, -1), "{\"zeta\":1,\"alpha\":2}\n");
}

TEST(RunFile, AtomicTextFiles) {
  ScratchDir dir;
  const std::string path = dir.file("summary.json");
  write_file_atomically(path, "{\"a\": 1}\n");
  EXPECT_EQ(slurp(path), "{\"a\": 1}\n");
  write_file_atomically(path, "{\"a\": 2}\n");
  EXPECT_EQ(slurp(path), "{\"a\": 2}\n");
  EXPECT_THROW(write_file_atomically(path, "x", /*overwrite=*/false), Error);
  EXPECT_EQ(slurp(path), "{\"a\": 2}\n");
  EXPECT_EQ(dir.entries(), 1u);

  {
    AtomicTextFile t(path);
    t << "partial " << 42;
    EXPECT_TRUE(fs::exists(t.temp_path()));
  }  // abandoned: the old contents stay, the temporary goes
  EXPECT_EQ(slurp(path), "{\"a\": 2}\n");
  EXPECT_EQ(dir.entries(), 1u);

  const std::string other = dir.file("table.txt");
  {
    AtomicTextFile t(other);
    t << "x = " << 1.5 << '\n';
    t.stream() << "done\n";
    EXPECT_FALSE(fs::exists(other));
    t.commit();
    EXPECT_TRUE(t.committed());
  }
  EXPECT_EQ(slurp(other), "x = 1.5\ndone\n");
  EXPECT_EQ(dir.entries(), 2u);
  EXPECT_THROW(write_file_atomically(dir.file("nope/x.txt"), "x"), Error);
}
