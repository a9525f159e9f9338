// The SPEC §2b quantisation pre-kernel (prefill_screen_quant.cu) against SPEC §2b's text, computed
// here on the host in the same order: per query row and per key, codes e4m3(clamp(fp32(x / s),
// -16, 16)) with s = fp32(max|x| / 16) (the key tile's largest |k| over its finite keys), a
// non-finite vector's codes NaN (0x7f) and its norms NaN; |x|, |x~| and |x - x~| from sums of
// squares in double in channel order, rounded upwards to float; per key tile the NaN-propagating
// maxima KN, KT, EK and the tile's scale (0 when no key is finite). Everything must be equal bit
// for bit: codes, scales, norms and tile maxima. Built only with the CUDA kernels (it calls the
// internal screen_quantise on device memory).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/fp8.hpp"
#include "cuda/sm90/prefill/prefill_screen_quant.hpp"
#include "gpu_common.hpp"
#include "gpu_prefill/prefill_oracle.hpp"

namespace blasst::test {
namespace {

namespace pf = blasst::sm90::prefill;

float round_up(double x) {
  if (std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
  float f = static_cast<float>(x);
  if (static_cast<double>(f) < x) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}

struct Quant {
  std::vector<std::uint8_t> codes;
  float scale = 0, norm = 0, qnorm = 0, err = 0;
};

// SPEC §2b for one vector x (its values as floats) with the largest magnitude a (-1: non-finite).
Quant spec_quantise(const std::vector<float>& x, float a) {
  Quant r;
  r.codes.resize(x.size());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (a < 0) {
    std::fill(r.codes.begin(), r.codes.end(), std::uint8_t(0x7f));
    r.scale = r.norm = r.qnorm = r.err = nan;
    return r;
  }
  const float s = a / 16.0f;
  r.scale = s;
  volatile double nn = 0, nq = 0, ne = 0;  // volatile: no contraction into fused multiply-adds
  for (std::size_t c = 0; c < x.size(); ++c) {
    const float y = std::min(16.0f, std::max(-16.0f, x[c] / s));
    r.codes[c] = s > 0 ? float_to_e4m3(y) : std::uint8_t(0);
    const volatile double xd = x[c];
    const volatile double xq = static_cast<double>(s) * static_cast<double>(e4m3_to_float(r.codes[c]));
    const volatile double e = xd - xq;
    const volatile double p1 = xd * xd, p2 = xq * xq, p3 = e * e;
    nn = nn + p1;
    nq = nq + p2;
    ne = ne + p3;
  }
  r.norm = round_up(std::sqrt(static_cast<double>(nn)));
  r.qnorm = round_up(std::sqrt(static_cast<double>(nq)));
  r.err = round_up(std::sqrt(static_cast<double>(ne)));
  return r;
}

float finite_abs_max(const std::vector<float>& x) {
  float a = 0;
  for (const float v : x) {
    if (!std::isfinite(v)) return -1.0f;
    a = std::max(a, std::fabs(v));
  }
  return a;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b)); }

struct QuantCase {
  DType dt = DType::bf16;
  int d = 128, hq = 3, hk = 2;
  std::vector<int> lens;  // per sequence (Lq = Lk); equal unless `ragged`
  bool ragged = false;
};

// Random inputs whose rows span many binades (a power-of-two scale per vector), with non-finite
// elements, an all-zero vector and an all-non-finite key tile planted.
void run_case(const QuantCase& qc, std::uint64_t seed) {
  const int nseq = static_cast<int>(qc.lens.size());
  int Lmax = 0, total = 0;
  for (const int l : qc.lens) {
    Lmax = std::max(Lmax, l);
    total += l;
  }
  const int rows = qc.ragged ? total : Lmax;  // token extent per batch entry
  const int nb = qc.ragged ? 1 : nseq;
  const int d = qc.d;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  std::uniform_real_distribution<float> U(0.f, 1.f);
  auto fill = [&](int heads) {
    std::vector<std::uint16_t> h(std::size_t(nb) * rows * heads * d);
    for (std::size_t v = 0; v < h.size() / d; ++v) {
      // bf16: 2^-30 .. 2^11; f16: 2^-20 .. 2^7 (its subnormals from 2^-14 down, no overflow)
      const int e = qc.dt == DType::f16 ? static_cast<int>(U(rng) * 28) - 20 : static_cast<int>(U(rng) * 42) - 30;
      const float sc = std::ldexp(1.0f, e);
      for (int c = 0; c < d; ++c) h[v * d + c] = to16(N(rng) * sc, qc.dt);
    }
    return h;
  };
  std::vector<std::uint16_t> q = fill(qc.hq), k = fill(qc.hk);
  // planted: a zero query row, a query row with an inf, a key with a NaN, a key tile of NaN keys
  std::fill(q.begin(), q.begin() + d, std::uint16_t(0));
  q[std::size_t(5 * d + 7)] = to16(std::numeric_limits<float>::infinity(), qc.dt);
  k[std::size_t(3 * qc.hk * d + 1)] = to16(std::numeric_limits<float>::quiet_NaN(), qc.dt);
  if (rows > 128)
    for (int j = 128; j < std::min(rows, 256); ++j) k[std::size_t((j * qc.hk + 1) * d + 2)] = to16(std::numeric_limits<float>::quiet_NaN(), qc.dt);

  auto upload = [](const void* h, std::size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return p;
  };
  void* qd = upload(q.data(), q.size() * 2);
  void* kd = upload(k.data(), k.size() * 2);
  std::vector<int> cu(nseq + 1, 0);
  for (int b = 0; b < nseq; ++b) cu[b + 1] = cu[b] + qc.lens[b];
  int* cud = qc.ragged ? static_cast<int*>(upload(cu.data(), cu.size() * sizeof(int))) : nullptr;

  pf::PrefillParams p;
  p.q = qd;
  p.k = kd;
  p.batch = nseq;
  p.hq = qc.hq;
  p.hk = qc.hk;
  p.group = qc.hq / qc.hk;
  p.rows_q = p.rows_k = rows;
  p.q_head = p.k_head = d;
  p.q_row = std::int64_t(qc.hq) * d;
  p.k_row = std::int64_t(qc.hk) * d;
  p.q_batch = p.q_row * rows;
  p.k_batch = p.k_row * rows;
  p.cu_q = p.cu_k = cud;
  const std::int64_t tiles = (Lmax + 127) / 128;
  const pf::ScreenLayout L = pf::screen_layout(p, d, tiles);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, L.bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0xa5, L.bytes), cudaSuccess);  // poison
  pf::ScreenArgs args;
  pf::screen_quantise(p, qc.dt, L, ws, nullptr, args);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> out(L.bytes);
  ASSERT_EQ(cudaMemcpy(out.data(), ws, L.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  const std::uint8_t* q8 = out.data() + L.q8;
  const std::uint8_t* k8 = out.data() + L.k8;
  const float* q_rows = reinterpret_cast<const float*>(out.data() + L.q_rows);
  const float* k_tiles = reinterpret_cast<const float*>(out.data() + L.k_tiles);

  auto vec = [&](const std::vector<std::uint16_t>& h, std::size_t at) {
    std::vector<float> x(d);
    for (int c = 0; c < d; ++c) x[c] = from16(h[at * d + c], qc.dt);
    return x;
  };
  // Query rows: every (batch entry, token row, head) of the tensor, live or padding (the kernel
  // quantises the whole extent).
  std::size_t bad_codes = 0, bad_rows = 0, nonfinite_rows = 0;
  for (std::int64_t v = 0; v < std::int64_t(nb) * rows * qc.hq; ++v) {
    const std::vector<float> x = vec(q, std::size_t(v));
    const Quant r = spec_quantise(x, finite_abs_max(x));
    bad_codes += std::memcmp(r.codes.data(), q8 + v * d, std::size_t(d)) != 0;
    const float* g = q_rows + 4 * v;
    bad_rows += !(same_bits(g[0], r.scale) && same_bits(g[1], r.norm) && same_bits(g[2], r.qnorm) && same_bits(g[3], r.err));
    nonfinite_rows += std::isnan(r.norm);
  }
  EXPECT_EQ(bad_codes, 0u) << "query rows whose codes differ from SPEC 2b's";
  EXPECT_EQ(bad_rows, 0u) << "query rows whose scale or norms differ";
  EXPECT_GE(nonfinite_rows, 1u) << "the planted non-finite row did not happen";
  // Keys, per (sequence, KV head, tile) of the live keys.
  std::size_t bad_keys = 0, bad_tiles = 0, nan_tiles = 0, tiles_seen = 0;
  for (int b = 0; b < nseq; ++b)
    for (int kh = 0; kh < qc.hk; ++kh)
      for (std::int64_t t = 0; t * 128 < qc.lens[b]; ++t) {
        ++tiles_seen;
        const std::int64_t n = std::min<std::int64_t>(128, qc.lens[b] - t * 128);
        const std::int64_t row0 = qc.ragged ? cu[b] : std::int64_t(b) * rows;  // row of token 0
        std::vector<std::vector<float>> keys;
        float a = 0;
        for (std::int64_t j = 0; j < n; ++j) {
          keys.push_back(vec(k, std::size_t((row0 + t * 128 + j) * qc.hk + kh)));
          a = std::max(a, finite_abs_max(keys.back()));
        }
        float kn = 0, kt = 0, ek = 0, scale = 0;
        auto nmax = [](float u, float w) { return std::isnan(u) || std::isnan(w) ? std::numeric_limits<float>::quiet_NaN() : std::max(u, w); };
        for (std::int64_t j = 0; j < n; ++j) {
          const float aj = finite_abs_max(keys[j]);
          const Quant r = spec_quantise(keys[j], aj < 0 ? aj : a);
          bad_keys += std::memcmp(r.codes.data(), k8 + ((row0 + t * 128 + j) * qc.hk + kh) * d, std::size_t(d)) != 0;
          kn = nmax(kn, r.norm);
          kt = nmax(kt, r.qnorm);
          ek = nmax(ek, r.err);
          if (aj >= 0) scale = r.scale;
        }
        const float* g = k_tiles + 4 * ((std::int64_t(b) * qc.hk + kh) * tiles + t);
        bad_tiles += !(same_bits(g[0], kn) && same_bits(g[1], kt) && same_bits(g[2], ek) && same_bits(g[3], scale));
        nan_tiles += std::isnan(kn);
      }
  EXPECT_EQ(bad_keys, 0u) << "keys whose codes differ from SPEC 2b's";
  EXPECT_EQ(bad_tiles, 0u) << "key tiles whose maxima or scale differ, of " << tiles_seen;
  EXPECT_GE(nan_tiles, 1u) << "the planted non-finite key did not happen";
  cudaFree(ws);
  cudaFree(qd);
  cudaFree(kd);
  if (cud != nullptr) cudaFree(cud);
}

TEST(GpuScreenQuant, Bf16D128BatchedEqualsSpec) {
  BLASST_GPU_OR_SKIP("the sm_90a screen quantisation needs a Hopper device");
  QuantCase qc;
  qc.lens = {300, 300};
  run_case(qc, test_seed(2101));
}

TEST(GpuScreenQuant, F16D64RaggedEqualsSpec) {
  BLASST_GPU_OR_SKIP("the sm_90a screen quantisation needs a Hopper device");
  QuantCase qc;
  qc.dt = DType::f16;
  qc.d = 64;
  qc.hq = 4;
  qc.hk = 1;
  qc.lens = {257, 1, 130};
  qc.ragged = true;
  run_case(qc, test_seed(2102));
}

TEST(GpuScreenQuant, Bf16D64AndF16D128EqualsSpec) {
  BLASST_GPU_OR_SKIP("the sm_90a screen quantisation needs a Hopper device");
  QuantCase a;
  a.d = 64;
  a.lens = {200};
  run_case(a, test_seed(2103));
  QuantCase b;
  b.dt = DType::f16;
  b.lens = {140, 140};  // batched: one extent for every sequence
  b.hk = 3;
  run_case(b, test_seed(2104));
}

}  // namespace
}  // namespace blasst::test
