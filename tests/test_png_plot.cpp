// PNG line plots: the written files are decoded by an independent reader here (chunk walk, CRC
// check with zlib's crc32, inflate with zlib's uncompress, all five PNG filters) and the pixels
// are checked where the lines must be.
#include "core/error.hpp"
#include "helpers.hpp"
#include "io/png_plot.hpp"

#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;
using io::Rgb;

struct Image {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;
  std::vector<std::string> chunks;  // chunk types in file order
  Rgb at(int x, int y) const {
    const std::size_t i = (static_cast<std::size_t>(y) * width + x) * 3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};

std::uint32_t be32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (std::size_t k = 0; k < 4; ++k) v = (v << 8) | static_cast<unsigned char>(s.at(at + k));
  return v;
}

int paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  if (pa <= pb && pa <= pc) return a;
  return pb <= pc ? b : c;
}

/// Decodes an 8-bit RGB, non-interlaced PNG; ADD_FAILURE and an empty image on any defect.
Image decode_png(const std::string& bytes) {
  Image img;
  if (bytes.size() < 8 || bytes.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) != 0) {
    ADD_FAILURE() << "bad PNG signature";
    return {};
  }
  std::string idat;
  std::size_t pos = 8;
  bool ended = false;
  while (pos + 12 <= bytes.size() && !ended) {
    const std::uint32_t len = be32(bytes, pos);
    if (pos + 12 + len > bytes.size()) {
      ADD_FAILURE() << "chunk runs past the end";
      return {};
    }
    const std::string type = bytes.substr(pos + 4, 4);
    const std::string data = bytes.substr(pos + 8, len);
    const std::uint32_t crc = be32(bytes, pos + 8 + len);
    const uLong want = crc32(crc32(0L, Z_NULL, 0),
                             reinterpret_cast<const Bytef*>(bytes.data() + pos + 4), len + 4);
    EXPECT_EQ(crc, static_cast<std::uint32_t>(want)) << "CRC of chunk " << type;
    img.chunks.push_back(type);
    if (type == "IHDR") {
      EXPECT_EQ(len, 13u);
      img.width = static_cast<int>(be32(data, 0));
      img.height = static_cast<int>(be32(data, 4));
      EXPECT_EQ(data[8], 8) << "bit depth";
      EXPECT_EQ(data[9], 2) << "colour type (truecolour)";
      EXPECT_EQ(data[12], 0) << "interlace";
    } else if (type == "IDAT") {
      idat += data;
    } else if (type == "IEND") {
      ended = true;
    }
    pos += 12 + len;
  }
  EXPECT_TRUE(ended) << "no IEND";
  EXPECT_EQ(pos, bytes.size()) << "bytes after IEND";
  if (img.width <= 0 || img.height <= 0) {
    ADD_FAILURE() << "no usable IHDR";
    return {};
  }
  const std::size_t stride = static_cast<std::size_t>(img.width) * 3;
  std::vector<std::uint8_t> raw((stride + 1) * img.height + 1);
  uLongf raw_len = raw.size();
  const int rc = uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()),
                            static_cast<uLong>(idat.size()));
  EXPECT_EQ(rc, Z_OK);
  EXPECT_EQ(raw_len, (stride + 1) * img.height) << "inflated size";
  if (rc != Z_OK || raw_len != (stride + 1) * img.height) return {};
  img.rgb.assign(stride * img.height, 0);
  for (int y = 0; y < img.height; ++y) {
    const std::uint8_t filter = raw[y * (stride + 1)];
    const std::uint8_t* in = &raw[y * (stride + 1) + 1];
    std::uint8_t* row = &img.rgb[y * stride];
    const std::uint8_t* up = y > 0 ? &img.rgb[(y - 1) * stride] : nullptr;
    for (std::size_t i = 0; i < stride; ++i) {
      const int a = i >= 3 ? row[i - 3] : 0, b = up ? up[i] : 0, c = (up && i >= 3) ? up[i - 3] : 0;
      int pred = 0;
      switch (filter) {
        case 0:
          pred = 0;
          break;
        case 1:
          pred = a;
          break;
        case 2:
          pred = b;
          break;
        case 3:
          pred = (a + b) / 2;
          break;
        case 4:
          pred = paeth(a, b, c);
          break;
        default:
          ADD_FAILURE() << "filter type " << int(filter);
          return {};
      }
      row[i] = static_cast<std::uint8_t>(in[i] + pred);
    }
  }
  return img;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(PngPlot, EncoderRoundTripsPixels) {
  const int w = 7, h = 5;
  std::vector<std::uint8_t> rgb(w * h * 3);
  for (std::size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<std::uint8_t>(i * 37 + 11);
  const Image img = decode_png(io::encode_png(w, h, rgb));
  EXPECT_EQ(img.width, w);
  EXPECT_EQ(img.height, h);
  EXPECT_EQ(img.rgb, rgb);
  EXPECT_EQ(img.chunks, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  EXPECT_THROW(io::encode_png(w, h, std::vector<std::uint8_t>(5)), Error);
}

TEST(PngPlot, LinesLandWhereTheFrameSaysInTheirColours) {
  TempDir dir;
  const std::string path = dir.file("plot.png");
  io::Series flat{"flat=0.25", {}, {}}, rising{"rising (x/10)", {}, {}};
  for (int i = 0; i <= 10; ++i) {
    flat.x.push_back(i);
    flat.y.push_back(0.25);
    rising.x.push_back(i);
    rising.y.push_back(i / 10.0);
  }
  const std::vector<io::Series> series{flat, rising};
  io::write_line_plot(path, "Test plot: s\u0304=0.4", "layer", "sensitivity e_i", series);
  ASSERT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));
  const Image img = decode_png(slurp(path));
  ASSERT_EQ(img.width, 900);
  ASSERT_EQ(img.height, 560);

  const io::PlotFrame f =
      io::plot_frame("Test plot: s\u0304=0.4", "layer", "sensitivity e_i", series);
  EXPECT_EQ(f.width, 900);
  EXPECT_EQ(f.x0, 0.0);
  EXPECT_EQ(f.x1, 10.0);
  EXPECT_EQ(f.y0, 0.0);
  EXPECT_DOUBLE_EQ(f.y1, 1.0);
  EXPECT_GT(f.left, 40);
  EXPECT_LT(f.right, 900);
  EXPECT_GT(f.top, 10);
  EXPECT_LT(f.bottom, 540);
  const auto pixel = [&](double x, double y) {
    return img.at(static_cast<int>(std::floor(f.px(x))), static_cast<int>(std::floor(f.py(y))));
  };
  const Rgb c0 = io::series_colour(0), c1 = io::series_colour(1);
  EXPECT_NE(c0, c1);
  for (double x : {4.3, 6.0, 7.7, 9.5}) EXPECT_EQ(pixel(x, 0.25), c0) << "flat at x=" << x;
  for (double x : {4.5, 5.0, 6.2, 8.0}) EXPECT_EQ(pixel(x, x / 10.0), c1) << "rising at x=" << x;
  // markers: a disc around each data point
  const int mx = static_cast<int>(std::floor(f.px(9))),
            my = static_cast<int>(std::floor(f.py(0.25)));
  EXPECT_EQ(img.at(mx, my - 2), c0);
  EXPECT_EQ(img.at(mx, my + 2), c0);
  // away from lines, grid, frame and legend: the background
  EXPECT_EQ(pixel(8.5, 0.55), io::kPlotBackground);
  EXPECT_EQ(pixel(5.5, 0.05), io::kPlotBackground);
  // the flat line spans the plot area from side to side
  int run = 0;
  for (int x = static_cast<int>(f.left); x < static_cast<int>(f.right); ++x)
    run += img.at(x, my) == c0;
  EXPECT_GT(run, 0.8 * (f.right - f.left));
  // text: dark ink in the title band, the x label band and the y label band
  const auto has_ink = [&](int x0, int y0, int x1, int y1) {
    for (int y = y0; y < y1; ++y)
      for (int x = x0; x < x1; ++x) {
        const Rgb p = img.at(x, y);
        if (p.r < 80 && p.g < 80 && p.b < 80) return true;
      }
    return false;
  };
  EXPECT_TRUE(has_ink(0, 0, 900, static_cast<int>(f.top) - 2));
  EXPECT_TRUE(has_ink(static_cast<int>(f.left), 530, static_cast<int>(f.right), 560));
  EXPECT_TRUE(has_ink(0, static_cast<int>(f.top), 20, static_cast<int>(f.bottom)));
  // the legend carries both colours in the top-left corner (the lines avoid it)
  bool leg0 = false, leg1 = false;
  for (int y = static_cast<int>(f.top); y < static_cast<int>(f.top) + 80; ++y)
    for (int x = static_cast<int>(f.left); x < static_cast<int>(f.left) + 60; ++x) {
      leg0 = leg0 || img.at(x, y) == c0;
      leg1 = leg1 || img.at(x, y) == c1;
    }
  EXPECT_TRUE(leg0);
  EXPECT_TRUE(leg1);
}

TEST(PngPlot, OddInputIsHandledOrRefused) {
  TempDir dir;
  // one point, gaps, a single value: still a valid image of the asked size
  io::Series s{"one", {3}, {2.5}}, gap{"gap", {0, 1, 2, 3}, {1, std::nan(""), 2, 3}};
  const Image a = decode_png(io::render_line_plot("", "", "", {s, gap}, 320, 200));
  EXPECT_EQ(a.width, 320);
  EXPECT_EQ(a.height, 200);
  const Image b = decode_png(io::render_line_plot("empty", "x", "y", {}, 200, 150));
  EXPECT_EQ(b.width, 200);
  // refused: mismatched series, canvas too small, unwritable path (nothing left behind)
  EXPECT_THROW(io::render_line_plot("t", "x", "y", {io::Series{"bad", {1, 2}, {1}}}), Error);
  EXPECT_THROW(io::render_line_plot("t", "x", "y", {s}, 100, 100), Error);
  const std::string nowhere = dir.file("no/such/dir/p.png");
  EXPECT_THROW(io::write_line_plot(nowhere, "t", "x", "y", {s}), Error);
  EXPECT_FALSE(fs::exists(dir.file("no")));
}

}  // namespace
}  // namespace sparsim::test
