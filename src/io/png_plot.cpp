#include "io/png_plot.hpp"

#include "core/error.hpp"
#include "io/run_file.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace sparsim::io {

namespace {

// ---------------------------------------------------------------------------------------------
// Bitmap font: 5 columns × up to 9 rows per glyph ('#' = ink), rows separated by '|'. Rows 0-6
// hold capitals and digits; lower-case letters have their x-height at rows 2-6 and descenders in
// rows 7-8. Drawn on a 6-column advance.

struct GlyphDef {
  char c;
  const char* rows;
};

constexpr int kGlyphW = 5;
constexpr int kGlyphH = 9;
constexpr int kAdvance = 6;

// clang-format off
constexpr GlyphDef kGlyphDefs[] = {
    {'A', ".###.|#...#|#...#|#####|#...#|#...#|#...#"},
    {'B', "####.|#...#|#...#|####.|#...#|#...#|####."},
    {'C', ".###.|#...#|#....|#....|#....|#...#|.###."},
    {'D', "####.|#...#|#...#|#...#|#...#|#...#|####."},
    {'E', "#####|#....|#....|####.|#....|#....|#####"},
    {'F', "#####|#....|#....|####.|#....|#....|#...."},
    {'G', ".###.|#...#|#....|#.###|#...#|#...#|.####"},
    {'H', "#...#|#...#|#...#|#####|#...#|#...#|#...#"},
    {'I', ".###.|..#..|..#..|..#..|..#..|..#..|.###."},
    {'J', "..###|...#.|...#.|...#.|...#.|#..#.|.##.."},
    {'K', "#...#|#..#.|#.#..|##...|#.#..|#..#.|#...#"},
    {'L', "#....|#....|#....|#....|#....|#....|#####"},
    {'M', "#...#|##.##|#.#.#|#.#.#|#...#|#...#|#...#"},
    {'N', "#...#|#...#|##..#|#.#.#|#..##|#...#|#...#"},
    {'O', ".###.|#...#|#...#|#...#|#...#|#...#|.###."},
    {'P', "####.|#...#|#...#|####.|#....|#....|#...."},
    {'Q', ".###.|#...#|#...#|#...#|#.#.#|#..#.|.##.#"},
    {'R', "####.|#...#|#...#|####.|#.#..|#..#.|#...#"},
    {'S', ".####|#....|#....|.###.|....#|....#|####."},
    {'T', "#####|..#..|..#..|..#..|..#..|..#..|..#.."},
    {'U', "#...#|#...#|#...#|#...#|#...#|#...#|.###."},
    {'V', "#...#|#...#|#...#|#...#|#...#|.#.#.|..#.."},
    {'W', "#...#|#...#|#...#|#.#.#|#.#.#|#.#.#|.#.#."},
    {'X', "#...#|#...#|.#.#.|..#..|.#.#.|#...#|#...#"},
    {'Y', "#...#|#...#|.#.#.|..#..|..#..|..#..|..#.."},
    {'Z', "#####|....#|...#.|..#..|.#...|#....|#####"},
    {'a', ".....|.....|.###.|....#|.####|#...#|.####"},
    {'b', "#....|#....|#.##.|##..#|#...#|#...#|####."},
    {'c', ".....|.....|.###.|#....|#....|#...#|.###."},
    {'d', "....#|....#|.##.#|#..##|#...#|#...#|.####"},
    {'e', ".....|.....|.###.|#...#|#####|#....|.###."},
    {'f', "..##.|.#..#|.#...|###..|.#...|.#...|.#..."},
    {'g', ".....|.....|.####|#...#|#...#|#...#|.####|....#|.###."},
    {'h', "#....|#....|#.##.|##..#|#...#|#...#|#...#"},
    {'i', "..#..|.....|.##..|..#..|..#..|..#..|.###."},
    {'j', "...#.|.....|..##.|...#.|...#.|...#.|...#.|#..#.|.##.."},
    {'k', "#....|#....|#..#.|#.#..|##...|#.#..|#..#."},
    {'l', ".##..|..#..|..#..|..#..|..#..|..#..|.###."},
    {'m', ".....|.....|##.#.|#.#.#|#.#.#|#.#.#|#.#.#"},
    {'n', ".....|.....|#.##.|##..#|#...#|#...#|#...#"},
    {'o', ".....|.....|.###.|#...#|#...#|#...#|.###."},
    {'p', ".....|.....|####.|#...#|#...#|#...#|####.|#....|#...."},
    {'q', ".....|.....|.####|#...#|#...#|#...#|.####|....#|....#"},
    {'r', ".....|.....|#.##.|##..#|#....|#....|#...."},
    {'s', ".....|.....|.####|#....|.###.|....#|####."},
    {'t', ".#...|.#...|###..|.#...|.#...|.#..#|..##."},
    {'u', ".....|.....|#...#|#...#|#...#|#..##|.##.#"},
    {'v', ".....|.....|#...#|#...#|#...#|.#.#.|..#.."},
    {'w', ".....|.....|#...#|#...#|#.#.#|#.#.#|.#.#."},
    {'x', ".....|.....|#...#|.#.#.|..#..|.#.#.|#...#"},
    {'y', ".....|.....|#...#|#...#|#...#|#...#|.####|....#|.###."},
    {'z', ".....|.....|#####|...#.|..#..|.#...|#####"},
    {'0', ".###.|#...#|#..##|#.#.#|##..#|#...#|.###."},
    {'1', "..#..|.##..|..#..|..#..|..#..|..#..|.###."},
    {'2', ".###.|#...#|....#|...#.|..#..|.#...|#####"},
    {'3', "#####|...#.|..#..|...#.|....#|#...#|.###."},
    {'4', "...#.|..##.|.#.#.|#..#.|#####|...#.|...#."},
    {'5', "#####|#....|####.|....#|....#|#...#|.###."},
    {'6', "..##.|.#...|#....|####.|#...#|#...#|.###."},
    {'7', "#####|....#|...#.|..#..|.#...|.#...|.#..."},
    {'8', ".###.|#...#|#...#|.###.|#...#|#...#|.###."},
    {'9', ".###.|#...#|#...#|.####|....#|...#.|.##.."},
    {' ', "....."},
    {'.', ".....|.....|.....|.....|.....|.##..|.##.."},
    {',', ".....|.....|.....|.....|.....|.##..|.##..|..#..|.#..."},
    {'-', ".....|.....|.....|#####"},
    {'+', ".....|..#..|..#..|#####|..#..|..#.."},
    {'=', ".....|.....|#####|.....|#####"},
    {'(', "...#.|..#..|.#...|.#...|.#...|..#..|...#."},
    {')', ".#...|..#..|...#.|...#.|...#.|..#..|.#..."},
    {'[', ".###.|.#...|.#...|.#...|.#...|.#...|.###."},
    {']', ".###.|...#.|...#.|...#.|...#.|...#.|.###."},
    {':', ".....|.##..|.##..|.....|.##..|.##.."},
    {'_', ".....|.....|.....|.....|.....|.....|.....|#####"},
    {'/', "....#|....#|...#.|..#..|.#...|#....|#...."},
    {'\'', "..#..|..#..|.#..."},
    {'|', "..#..|..#..|..#..|..#..|..#..|..#..|..#.."},
    {'%', "##...|##..#|...#.|..#..|.#...|#..##|...##"},
};
// clang-format on

using GlyphBits = std::array<std::uint8_t, kGlyphH>;  // bit (4 - col) of each row

struct Font {
  std::array<GlyphBits, 128> bits{};
  std::array<bool, 128> present{};
  Font() {
    for (const GlyphDef& g : kGlyphDefs) {
      GlyphBits b{};
      int row = 0, col = 0;
      for (const char* p = g.rows; *p && row < kGlyphH; ++p) {
        if (*p == '|') {
          ++row;
          col = 0;
          continue;
        }
        if (*p == '#' && col < kGlyphW) b[row] |= static_cast<std::uint8_t>(1u << (4 - col));
        ++col;
      }
      const auto i = static_cast<unsigned char>(g.c);
      bits[i] = b;
      present[i] = true;
    }
  }
};

const Font& font() {
  static const Font f;
  return f;
}

// A glyph to draw: a code from the table, a hollow box for unknown characters, or a macron over
// the previous glyph.
enum class GlyphKind { Normal, Unknown, Macron };
struct TextGlyph {
  GlyphKind kind;
  unsigned char c;
};

std::vector<TextGlyph> shape_text(const std::string& s) {
  std::vector<TextGlyph> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out.push_back({font().present[b] ? GlyphKind::Normal : GlyphKind::Unknown, b});
      ++i;
      continue;
    }
    std::size_t len = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    len = std::min(len, s.size() - i);
    if (len == 2 && b == 0xCC && static_cast<unsigned char>(s[i + 1]) == 0x84)
      out.push_back({GlyphKind::Macron, 0});  // U+0304 combining macron
    else
      out.push_back({GlyphKind::Unknown, 0});
    i += len;
  }
  return out;
}

