#include "cli/common.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "blasst/half.hpp"

namespace blasst::cli {

Progress::Progress() : enabled_(::isatty(STDERR_FILENO) == 1) {}
Progress::~Progress() { clear(); }

void Progress::update(const std::string& msg) {
  if (!enabled_) return;
  std::fprintf(stderr, "\r\x1b[K%s", msg.c_str());
  std::fflush(stderr);
  dirty_ = true;
}

void Progress::clear() {
  if (!enabled_ || !dirty_) return;
  std::fprintf(stderr, "\r\x1b[K");
  std::fflush(stderr);
  dirty_ = false;
}

std::int64_t HostBuffer::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Tensor HostBuffer::tensor(DeviceKind dev) {
  Tensor t;
  t.data = bytes.data();
  t.dtype = dtype;
  t.device = dev;
  t.rank = static_cast<int>(shape.size());
  if (t.rank < 1 || t.rank > 4) throw Error("internal: tensor rank must be 1..4");
  std::int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[i] = shape[static_cast<std::size_t>(i)];
    t.stride[i] = stride;
    stride *= t.shape[i];
  }
  return t;
}

static std::size_t size_of(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16:
    case DType::bf16: return 2;
  }
  return 4;
}

HostBuffer make_buffer(DType t, const std::vector<std::int64_t>& shape) {
  HostBuffer b;
  b.dtype = t;
  b.shape = shape;
  b.bytes.assign(static_cast<std::size_t>(b.numel()) * size_of(t), 0);
  return b;
}

HostBuffer from_floats(const std::vector<float>& x, const std::vector<std::int64_t>& shape, DType t) {
  HostBuffer b = make_buffer(t, shape);
  if (static_cast<std::size_t>(b.numel()) != x.size()) throw Error("internal: from_floats size mismatch");
  const std::size_t n = x.size();
  switch (t) {
    case DType::f32: std::memcpy(b.bytes.data(), x.data(), n * 4); break;
    case DType::f64: {
      auto* p = reinterpret_cast<double*>(b.bytes.data());
      for (std::size_t i = 0; i < n; ++i) p[i] = x[i];
      break;
    }
    case DType::f16: {
      auto* p = reinterpret_cast<std::uint16_t*>(b.bytes.data());
      for (std::size_t i = 0; i < n; ++i) p[i] = float_to_f16(x[i]);
      break;
    }
    case DType::bf16: {
      auto* p = reinterpret_cast<std::uint16_t*>(b.bytes.data());
      for (std::size_t i = 0; i < n; ++i) p[i] = float_to_bf16(x[i]);
      break;
    }
  }
  return b;
}

std::vector<float> to_floats(const HostBuffer& b) {
  const auto n = static_cast<std::size_t>(b.numel());
  std::vector<float> x(n);
  switch (b.dtype) {
    case DType::f32: std::memcpy(x.data(), b.bytes.data(), n * 4); break;
    case DType::f64: {
      const auto* p = reinterpret_cast<const double*>(b.bytes.data());
      for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(p[i]);
      break;
    }
    case DType::f16: {
      const auto* p = reinterpret_cast<const std::uint16_t*>(b.bytes.data());
      for (std::size_t i = 0; i < n; ++i) x[i] = f16_to_float(p[i]);
      break;
    }
    case DType::bf16: {
      const auto* p = reinterpret_cast<const std::uint16_t*>(b.bytes.data());
      for (std::size_t i = 0; i < n; ++i) x[i] = bf16_to_float(p[i]);
      break;
    }
  }
  return x;
}

