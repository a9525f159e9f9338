// Minimal raster line plots for the calibration report; PNG encoding through libpng when found.
#include "calibration/plot.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

#include "blasst/blasst.hpp"

#ifdef BLASST_HAVE_PNG
#include <png.h>
#endif

namespace blasst::calibration::plot {

namespace {
using Glyph = std::array<const char*, 7>;
const std::map<char, Glyph>& font() {
  static const std::map<char, Glyph> f = {
#include "calibration/font5x7.inc"
  };
  return f;
}
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

bool has_glyph(char c) {
  return c == ' ' || font().count(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
}

Canvas::Canvas(int w, int h, Rgb bg) : w_(w), h_(h), px_(static_cast<std::size_t>(w) * h * 3) {
  if (w < 1 || h < 1) throw Error("plot: canvas size must be positive");
  for (std::size_t i = 0; i < px_.size(); i += 3) {
    px_[i] = bg.r;
    px_[i + 1] = bg.g;
    px_[i + 2] = bg.b;
  }
}

void Canvas::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
  auto* p = &px_[(static_cast<std::size_t>(y) * w_ + x) * 3];
  p[0] = c.r;
  p[1] = c.g;
  p[2] = c.b;
}

Rgb Canvas::get(int x, int y) const {
  if (x < 0 || y < 0 || x >= w_ || y >= h_) return {};
  const auto* p = &px_[(static_cast<std::size_t>(y) * w_ + x) * 3];
  return {p[0], p[1], p[2]};
}

void Canvas::dot(int x, int y, Rgb c, int t) {
  const int lo = -(t - 1) / 2, hi = t / 2;
  for (int dy = lo; dy <= hi; ++dy)
    for (int dx = lo; dx <= hi; ++dx) set(x + dx, y + dy, c);
}

void Canvas::line(double x0, double y0, double x1, double y1, Rgb c, int thickness, int dash) {
  if (!std::isfinite(x0) || !std::isfinite(y0) || !std::isfinite(x1) || !std::isfinite(y1)) return;
  const double len = std::max(std::abs(x1 - x0), std::abs(y1 - y0));
  const int steps = std::max(1, static_cast<int>(std::ceil(len)));
  if (steps > 100000) return;  // far off-canvas: not drawn
  for (int i = 0; i <= steps; ++i) {
    if (dash > 0 && (i / dash) % 2 == 1) continue;
    const double t = static_cast<double>(i) / steps;
    dot(static_cast<int>(std::lround(x0 + t * (x1 - x0))),
        static_cast<int>(std::lround(y0 + t * (y1 - y0))), c, thickness);
  }
}

void Canvas::rect(int x0, int y0, int x1, int y1, Rgb c) {
  line(x0, y0, x1, y0, c);
  line(x1, y0, x1, y1, c);
  line(x1, y1, x0, y1, c);
  line(x0, y1, x0, y0, c);
}

void Canvas::fill(int x0, int y0, int x1, int y1, Rgb c) {
  for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y)
    for (int x = std::min(x0, x1); x <= std::max(x0, x1); ++x) set(x, y, c);
}

int Canvas::text(int x, int y, const std::string& s, Rgb c, int scale) {
  int cx = x;
  for (char ch : s) {
    auto it = font().find(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
    if (it != font().end())
      for (int r = 0; r < 7; ++r)
        for (int k = 0; k < 5; ++k)
          if (it->second[r][k] == '#')
            fill(cx + k * scale, y + r * scale, cx + k * scale + scale - 1,
                 y + r * scale + scale - 1, c);
    cx += 6 * scale;
  }
  return cx - x;
}

int Canvas::text_vertical(int x, int y, const std::string& s, Rgb c, int scale) {
  // Rotated 90 degrees counter-clockwise: the string reads upwards from (x, y).
  int cy = y;
  for (char ch : s) {
    auto it = font().find(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
    if (it != font().end())
      for (int r = 0; r < 7; ++r)
        for (int k = 0; k < 5; ++k)
          if (it->second[r][k] == '#')
            fill(x + r * scale, cy - k * scale - scale + 1, x + r * scale + scale - 1,
                 cy - k * scale, c);
    cy -= 6 * scale;
  }
  return y - cy;
}

Rgb palette(std::size_t i) {
  static const Rgb p[] = {{31, 119, 180}, {214, 39, 40},  {44, 160, 44},  {255, 127, 14},
                          {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {23, 190, 207},
                          {188, 189, 34},  {80, 80, 80}};
  return p[i % (sizeof(p) / sizeof(p[0]))];
}

Figure::Figure() : xmin(kNaN), xmax(kNaN), ymin(kNaN), ymax(kNaN) {}

namespace {
std::string tick_label(double v) {
  std::ostringstream o;
  if (v != 0.0 && (std::abs(v) < 1e-3 || std::abs(v) >= 1e5)) {
    o.precision(0);
    o << std::scientific << v;  // "1e-04"
  } else {
    o << std::round(v * 1e6) / 1e6;
  }
  return o.str();
}

std::vector<double> linear_ticks(double lo, double hi) {
  const double span = hi - lo;
  if (!(span > 0)) return {lo};
  const double raw = span / 6.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + 1e-9 * step; v += step)
    t.push_back(std::abs(v) < 1e-12 * step ? 0.0 : v);
  return t;
}
}  // namespace

Canvas render(const Figure& f, int width, int height) {
  Canvas cv(width, height);
  const int left = 78, right = 20, top = 34, bottom = 56;
  const int x0 = left, x1 = width - right, y0 = top, y1 = height - bottom;
  auto tx = [&](double v) { return f.log_x ? std::log10(v) : v; };

  double xmin = f.xmin, xmax = f.xmax, ymin = f.ymin, ymax = f.ymax;
  double dxmin = std::numeric_limits<double>::infinity(), dxmax = -dxmin, dymin = dxmin, dymax = -dxmin;
  for (const auto& s : f.series)
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (f.log_x && !(s.x[i] > 0))) continue;
      dxmin = std::min(dxmin, tx(s.x[i]));
      dxmax = std::max(dxmax, tx(s.x[i]));
      dymin = std::min(dymin, s.y[i]);
      dymax = std::max(dymax, s.y[i]);
    }
  xmin = std::isnan(xmin) ? dxmin : tx(xmin);
  xmax = std::isnan(xmax) ? dxmax : tx(xmax);
  if (std::isnan(ymin)) ymin = dymin;
  if (std::isnan(ymax)) ymax = dymax;
  if (!std::isfinite(xmin) || !std::isfinite(xmax)) xmin = 0, xmax = 1;
  if (!std::isfinite(ymin) || !std::isfinite(ymax)) ymin = 0, ymax = 1;
  if (xmax <= xmin) xmax = xmin + 1;
  if (ymax <= ymin) ymax = ymin + 1;

  auto px = [&](double v) { return x0 + (tx(v) - xmin) / (xmax - xmin) * (x1 - x0); };
  auto py = [&](double v) { return y1 - (v - ymin) / (ymax - ymin) * (y1 - y0); };

  const Rgb black{0, 0, 0}, grid{225, 225, 225};
  // Grid and ticks.
  std::vector<std::pair<double, std::string>> xt;
  if (f.log_x) {
    for (int e = static_cast<int>(std::ceil(xmin - 1e-9)); e <= std::floor(xmax + 1e-9); ++e)
      xt.push_back({std::pow(10.0, e), "1E" + std::to_string(e)});
  } else {
    for (double v : linear_ticks(xmin, xmax)) xt.push_back({v, tick_label(v)});
  }
  for (const auto& [v, lab] : xt) {
    const double x = px(v);
    cv.line(x, y0, x, y1, grid);
    cv.line(x, y1, x, y1 + 5, black);
    cv.text(static_cast<int>(x) - Canvas::text_width(lab) / 2, y1 + 9, lab, black);
  }
  for (double v : linear_ticks(ymin, ymax)) {
    const double y = py(v);
    cv.line(x0, y, x1, y, grid);
    cv.line(x0 - 5, y, x0, y, black);
    const std::string lab = tick_label(v);
    cv.text(x0 - 8 - Canvas::text_width(lab), static_cast<int>(y) - 3, lab, black);
  }
  // Series, clipped to the plot area by drawing only segments with both ends inside.
  for (const auto& s : f.series) {
    const int thick = s.dashed ? 1 : 2;
    bool have = false;
    double lx = 0, ly = 0;
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      const bool ok = std::isfinite(s.x[i]) && std::isfinite(s.y[i]) && (!f.log_x || s.x[i] > 0);
      if (!ok) {
        have = false;
        continue;
      }
      double X = px(s.x[i]), Y = py(s.y[i]);
      const bool inside = X >= x0 - 0.5 && X <= x1 + 0.5 && Y >= y0 - 0.5 && Y <= y1 + 0.5;
      if (have && inside) cv.line(lx, ly, X, Y, s.color, thick, s.dashed ? 6 : 0);
      if (inside && s.x.size() <= 16) cv.fill(int(X) - 2, int(Y) - 2, int(X) + 2, int(Y) + 2, s.color);
      have = inside;
      lx = X;
      ly = Y;
    }
  }
  cv.rect(x0, y0, x1, y1, black);
  // Labels.
  cv.text((width - Canvas::text_width(f.title, 2)) / 2, 8, f.title, black, 2);
  cv.text((x0 + x1 - Canvas::text_width(f.xlabel)) / 2, height - 18, f.xlabel, black);
  cv.text_vertical(10, (y0 + y1 + Canvas::text_width(f.ylabel)) / 2, f.ylabel, black);
  // Legend, top-left inside the plot.
  int ly = y0 + 8;
  for (const auto& s : f.series) {
    if (s.label.empty()) continue;
    cv.fill(x0 + 8, ly, x0 + 8 + Canvas::text_width(s.label) + 30, ly + 10, {255, 255, 255});
    cv.line(x0 + 10, ly + 4, x0 + 30, ly + 4, s.color, 2, s.dashed ? 4 : 0);
    cv.text(x0 + 36, ly + 1, s.label, black);
    ly += 13;
  }
  return cv;
}

bool png_available() {
#ifdef BLASST_HAVE_PNG
  return true;
#else
  return false;
#endif
}

void write_png(const std::string& path, const Canvas& c) {
#ifdef BLASST_HAVE_PNG
  std::FILE* fp = std::fopen(path.c_str(), "wb");
  if (!fp) throw Error("plot: cannot open " + path + " for writing");
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    if (png) png_destroy_write_struct(&png, nullptr);
    std::fclose(fp);
    throw Error("plot: libpng could not be initialised for " + path);
  }
  // libpng reports errors by longjmp; nothing with a destructor lives in this frame below.
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(fp);
    throw Error("plot: libpng failed writing " + path);
  }
  png_init_io(png, fp);
  png_set_IHDR(png, info, static_cast<png_uint_32>(c.width()), static_cast<png_uint_32>(c.height()),
               8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const auto& px = c.pixels();
  for (int y = 0; y < c.height(); ++y)
    png_write_row(png, const_cast<png_bytep>(&px[static_cast<std::size_t>(y) * c.width() * 3]));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  if (std::fclose(fp) != 0) throw Error("plot: error closing " + path);
#else
  (void)c;
  throw Error("plot: built without libpng; cannot write " + path);
#endif
}

}  // namespace blasst::calibration::plot