int text_width(const std::string& s, int scale) {
  int n = 0;
  for (const TextGlyph& g : shape_text(s))
    if (g.kind != GlyphKind::Macron) ++n;
  return n == 0 ? 0 : (n * kAdvance - 1) * scale;
}
int text_height(int scale) {
  return kGlyphH * scale;
}

// ---------------------------------------------------------------------------------------------
// Canvas

class Canvas {
 public:
  Canvas(int w, int h, Rgb bg) : w_(w), h_(h), px_(static_cast<std::size_t>(w) * h * 3) {
    for (std::size_t i = 0; i < px_.size(); i += 3) {
      px_[i] = bg.r;
      px_[i + 1] = bg.g;
      px_[i + 2] = bg.b;
    }
  }
  int width() const { return w_; }
  int height() const { return h_; }
  const std::vector<std::uint8_t>& pixels() const { return px_; }

  /// Mixes `c` into pixel (x, y) with weight a in [0, 1]; outside the canvas: nothing.
  void blend(int x, int y, Rgb c, double a) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_ || !(a > 0)) return;
    a = std::min(a, 1.0);
    std::uint8_t* p = &px_[(static_cast<std::size_t>(y) * w_ + x) * 3];
    const auto mix = [a](std::uint8_t dst, std::uint8_t src) {
      return static_cast<std::uint8_t>(std::lround(dst + (src - dst) * a));
    };
    p[0] = mix(p[0], c.r);
    p[1] = mix(p[1], c.g);
    p[2] = mix(p[2], c.b);
  }
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c) {  // [x0, x1) × [y0, y1)
    for (int y = std::max(y0, 0); y < std::min(y1, h_); ++y)
      for (int x = std::max(x0, 0); x < std::min(x1, w_); ++x) blend(x, y, c, 1.0);
  }
  void hline(int x0, int x1, int y, Rgb c) { fill_rect(x0, y, x1 + 1, y + 1, c); }
  void vline(int x, int y0, int y1, Rgb c) { fill_rect(x, y0, x + 1, y1 + 1, c); }

  /// Text with its top-left corner at (x, y); vertical = rotated a quarter turn counter-clockwise
  /// (reads bottom to top), then (x, y) is the bottom-left corner of the rotated text's box.
  void text(int x, int y, const std::string& s, int scale, Rgb c, bool vertical = false) {
    int pen = 0;
    int prev_pen = -1;
    const auto dot = [&](int tx, int ty) {  // one font pixel at text coordinates (tx, ty)
      for (int dy = 0; dy < scale; ++dy)
        for (int dx = 0; dx < scale; ++dx) {
          const int u = tx * scale + dx, v = ty * scale + dy;
          if (vertical)
            blend(x + v, y - 1 - u, c, 1.0);
          else
            blend(x + u, y + v, c, 1.0);
        }
    };
    for (const TextGlyph& g : shape_text(s)) {
      if (g.kind == GlyphKind::Macron) {
        if (prev_pen >= 0)
          for (int col = 0; col < kGlyphW; ++col) dot(prev_pen + col, 0);
        continue;
      }
      if (g.kind == GlyphKind::Unknown) {
        for (int col = 0; col < kGlyphW; ++col) {
          dot(pen + col, 0);
          dot(pen + col, 6);
        }
        for (int row = 1; row < 6; ++row) {
          dot(pen, row);
          dot(pen + kGlyphW - 1, row);
        }
      } else {
        const GlyphBits& b = font().bits[g.c];
        for (int row = 0; row < kGlyphH; ++row)
          for (int col = 0; col < kGlyphW; ++col)
            if (b[row] & (1u << (4 - col))) dot(pen + col, row);
      }
      prev_pen = pen;
      pen += kAdvance;
    }
  }

 private:
  int w_, h_;
  std::vector<std::uint8_t> px_;
};

