// SPEC §5: one-pass sparsity curves and their inverse.
#include <algorithm>
#include <cmath>
#include <limits>

#include "blasst/calibration.hpp"

namespace blasst::calibration {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

// Bin edge i (i = 0..kBins) of DeltaHistogram, in ln(lambda) units.
double edge(int i) { return DeltaHistogram::kLo + i * DeltaHistogram::kWidth; }

// Our own binning (the histogram layout of SPEC §5 as declared in blasst.hpp): index in counts.
// Kept local so the curve does not depend on how another module rounds; checked against
// DeltaHistogram::bin_of in the tests.
int bin_index(double d) {
  if (std::isnan(d) || d >= 0.0) return DeltaHistogram::kBins + 1;
  if (d < DeltaHistogram::kLo) return 0;
  int i = static_cast<int>(std::floor((d - DeltaHistogram::kLo) / DeltaHistogram::kWidth));
  return 1 + std::clamp(i, 0, DeltaHistogram::kBins - 1);
}
}  // namespace

bool same_granularity(const VoteGranularity& a, const VoteGranularity& b) {
  return a.tile_keys == b.tile_keys && a.rows == b.rows && a.heads == b.heads &&
         a.split_tiles == b.split_tiles && a.order == b.order;
}

// Built with std::string and std::to_string, not an ostringstream: this text reaches Python error
// messages, and a Python extension linked against a static libstdc++ (some toolchains' default)
// inside a process that already loaded the shared one crashed in ostream's number formatting
// (the H200 machine's /opt/gcc, 2026-12-02). The same holds for every message on the Python path.
std::string describe(const VoteGranularity& g) {
  std::string s = std::to_string(g.rows) + (g.rows == 1 ? " row x " : " rows x ") + std::to_string(g.heads) +
                  (g.heads == 1 ? " head, " : " heads, ") + std::to_string(g.tile_keys) + "-key tiles, " +
                  to_string(g.order) + " order, ";
  s += g.split_tiles > 0 ? "split every " + std::to_string(g.split_tiles) + " tiles" : std::string("unsplit");
  return s;
}

SparsityCurve SparsityCurve::from_deltas(std::vector<float> deltas, const VoteGranularity& g) {
  for (float d : deltas)
    if (std::isnan(d)) throw Error("calibration: deltas: NaN delta in the recorded curve");
  SparsityCurve c;
  c.g_ = g;
  c.exact_ = true;
  std::sort(deltas.begin(), deltas.end());
  c.sorted_ = std::move(deltas);
  return c;
}

SparsityCurve SparsityCurve::from_histogram(const DeltaHistogram& h, const VoteGranularity& g) {
  if (h.counts.size() != static_cast<std::size_t>(DeltaHistogram::kBins + 2))
    throw Error("calibration: histogram: expected " + std::to_string(DeltaHistogram::kBins + 2) +
                " counts, got " + std::to_string(h.counts.size()));
  SparsityCurve c;
  c.g_ = g;
  c.exact_ = false;
  c.hist_ = h;
  c.rebuild_cumulative();
  return c;
}

void SparsityCurve::rebuild_cumulative() {
  // cum_[i] = #{delta < edge(i)}, i = 0..kBins: the underflow bin plus regular bins below i.
  cum_.assign(DeltaHistogram::kBins + 1, 0);
  std::uint64_t run = hist_.counts[0];
  for (int i = 0; i <= DeltaHistogram::kBins; ++i) {
    cum_[i] = run;
    if (i < DeltaHistogram::kBins) run += hist_.counts[1 + i];
  }
}

std::uint64_t SparsityCurve::visited() const {
  if (exact_) return sorted_.size();
  std::uint64_t t = 0;
  for (auto c : hist_.counts) t += c;
  return t;
}

double SparsityCurve::sparsity_at_log(double x) const {
  if (std::isnan(x)) throw Error("calibration: sparsity_at: ln(lambda) is NaN");
  const std::uint64_t n = visited();
  if (n == 0) return 0.0;
  if (exact_) {
    // #{delta < x}
    auto it = std::lower_bound(sorted_.begin(), sorted_.end(), x,
                               [](float d, double v) { return static_cast<double>(d) < v; });
    return static_cast<double>(it - sorted_.begin()) / static_cast<double>(n);
  }
  const double lo = DeltaHistogram::kLo;
  double below;
  if (x <= lo) {
    // Underflow bin: only its total is known; exact at x = kLo, unknown below (report 0 there
    // unless everything is below, which is conservative: never over-promises sparsity).
    below = (x == lo) ? static_cast<double>(cum_[0]) : 0.0;
  } else if (x >= 0.0) {
    below = static_cast<double>(cum_[DeltaHistogram::kBins]);
  } else {
    const double pos = (x - lo) / DeltaHistogram::kWidth;
    int i = static_cast<int>(std::floor(pos));
    i = std::clamp(i, 0, DeltaHistogram::kBins - 1);
    const double frac = pos - i;
    below = static_cast<double>(cum_[i]) + frac * static_cast<double>(hist_.counts[1 + i]);
  }
  return below / static_cast<double>(n);
}

double SparsityCurve::sparsity_at(double lambda) const {
  if (!(lambda > 0.0) || std::isnan(lambda))
    throw Error("calibration: sparsity_at: lambda must be > 0, got " + std::to_string(lambda));
  if (lambda >= 1.0) return 0.0;  // SPEC §3: lambda >= 1 runs dense
  return sparsity_at_log(std::log(lambda));
}

