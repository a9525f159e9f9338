// Measuring one-pass curves through the public entry points (reference or GPU kernels).
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "blasst/calibration.hpp"
#include "blasst/half.hpp"
#include "core/kernel_geometry.hpp"

namespace blasst::calibration {

SkipConfig probe_config(const VoteGranularity& vote) {
  // Skipping on, so the run uses (and reports) the vote granularity, at a lambda no delta can
  // fall below in practice (ln = -708): the dense trajectory, with every delta recorded.
  SkipConfig c;
  c.enabled = true;
  c.threshold = std::numeric_limits<double>::min();
  c.vote = vote;
  return c;
}

// The kernels' own vote geometry (src/core/kernel_geometry.hpp), so that a curve is counted at
// the granularity the kernels skip at.
VoteGranularity default_prefill_granularity(VisitOrder order) { return detail::prefill_vote_granularity(order); }

VoteGranularity default_decode_granularity(std::int64_t group, std::int64_t split_tiles,
                                           VisitOrder order, int q_len) {
  if (group < 1) throw Error("calibration: decode granularity: group (Hq / Hk) must be >= 1");
  if (q_len < 1) throw Error("calibration: decode granularity: q_len must be >= 1");
  if (split_tiles < 0) throw Error("calibration: decode granularity: split_tiles must be >= 0");
  return detail::decode_vote_granularity(group, q_len, split_tiles, order);
}

StatsCurves measure_with(const StatsRunner& run, const VoteGranularity& vote,
                         const MeasureOptions& opt) {
  if (!run) throw Error("calibration: measure_with: empty runner");
  RunOptions ro;
  ro.collect_stats = true;
  ro.collect_histogram = true;
  // Exact delta lists exist only in the reference; the kernels report histograms.
  ro.record_deltas = opt.exact && opt.device == DeviceKind::cpu;
  ro.num_threads = opt.num_threads;
  ro.device = opt.device;
  SkipStats st = run(probe_config(vote), ro);
  if (st.total_skipped() != 0)
    throw Error("calibration: the dense probe skipped " + std::to_string(st.total_skipped()) +
                " tiles; the curve would not follow the dense trajectory");
  return curves_from_stats(st);
}

namespace {
// The GPU kernels take f16/bf16 inputs: calibrate on what they will see (bf16-rounded values).
struct Staged {
  std::vector<std::uint16_t> q, k, v;
};
Staged to_bf16(const float* q, std::int64_t nq, const float* k, const float* v, std::int64_t nk) {
  Staged s;
  s.q.resize(static_cast<std::size_t>(nq));
  s.k.resize(static_cast<std::size_t>(nk));
  s.v.resize(static_cast<std::size_t>(nk));
  for (std::int64_t i = 0; i < nq; ++i) s.q[i] = float_to_bf16(q[i]);
  for (std::int64_t i = 0; i < nk; ++i) {
    s.k[i] = float_to_bf16(k[i]);
    s.v[i] = float_to_bf16(v[i]);
  }
  return s;
}

void check_input(const PrefillInput& in, const char* what) {
  const std::string w = what;
  if (!in.q || !in.k || !in.v) throw Error("calibration: " + w + ": q, k and v must be given");
  if (in.length < 1) throw Error("calibration: " + w + ": length must be >= 1");
  if (in.heads_q < 1 || in.heads_k < 1 || in.head_dim < 1)
    throw Error("calibration: " + w + ": heads_q, heads_k and head_dim must be >= 1");
  if (in.heads_q % in.heads_k != 0)
    throw Error("calibration: " + w + ": heads_q must be a multiple of heads_k");
}
}  // namespace

StatsCurves measure_prefill(const PrefillInput& in, const VoteGranularity& vote,
                            const MeasureOptions& opt) {
  check_input(in, "measure_prefill");
  const std::int64_t L = in.length, hq = in.heads_q, hk = in.heads_k, d = in.head_dim;
  std::vector<float> out(static_cast<std::size_t>(L * hq * d));
  AttentionProblem p;
  Staged staged;
  if (opt.device == DeviceKind::cuda) {
    staged = to_bf16(in.q, L * hq * d, in.k, in.v, L * hk * d);
    p.q = Tensor::contiguous(staged.q.data(), DType::bf16, {1, L, hq, d});
    p.k = Tensor::contiguous(staged.k.data(), DType::bf16, {1, L, hk, d});
    p.v = Tensor::contiguous(staged.v.data(), DType::bf16, {1, L, hk, d});
  } else {
    // The inputs are only read; the Tensor view is non-const by design of the API.
    p.q = Tensor::contiguous(const_cast<float*>(in.q), DType::f32, {1, L, hq, d});
    p.k = Tensor::contiguous(const_cast<float*>(in.k), DType::f32, {1, L, hk, d});
    p.v = Tensor::contiguous(const_cast<float*>(in.v), DType::f32, {1, L, hk, d});
  }
  p.out = Tensor::contiguous(out.data(), DType::f32, {1, L, hq, d});
  p.mask = in.mask;
  return measure_with(
      [&](const SkipConfig& probe, const RunOptions& ro) {
        SkipStats st;
        attention(p, probe, ro, &st);
        return st;
      },
      vote, opt);
}

StatsCurves measure_decode(const DecodeInput& in, const VoteGranularity& vote,
                           const MeasureOptions& opt) {
  const PrefillInput& s = in.seq;
  check_input(s, "measure_decode");
  const std::int64_t L = s.length, hq = s.heads_q, hk = s.heads_k, d = s.head_dim;
  const std::int64_t B = in.queries, Q = in.q_len;
  if (Q < 1 || Q > 8)
    throw Error("calibration: measure_decode: q_len must be in [1, 8], got " + std::to_string(Q));
  if (B < 1 || B + Q - 1 > L)
    throw Error("calibration: measure_decode: queries must be in [1, length - q_len + 1], got " +
                std::to_string(B));
  // The cache is the sequence's K/V seen as pages; every step shares them (no copy). Page size:
  // the largest power of two <= 128 dividing L.
  std::int64_t page = 128;
  while (L % page != 0) page /= 2;
  const std::int64_t pages = L / page;
  std::vector<std::int32_t> table(static_cast<std::size_t>(B * pages));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < pages; ++i) table[b * pages + i] = static_cast<std::int32_t>(i);
  // Step b: cache of Lk_b = L - B + 1 + b keys, its last Q tokens are the queries (causal,
  // bottom-right aligned: exactly the rows Lk_b - Q .. Lk_b - 1 of the prefill).
  std::vector<std::int32_t> seqlens(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b) seqlens[b] = static_cast<std::int32_t>(L - B + 1 + b);
  std::vector<float> out(static_cast<std::size_t>(B * Q * hq * d));
  const std::int64_t row = hq * d;