/// Antialiased coverage of round-capped thick polylines and discs, composited in one go so that
/// overlapping pieces of the same shape do not darken each other.
class Coverage {
 public:
  Coverage(int w, int h) : w_(w), h_(h), a_(static_cast<std::size_t>(w) * h, 0.0f) {}
  /// Segment (x0, y0)-(x1, y1) of half-width hw (pixel-centre distance; 1 px soft edge).
  void segment(double x0, double y0, double x1, double y1, double hw) {
    const double r = hw + 1.0;
    const int ia = std::max(0, static_cast<int>(std::floor(std::min(x0, x1) - r)));
    const int ib = std::min(w_ - 1, static_cast<int>(std::ceil(std::max(x0, x1) + r)));
    const int ja = std::max(0, static_cast<int>(std::floor(std::min(y0, y1) - r)));
    const int jb = std::min(h_ - 1, static_cast<int>(std::ceil(std::max(y0, y1) + r)));
    const double dx = x1 - x0, dy = y1 - y0, len2 = dx * dx + dy * dy;
    for (int j = ja; j <= jb; ++j)
      for (int i = ia; i <= ib; ++i) {
        const double cx = i + 0.5, cy = j + 0.5;
        double t = len2 > 0 ? ((cx - x0) * dx + (cy - y0) * dy) / len2 : 0.0;
        t = std::clamp(t, 0.0, 1.0);
        const double ex = cx - (x0 + t * dx), ey = cy - (y0 + t * dy);
        put(i, j, hw + 0.5 - std::sqrt(ex * ex + ey * ey));
      }
  }
  void disc(double x, double y, double radius) { segment(x, y, x, y, radius); }
  void composite(Canvas& c, Rgb colour) const {
    for (int j = 0; j < h_; ++j)
      for (int i = 0; i < w_; ++i) {
        const float a = a_[static_cast<std::size_t>(j) * w_ + i];
        if (a > 0) c.blend(i, j, colour, a);
      }
  }