void poison(HostBuffer& b) {
  // 0xff bytes are NaN in every floating-point format.
  std::fill(b.bytes.begin(), b.bytes.end(), static_cast<unsigned char>(0xff));
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  if (a.size() != ref.size()) throw Error("internal: rel_l2 size mismatch");
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

namespace {
// lambda must stay in (0, 1): ln(lambda) in [kMinLn, kMaxLn].
constexpr double kMinLn = -700.0;           // exp() stays a normal double
constexpr double kMaxLn = -1e-9;            // just below ln(1) = 0
}  // namespace

CurvePoint lambda_for_target(std::vector<float> deltas, double target) {
  if (!(target >= 0 && target <= 1)) throw Error("target sparsity must lie in [0, 1]");
  CurvePoint out;
  const std::size_t n = deltas.size();
  if (n == 0) {
    out.ln_lambda = std::log(0.5);
    out.sparsity = 0;
    out.reachable = target == 0;
    return out;
  }
  std::sort(deltas.begin(), deltas.end());
  auto count_below = [&](double x) {
    return static_cast<std::size_t>(
        std::lower_bound(deltas.begin(), deltas.end(), x,
                         [](float d, double v) { return static_cast<double>(d) < v; }) -
        deltas.begin());
  };
  // A threshold between two distinct recorded deltas skips exactly the ones below it: candidate
  // thresholds are the midpoints around the wanted count k = round(target * n).
  const auto k = static_cast<std::size_t>(std::llround(target * static_cast<double>(n)));
  auto threshold_for = [&](std::size_t cnt) -> double {  // skips the `cnt` smallest (ties grow it)
    if (cnt == 0) return static_cast<double>(deltas[0]) - 1.0;
    const double lo = deltas[cnt - 1];
    auto it = std::upper_bound(deltas.begin(), deltas.end(), deltas[cnt - 1]);
    if (it == deltas.end() || std::isinf(*it)) return lo + 1.0;
    return 0.5 * (lo + static_cast<double>(*it));
  };
  double ln = threshold_for(k);
  // With ties the count overshoots; the threshold just below the tie block may be closer.
  const std::size_t over = count_below(ln);
  if (over != k && k > 0) {
    const std::size_t under_cnt = static_cast<std::size_t>(
        std::lower_bound(deltas.begin(), deltas.end(), deltas[k - 1]) - deltas.begin());
    const double ln_under = threshold_for(under_cnt);
    if (k - under_cnt < over - k) ln = ln_under;
  }
  if (!std::isfinite(ln)) ln = kMaxLn;  // all deltas +inf (first tiles only)
  if (ln > kMaxLn) {
    out.reachable = false;
    ln = kMaxLn;
  }
  ln = std::max(ln, kMinLn);
  out.ln_lambda = ln;
  out.sparsity = static_cast<double>(count_below(ln)) / static_cast<double>(n);
  if (std::abs(out.sparsity - target) > 1.0 / static_cast<double>(n) + 1e-12 && out.sparsity < target)
    out.reachable = false;
  return out;
}

CurvePoint lambda_for_target(const DeltaHistogram& h, double target) {
  if (!(target >= 0 && target <= 1)) throw Error("target sparsity must lie in [0, 1]");
  CurvePoint out;
  double lam = h.lambda_for(target);
  if (!(lam < 1.0)) {
    out.reachable = false;
    lam = std::exp(kMaxLn);
  }
  lam = std::max(lam, std::exp(kMinLn));
  out.ln_lambda = std::log(lam);
  out.sparsity = h.sparsity_at(lam);
  return out;
}

nlohmann::json granularity_json(const VoteGranularity& g) {
  return {{"tile_keys", g.tile_keys}, {"rows", g.rows}, {"heads", g.heads},
          {"split_tiles", g.split_tiles}, {"order", to_string(g.order)}};
}

nlohmann::json stats_json(const SkipStats& s) {
  nlohmann::json j;
  j["counted_at"] = s.counted_at;
  j["granularity"] = granularity_json(s.granularity);
  j["visited"] = s.visited;
  j["skipped"] = s.skipped;
  std::vector<double> per_head;
  for (std::size_t h = 0; h < s.visited.size(); ++h)
    per_head.push_back(s.visited[h] ? static_cast<double>(s.skipped[h]) / static_cast<double>(s.visited[h]) : 0.0);
  j["sparsity_per_head"] = per_head;
  j["per_head_counts"] = s.granularity.heads == 1 ? "query heads" : "KV heads";
  j["total_visited"] = s.total_visited();
  j["total_skipped"] = s.total_skipped();
  if (!s.screened.empty()) {  // SPEC §2b: with a screen (screen_wrong is empty for the CUDA screen ahead)
    j["screened"] = s.screened;
    j["screen_wrong"] = s.screen_wrong;
    j["total_screened"] = s.total_screened();
    j["total_screen_wrong"] = s.total_screen_wrong();
  }
  j["sparsity"] = s.sparsity();
  // JSON has no infinity: a sequence without keys (lambda = inf) is written as null.
  nlohmann::json lam = nlohmann::json::array();
  nlohmann::json dense_seqs = nlohmann::json::array();
  for (std::size_t b = 0; b < s.lambda.size(); ++b) {
    if (std::isfinite(s.lambda[b])) lam.push_back(s.lambda[b]); else lam.push_back(nullptr);
    if (!(s.lambda[b] < 1.0)) dense_seqs.push_back(b);
  }
  j["lambda"] = lam;
  j["dense_sequences"] = dense_seqs;
  return j;
}

}  // namespace blasst::cli