  DecodeProblem p;
  Staged staged;
  std::vector<float> qbuf;
  const float* qsrc = s.q + (L - B) * row;  // Q = 1: step b's query is row L - B + b, no copy
  if (Q > 1) {
    qbuf.resize(static_cast<std::size_t>(B * Q * row));
    for (std::int64_t b = 0; b < B; ++b)
      std::copy(s.q + (seqlens[b] - Q) * row, s.q + seqlens[b] * row, qbuf.begin() + b * Q * row);
    qsrc = qbuf.data();
  }
  if (opt.device == DeviceKind::cuda) {
    staged = to_bf16(qsrc, B * Q * row, s.k, s.v, L * hk * d);
    p.q = Tensor::contiguous(staged.q.data(), DType::bf16, {B, Q, hq, d});
    p.k_cache = Tensor::contiguous(staged.k.data(), DType::bf16, {pages, page, hk, d});
    p.v_cache = Tensor::contiguous(staged.v.data(), DType::bf16, {pages, page, hk, d});
  } else {
    p.q = Tensor::contiguous(const_cast<float*>(qsrc), DType::f32, {B, Q, hq, d});
    p.k_cache = Tensor::contiguous(const_cast<float*>(s.k), DType::f32, {pages, page, hk, d});
    p.v_cache = Tensor::contiguous(const_cast<float*>(s.v), DType::f32, {pages, page, hk, d});
  }
  p.page_table = table.data();
  p.page_table_stride = pages;
  p.seqlens_k = seqlens.data();
  p.max_seqlen_k = L;
  p.out = Tensor::contiguous(out.data(), DType::f32, {B, Q, hq, d});
  p.mask = MaskKind::causal;
  return measure_with(
      [&](const SkipConfig& probe, const RunOptions& ro) {
        SkipStats st;
        decode(p, probe, ro, &st);
        return st;
      },
      vote, opt);
}

}  // namespace blasst::calibration