 private:
  void put(int i, int j, double a) {
    if (!(a > 0)) return;
    float& v = a_[static_cast<std::size_t>(j) * w_ + i];
    v = std::max(v, static_cast<float>(std::min(a, 1.0)));
  }
  int w_, h_;
  std::vector<float> a_;
};

// ---------------------------------------------------------------------------------------------
// Layout

constexpr Rgb kInk{34, 34, 34};
constexpr Rgb kGrid{225, 225, 225};
constexpr Rgb kFrame{90, 90, 90};
constexpr Rgb kLegendEdge{170, 170, 170};

struct Axis {
  double lo = 0, hi = 1, step = 0.2;
};

/// Data range → tick step of 1, 2 or 5 × 10^k (about six ticks) and the range widened to it.
Axis nice_axis(double lo, double hi, bool integral) {
  if (!(lo <= hi)) lo = 0, hi = 1;
  if (hi - lo <= std::abs(hi) * 1e-12 || hi == lo) {
    const double pad = integral ? 1.0 : std::max(std::abs(lo) * 0.1, 0.5);
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / 5.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  double step = (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * mag;
  if (integral) step = std::max(1.0, std::round(step));
  Axis a;
  a.step = step;
  a.lo = std::floor(lo / step + 1e-9) * step;
  a.hi = std::ceil(hi / step - 1e-9) * step;
  if (a.hi <= a.lo) a.hi = a.lo + step;
  return a;
}

std::vector<double> ticks_of(const Axis& a) {
  std::vector<double> t;
  const long n = std::lround((a.hi - a.lo) / a.step);
  for (long k = 0; k <= n; ++k) {
    double v = a.lo + static_cast<double>(k) * a.step;
    if (std::abs(v) < a.step * 1e-9) v = 0.0;
    t.push_back(v);
  }
  return t;
}

std::string tick_label(double v, double step) {
  const int decimals = step >= 1.0 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  return fmt::format("{:.{}f}", v, decimals);
}

struct Layout {
  PlotFrame f;
  Axis ax, ay;
  int scale = 1;  // text scale of ticks, labels and legend; the title uses scale + 1
  int pad = 6;
};

Layout make_layout(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                   const std::vector<Series>& series, int width, int height) {
  require(width >= 160 && height >= 120 && width <= 8192 && height <= 8192,
          "plot: a canvas of {}×{} pixels is outside 160×120 … 8192×8192", width, height);
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  bool xint = true, yint = true;
  for (const Series& s : series) {
    require(s.x.size() == s.y.size(), "plot: series '{}' has {} x values but {} y values", s.label,
            s.x.size(), s.y.size());
    for (std::size_t k = 0; k < s.x.size(); ++k) {
      if (!std::isfinite(s.x[k]) || !std::isfinite(s.y[k])) continue;
      xmin = std::min(xmin, s.x[k]);
      xmax = std::max(xmax, s.x[k]);
      ymin = std::min(ymin, s.y[k]);
      ymax = std::max(ymax, s.y[k]);
      xint = xint && s.x[k] == std::round(s.x[k]);
      yint = yint && s.y[k] == std::round(s.y[k]);
    }
  }
  Layout L;
  if (xmin > xmax) {  // no finite point at all
    xmin = ymin = 0;
    xmax = ymax = 1;
    xint = yint = false;
  }
  L.ax = nice_axis(xmin, xmax, xint);
  L.ay = nice_axis(ymin, ymax, yint);
  L.scale = std::max(1, std::min(width / 450, height / 280));
  const int s = L.scale;
  L.pad = 6 * s;
  const int tick = 3 * s;
  int ytick_w = 0;
  for (double v : ticks_of(L.ay))
    ytick_w = std::max(ytick_w, text_width(tick_label(v, L.ay.step), s));
  const std::vector<double> xt = ticks_of(L.ax);
  const int last_xtick_w = text_width(tick_label(xt.back(), L.ax.step), s);

  const int top = title.empty() ? 2 * L.pad : L.pad + text_height(s + 1) + L.pad;
  const int left =
      L.pad + (ylabel.empty() ? 0 : text_height(s) + L.pad) + ytick_w + L.pad / 2 + tick;
  const int bottom_margin =
      tick + L.pad / 2 + text_height(s) + (xlabel.empty() ? 0 : L.pad + text_height(s)) + L.pad;
  const int right_margin = std::max(2 * L.pad, last_xtick_w / 2 + L.pad);
  L.f.width = width;
  L.f.height = height;
  L.f.left = left;
  L.f.top = top;
  L.f.right = width - right_margin;
  L.f.bottom = height - bottom_margin;
  require(L.f.right - L.f.left >= 40 && L.f.bottom - L.f.top >= 40,
          "plot: a canvas of {}×{} pixels leaves no room for the plot area", width, height);
  L.f.x0 = L.ax.lo;
  L.f.x1 = L.ax.hi;
  L.f.y0 = L.ay.lo;
  L.f.y1 = L.ay.hi;
  L.f.x_step = L.ax.step;
  L.f.y_step = L.ay.step;
  return L;
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int sh = 24; sh >= 0; sh -= 8) out.push_back(static_cast<char>((v >> sh) & 0xFF));
}

void put_chunk(std::string& out, const char type[4], const std::string& data) {
  put_u32(out, static_cast<std::uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  out += body;
  const uLong crc = ::crc32(::crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(body.data()),
                            static_cast<uInt>(body.size()));
  put_u32(out, static_cast<std::uint32_t>(crc));
}

}  // namespace

Rgb series_colour(std::size_t i) {
  static constexpr std::array<Rgb, 8> kPalette = {{{31, 102, 178},
                                                   {222, 110, 20},
                                                   {40, 150, 60},
                                                   {200, 40, 45},
                                                   {125, 85, 180},
                                                   {130, 80, 60},
                                                   {215, 100, 180},
                                                   {110, 110, 110}}};
  return kPalette[i % kPalette.size()];
}

PlotFrame plot_frame(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                     const std::vector<Series>& series, int width, int height) {
  return make_layout(title, xlabel, ylabel, series, width, height).f;
}

std::string encode_png(int width, int height, const std::vector<std::uint8_t>& rgb) {
  require(width > 0 && height > 0, "png: image size {}×{}", width, height);
  const std::size_t row = static_cast<std::size_t>(width) * 3;
  require(rgb.size() == row * static_cast<std::size_t>(height),
          "png: {} bytes of pixels for a {}×{} RGB image", rgb.size(), width, height);
  std::string raw;
  raw.reserve((row + 1) * static_cast<std::size_t>(height));
  for (int y = 0; y < height; ++y) {
    raw.push_back('\0');  // filter type 0 (None)
    raw.append(reinterpret_cast<const char*>(rgb.data()) + row * static_cast<std::size_t>(y), row);
  }
  uLongf zlen = ::compressBound(static_cast<uLong>(raw.size()));
  std::string z(zlen, '\0');
  const int rc =
      ::compress2(reinterpret_cast<Bytef*>(&z[0]), &zlen,
                  reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()), 9);
  require(rc == Z_OK, "png: zlib compress2 failed ({})", rc);
  z.resize(zlen);

  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_u32(ihdr, static_cast<std::uint32_t>(width));
  put_u32(ihdr, static_cast<std::uint32_t>(height));
  ihdr +=
      std::string("\x08\x02\x00\x00\x00", 5);  // 8 bit, truecolour, deflate, filter 0, no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", "");
  return out;
}