double SparsityCurve::max_sparsity() const {
  const std::uint64_t n = visited();
  if (n == 0) return 0.0;
  if (exact_) return sparsity_at_log(0.0);
  return static_cast<double>(cum_[DeltaHistogram::kBins]) / static_cast<double>(n);
}

void SparsityCurve::merge(const SparsityCurve& o) {
  if (o.visited() == 0) return;
  if (visited() == 0) {
    // An empty curve takes the other's identity, granularity included.
    *this = o;
    return;
  }
  if (!same_granularity(g_, o.g_))
    throw Error("calibration: cannot combine curves counted at different vote granularities: " +
                describe(g_) + " vs " + describe(o.g_));
  if (exact_ && o.exact_) {
    std::vector<float> out;
    out.reserve(sorted_.size() + o.sorted_.size());
    std::merge(sorted_.begin(), sorted_.end(), o.sorted_.begin(), o.sorted_.end(),
               std::back_inserter(out));
    sorted_ = std::move(out);
    return;
  }
  auto to_hist = [](const SparsityCurve& c) {
    if (!c.exact_) return c.hist_;
    DeltaHistogram h;
    for (float d : c.sorted_) ++h.counts[static_cast<std::size_t>(bin_index(d))];
    return h;
  };
  DeltaHistogram a = to_hist(*this);
  const DeltaHistogram b = to_hist(o);
  for (std::size_t i = 0; i < a.counts.size(); ++i) a.counts[i] += b.counts[i];
  exact_ = false;
  sorted_.clear();
  sorted_.shrink_to_fit();
  hist_ = std::move(a);
  rebuild_cumulative();
}

double lambda_for_sparsity(const SparsityCurve& c, double s) {
  if (!(s >= 0.0 && s <= 1.0))
    throw Error("calibration: lambda_for_sparsity: target sparsity must be in [0, 1], got " +
                std::to_string(s));
  const std::uint64_t n = c.visited();
  if (n == 0) throw Error("calibration: lambda_for_sparsity: the curve is empty");
  if (s > c.max_sparsity()) return kInf;
  // k = ceil(s * n) pairs must be skipped; guard the product against rounding up past an
  // integer (0.3 * 10 = 3.0000000000000004).
  const double want = s * static_cast<double>(n);
  std::uint64_t k = static_cast<std::uint64_t>(std::ceil(want - 1e-9 * std::max(1.0, want)));
  if (c.exact()) {
    const auto& d = c.sorted_deltas();
    if (k == 0) {
      // Below every delta: skip nothing.
      const double lo = std::min(static_cast<double>(d.front()), 0.0);
      return std::exp(lo - 1.0);
    }
    const double below = d[k - 1];
    const double above = (k < n) ? static_cast<double>(d[k]) : 0.0;
    double x = 0.5 * (below + std::min(above, 0.0));
    if (!(x > below)) {
      // Ties at the k-th value (or below == above): the smallest x that skips the k-th pair
      // skips all its ties too; nextafter keeps "delta < x" true for the k-th.
      x = std::nextafter(below, kInf);
    }
    if (x >= 0.0) return kInf;  // only lambda >= 1 would do
    return std::exp(x);
  }
  // Histogram: smallest edge with cum >= k (exact at that edge).
  const DeltaHistogram& h = c.histogram();
  std::uint64_t run = h.counts[0];
  if (run >= k) return std::exp(edge(0));
  for (int i = 0; i < DeltaHistogram::kBins; ++i) {
    run += h.counts[1 + i];
    if (run >= k) {
      const double e = edge(i + 1);
      return e >= 0.0 ? kInf : std::exp(e);
    }
  }
  return kInf;
}

SparsityCurve combine(const std::vector<SparsityCurve>& curves) {
  if (curves.empty()) throw Error("calibration: combine: no curves");
  SparsityCurve out = curves.front();
  for (std::size_t i = 1; i < curves.size(); ++i) {
    if (!same_granularity(out.granularity(), curves[i].granularity()))
      throw Error("calibration: combine: curve " + std::to_string(i) +
                  " was counted at a different vote granularity (" +
                  describe(curves[i].granularity()) + ") than curve 0 (" +
                  describe(out.granularity()) + ")");
    out.merge(curves[i]);
  }
  return out;
}

StatsCurves curves_from_stats(const SkipStats& st) {
  StatsCurves r;
  for (const auto& h : st.hist) r.per_head.push_back(SparsityCurve::from_histogram(h, st.granularity));
  if (!st.deltas.empty()) {
    const auto tv = st.total_visited();
    if (static_cast<std::int64_t>(st.deltas.size()) != tv)
      throw Error("calibration: stats: " + std::to_string(st.deltas.size()) +
                  " recorded deltas but " + std::to_string(tv) + " visited pairs");
    r.layer = SparsityCurve::from_deltas(st.deltas, st.granularity);
  } else if (!r.per_head.empty()) {
    r.layer = combine(r.per_head);
  } else {
    throw Error("calibration: stats carry neither deltas (RunOptions::record_deltas) nor "
                "histograms (RunOptions::collect_histogram)");
  }
  return r;
}

}  // namespace blasst::calibration
