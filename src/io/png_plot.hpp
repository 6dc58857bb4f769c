#pragma once
/// Line plots written as PNG without any plotting library: a small RGB rasterizer (antialiased
/// lines and markers, axes with "nice" ticks and grid lines, a legend, a title, text in a built-in
/// 5×7 bitmap font) and a PNG encoder on zlib (signature, IHDR, one IDAT of filter-0 scanlines,
/// IEND; CRC-32 from zlib).
///
/// Text: printable ASCII letters, digits, space and . , - + = ( ) : _ / [ ] ' | %; the UTF-8
/// combining macron (U+0304) draws a bar over the preceding glyph (so "s̄" renders as s-bar).
/// Anything else is drawn as a hollow box.
#include <cstdint>
#include <string>
#include <vector>

namespace sparsim::io {

struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb& o) const { return r == o.r && g == o.g && b == o.b; }
  bool operator!=(const Rgb& o) const { return !(*this == o); }
};

/// One line of a plot: points (x[k], y[k]) joined in order; non-finite points break the line.
struct Series {
  std::string label;
  std::vector<double> x, y;
};

/// Colour of series i (a fixed palette of 8, cycled).
Rgb series_colour(std::size_t i);
/// Background colour of the canvas and the plot area.
inline constexpr Rgb kPlotBackground{255, 255, 255};

/// Where the data go on the canvas: the plot area in pixels (left/top inclusive, right/bottom
/// exclusive edges as doubles) and the axis ranges it spans. px/py map data to pixel coordinates
/// (pixel (i, j) covers [i, i+1) × [j, j+1), its centre is (i + 0.5, j + 0.5)).
struct PlotFrame {
  int width = 0, height = 0;
  double left = 0, top = 0, right = 0, bottom = 0;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  double x_step = 0, y_step = 0;  ///< tick spacing on each axis
  double px(double x) const { return left + (x - x0) / (x1 - x0) * (right - left); }
  double py(double y) const { return bottom - (y - y0) / (y1 - y0) * (bottom - top); }
};

/// The frame render_line_plot uses for these inputs. Axis ranges are the data ranges widened to
/// whole tick steps (1, 2 or 5 × 10^k, about six ticks; whole numbers when all data on that axis
/// are whole). Throws sparsim::Error for a canvas under 160×120 or above 8192 on a side, or a
/// series whose x and y differ in length.
PlotFrame plot_frame(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                     const std::vector<Series>& series, int width = 900, int height = 560);

/// Renders the plot and returns the PNG file's bytes.
std::string render_line_plot(const std::string& title, const std::string& xlabel,
                             const std::string& ylabel, const std::vector<Series>& series,
                             int width = 900, int height = 560);

/// Renders the plot and writes it to `path` atomically (temporary file + rename).
void write_line_plot(const std::string& path, const std::string& title, const std::string& xlabel,
                     const std::string& ylabel, const std::vector<Series>& series, int width = 900,
                     int height = 560);

/// Encodes an 8-bit RGB image (row-major, 3 bytes per pixel, width·height·3 bytes) as PNG.
std::string encode_png(int width, int height, const std::vector<std::uint8_t>& rgb);

}  // namespace sparsim::io