std::string render_line_plot(const std::string& title, const std::string& xlabel,
                             const std::string& ylabel, const std::vector<Series>& series,
                             int width, int height) {
  const Layout L = make_layout(title, xlabel, ylabel, series, width, height);
  const PlotFrame& f = L.f;
  const int s = L.scale, pad = L.pad, tick = 3 * s;
  const int left = static_cast<int>(f.left), right = static_cast<int>(f.right);
  const int top = static_cast<int>(f.top), bottom = static_cast<int>(f.bottom);
  Canvas c(width, height, kPlotBackground);

  // grid lines, inside the frame
  const std::vector<double> xt = ticks_of(L.ax), yt = ticks_of(L.ay);
  for (double v : xt) {
    const int x = std::min(right - 1, static_cast<int>(std::floor(f.px(v))));
    c.vline(x, top, bottom - 1, kGrid);
  }
  for (double v : yt) {
    const int y = std::min(bottom - 1, static_cast<int>(std::floor(f.py(v))));
    c.hline(left, right - 1, y, kGrid);
  }

  // the data: lines, then markers on top
  const double hw = 0.5 + 0.5 * s;       // line half-width
  const double marker = 1.5 + 1.25 * s;  // marker radius
  for (std::size_t k = 0; k < series.size(); ++k) {
    const Series& ser = series[k];
    Coverage cov(width, height);
    for (std::size_t i = 0; i + 1 < ser.x.size(); ++i) {
      if (!std::isfinite(ser.x[i]) || !std::isfinite(ser.y[i]) || !std::isfinite(ser.x[i + 1]) ||
          !std::isfinite(ser.y[i + 1]))
        continue;
      cov.segment(f.px(ser.x[i]), f.py(ser.y[i]), f.px(ser.x[i + 1]), f.py(ser.y[i + 1]), hw);
    }
    for (std::size_t i = 0; i < ser.x.size(); ++i)
      if (std::isfinite(ser.x[i]) && std::isfinite(ser.y[i]))
        cov.disc(f.px(ser.x[i]), f.py(ser.y[i]), marker);
    cov.composite(c, series_colour(k));
  }

  // frame, ticks and tick labels
  c.hline(left - 1, right, top - 1, kFrame);
  c.hline(left - 1, right, bottom, kFrame);
  c.vline(left - 1, top - 1, bottom, kFrame);
  c.vline(right, top - 1, bottom, kFrame);
  for (double v : xt) {
    const int x = std::min(right - 1, static_cast<int>(std::floor(f.px(v))));
    c.fill_rect(x, bottom + 1, x + 1, bottom + 1 + tick, kFrame);
    const std::string lab = tick_label(v, L.ax.step);
    c.text(x - text_width(lab, s) / 2, bottom + 1 + tick + pad / 2, lab, s, kInk);
  }
  for (double v : yt) {
    const int y = std::min(bottom - 1, static_cast<int>(std::floor(f.py(v))));
    c.fill_rect(left - 1 - tick, y, left - 1, y + 1, kFrame);
    const std::string lab = tick_label(v, L.ay.step);
    c.text(left - 1 - tick - pad / 2 - text_width(lab, s), y - 7 * s / 2, lab, s, kInk);
  }

  // axis labels and title
  if (!xlabel.empty())
    c.text((left + right) / 2 - text_width(xlabel, s) / 2, height - pad - text_height(s), xlabel, s,
           kInk);
  if (!ylabel.empty())
    c.text(pad, (top + bottom) / 2 + text_width(ylabel, s) / 2, ylabel, s, kInk, true);
  if (!title.empty())
    c.text((left + right) / 2 - text_width(title, s + 1) / 2, pad, title, s + 1, kInk);

  // legend: in the corner of the plot area that hides the fewest data
  std::vector<std::size_t> entries;
  int label_w = 0;
  for (std::size_t k = 0; k < series.size(); ++k)
    if (!series[k].label.empty()) {
      entries.push_back(k);
      label_w = std::max(label_w, text_width(series[k].label, s));
    }
  if (!entries.empty()) {
    const int swatch = 12 * s, row_h = 7 * s + 5 * s;
    const int bw = pad + swatch + pad + label_w + pad;
    const int bh = pad + static_cast<int>(entries.size()) * row_h - 5 * s + pad;
    const int inset = pad;
    const std::array<std::array<int, 2>, 4> corners = {{{right - inset - bw, top + inset},
                                                        {left + inset, top + inset},
                                                        {right - inset - bw, bottom - inset - bh},
                                                        {left + inset, bottom - inset - bh}}};
    std::size_t best = 0;
    long best_hits = -1;
    for (std::size_t ci = 0; ci < corners.size(); ++ci) {
      const double bx0 = corners[ci][0] - marker, by0 = corners[ci][1] - marker;
      const double bx1 = corners[ci][0] + bw + marker, by1 = corners[ci][1] + bh + marker;
      long hits = 0;
      for (const Series& ser : series)
        for (std::size_t i = 0; i < ser.x.size(); ++i) {
          if (!std::isfinite(ser.x[i]) || !std::isfinite(ser.y[i])) continue;
          const double x0 = f.px(ser.x[i]), y0 = f.py(ser.y[i]);
          double x1 = x0, y1 = y0;
          if (i + 1 < ser.x.size() && std::isfinite(ser.x[i + 1]) && std::isfinite(ser.y[i + 1])) {
            x1 = f.px(ser.x[i + 1]);
            y1 = f.py(ser.y[i + 1]);
          }
          const int n = 1 + static_cast<int>(std::hypot(x1 - x0, y1 - y0) / 2.0);
          for (int t = 0; t <= n; ++t) {
            const double x = x0 + (x1 - x0) * t / n, y = y0 + (y1 - y0) * t / n;
            hits += x >= bx0 && x < bx1 && y >= by0 && y < by1;
          }
        }
      if (best_hits < 0 || hits < best_hits) {
        best_hits = hits;
        best = ci;
      }
    }
    const int bx = corners[best][0], by = corners[best][1];
    c.fill_rect(bx, by, bx + bw, by + bh, kPlotBackground);
    c.hline(bx, bx + bw - 1, by, kLegendEdge);
    c.hline(bx, bx + bw - 1, by + bh - 1, kLegendEdge);
    c.vline(bx, by, by + bh - 1, kLegendEdge);
    c.vline(bx + bw - 1, by, by + bh - 1, kLegendEdge);
    for (std::size_t e = 0; e < entries.size(); ++e) {
      const int ty = by + pad + static_cast<int>(e) * row_h;
      const double cy = ty + 3.5 * s;
      Coverage cov(width, height);
      cov.segment(bx + pad, cy, bx + pad + swatch, cy, hw);
      cov.disc(bx + pad + swatch / 2.0, cy, marker);
      cov.composite(c, series_colour(entries[e]));
      c.text(bx + pad + swatch + pad, ty, series[entries[e]].label, s, kInk);
    }
  }
  return encode_png(width, height, c.pixels());
}

void write_line_plot(const std::string& path, const std::string& title, const std::string& xlabel,
                     const std::string& ylabel, const std::vector<Series>& series, int width,
                     int height) {
  write_file_atomically(path, render_line_plot(title, xlabel, ylabel, series, width, height));
}

}  // namespace sparsim::io
