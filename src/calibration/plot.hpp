// Internal: minimal line plots drawn onto an RGB buffer and written as PNG (libpng), so the
// calibration report needs no plotting runtime. Text uses a built-in 5x7 font (upper case,
// digits, a few symbols; lower case is drawn as upper case).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace blasst::calibration::plot {

struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
};

class Canvas {
 public:
  Canvas(int w, int h, Rgb bg = {255, 255, 255});
  int width() const { return w_; }
  int height() const { return h_; }
  void set(int x, int y, Rgb c);
  Rgb get(int x, int y) const;
  // Line of the given thickness; dash > 0 draws dash pixels on, dash off.
  void line(double x0, double y0, double x1, double y1, Rgb c, int thickness = 1, int dash = 0);
  void rect(int x0, int y0, int x1, int y1, Rgb c);  // outline
  void fill(int x0, int y0, int x1, int y1, Rgb c);
  // Text with its top-left corner at (x, y); scale multiplies the 5x7 cell. Returns the width.
  int text(int x, int y, const std::string& s, Rgb c, int scale = 1);
  int text_vertical(int x, int y, const std::string& s, Rgb c, int scale = 1);  // bottom to top
  static int text_width(const std::string& s, int scale = 1) {
    return static_cast<int>(s.size()) * 6 * scale;
  }
  const std::vector<std::uint8_t>& pixels() const { return px_; }

 private:
  int w_, h_;
  std::vector<std::uint8_t> px_;
  void dot(int x, int y, Rgb c, int thickness);
};

// True when a glyph exists for c (after upper-casing).
bool has_glyph(char c);

struct Series {
  std::vector<double> x, y;
  Rgb color;
  bool dashed = false;
  std::string label;  // legend entry ("" = none)
};

struct Figure {
  std::string title, xlabel, ylabel;
  bool log_x = false;
  // Axis ranges; NaN = from the data.
  double xmin, xmax, ymin, ymax;
  std::vector<Series> series;
  Figure();
};

Canvas render(const Figure& f, int width = 800, int height = 560);

// A distinct colour per index (cycles).
Rgb palette(std::size_t i);

// Writes an 8-bit RGB PNG. Throws Error when built without libpng or on I/O failure.
void write_png(const std::string& path, const Canvas& c);
bool png_available();

}  // namespace blasst::calibration::plot
