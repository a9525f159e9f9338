// Every bad input is a blasst::Error whose message names the argument (never UB).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "common.hpp"
#include "core/problem.hpp"

using namespace blasst;
using namespace blasst::test;

namespace {

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no Error thrown; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

struct Fixture {
  Dense D{2, 33, 40, 4, 2, 16, 8, 1};
  AttentionProblem p = D.problem(MaskKind::causal);
  void run() { reference::attention(p); }
};

}  // namespace

TEST(Validation, AttentionShapesAndTypes) {
  { Fixture f; f.p.q.data = nullptr; expect_error([&] { f.run(); }, "q"); }
  { Fixture f; f.p.q.rank = 3; expect_error([&] { f.run(); }, "q: expected rank 4"); }
  { Fixture f; f.p.k.shape[2] = 3; f.p.v.shape[2] = 3; expect_error([&] { f.run(); }, "multiple of KV heads"); }
  { Fixture f; f.p.k.shape[3] = 15; expect_error([&] { f.run(); }, "k: dimension 3"); }
  { Fixture f; f.p.v.shape[1] = 39; expect_error([&] { f.run(); }, "v: dimension 1"); }
  { Fixture f; f.p.out.shape[3] = 16; expect_error([&] { f.run(); }, "out: dimension 3"); }
  { Fixture f; f.p.out.shape[1] = 32; expect_error([&] { f.run(); }, "out: dimension 1"); }
  { Fixture f; f.p.lse.shape[2] = 40; expect_error([&] { f.run(); }, "lse: dimension 2"); }
  { Fixture f; f.p.k.shape[0] = 1; f.p.v.shape[0] = 1; expect_error([&] { f.run(); }, "k: dimension 0"); }
  { Fixture f; f.p.k.dtype = DType::f16; expect_error([&] { f.run(); }, "k: dtype f16"); }
  { Fixture f; f.p.v.dtype = DType::bf16; expect_error([&] { f.run(); }, "v: dtype bf16"); }
  { Fixture f; f.p.out.dtype = DType::f16; expect_error([&] { f.run(); }, "out: dtype f16"); }
  { Fixture f; f.p.lse.dtype = DType::bf16; expect_error([&] { f.run(); }, "lse: dtype"); }
  { Fixture f; f.p.q.dtype = static_cast<DType>(9); expect_error([&] { f.run(); }, "q: invalid dtype"); }
  { Fixture f; f.p.k.stride[3] = 2; expect_error([&] { f.run(); }, "k: the last dimension must be contiguous"); }
  { Fixture f; f.p.v.stride[1] = -8; expect_error([&] { f.run(); }, "v: negative stride"); }
  { Fixture f; f.p.out.device = DeviceKind::cuda; expect_error([&] { f.run(); }, "out: tensor is on cuda"); }
  { Fixture f; f.p.q.shape[0] = 0; f.p.k.shape[0] = 0; f.p.v.shape[0] = 0; f.p.out.shape[0] = 0; f.p.lse.shape[0] = 0;
    expect_error([&] { f.run(); }, "batch B must be >= 1"); }
  { Fixture f; f.p.q.shape[3] = 0; f.p.k.shape[3] = 0; expect_error([&] { f.run(); }, "head dimension d"); }
  { Fixture f; f.p.scale = std::nan(""); expect_error([&] { f.run(); }, "scale"); }
  { Fixture f; f.p.scale = -1.0; expect_error([&] { f.run(); }, "scale"); }
  { Fixture f; f.p.mask = static_cast<MaskKind>(7); expect_error([&] { f.run(); }, "mask"); }
  // Huge sizes: a dimension beyond int32, and strides whose offsets overflow int64.
  { Fixture f; f.p.k.shape[1] = f.p.v.shape[1] = (1ll << 31); expect_error([&] { f.run(); }, "k: dimension 1 = 2147483648 exceeds the int32 range"); }
  { Fixture f; f.p.q.stride[1] = (1ll << 62); expect_error([&] { f.run(); }, "q: element offsets overflow"); }
}

TEST(Validation, RaggedOffsets) {
  std::vector<float> q(30 * 2 * 8), k(50 * 1 * 8), v(50 * 8), o(30 * 2 * 8), l(2 * 30);
  auto make = [&](const std::int32_t* cq, const std::int32_t* ck, std::int64_t batch) {
    AttentionProblem p;
    p.q = Tensor::contiguous(q.data(), DType::f32, {30, 2, 8});
    p.k = Tensor::contiguous(k.data(), DType::f32, {50, 1, 8});
    p.v = Tensor::contiguous(v.data(), DType::f32, {50, 1, 8});
    p.out = Tensor::contiguous(o.data(), DType::f32, {30, 2, 8});
    p.lse = Tensor::contiguous(l.data(), DType::f32, {2, 30});
    p.cu_seqlens_q = cq;
    p.cu_seqlens_k = ck;
    p.batch = batch;
    return p;
  };
  const std::int32_t cq[] = {0, 10, 30}, ck[] = {0, 20, 50};
  EXPECT_NO_THROW(reference::attention(make(cq, ck, 2)));
  expect_error([&] { reference::attention(make(cq, nullptr, 2)); }, "cu_seqlens_q / cu_seqlens_k");
  expect_error([&] { reference::attention(make(cq, ck, 0)); }, "batch");
  const std::int32_t bad0[] = {1, 10, 30}, nonmono[] = {0, 31, 30}, badlast[] = {0, 10, 29};
  expect_error([&] { reference::attention(make(bad0, ck, 2)); }, "cu_seqlens_q[0] must be 0");
  expect_error([&] { reference::attention(make(nonmono, ck, 2)); }, "cu_seqlens_q must be non-decreasing");
  expect_error([&] { reference::attention(make(cq, badlast, 2)); }, "cu_seqlens_k[batch] = 29");
  {
    AttentionProblem p = make(cq, ck, 2);
    p.max_seqlen_q = 19;
    expect_error([&] { reference::attention(p); }, "max_seqlen_q = 19");
    p.max_seqlen_q = 20;
    p.max_seqlen_k = 29;
    expect_error([&] { reference::attention(p); }, "max_seqlen_k = 29");
    p.max_seqlen_k = -1;
    expect_error([&] { reference::attention(p); }, "max_seqlen_k must be >= 0");
    p.max_seqlen_k = 30;
    p.max_seqlen_q = 31;  // longer than all 30 query rows together
    expect_error([&] { reference::attention(p); }, "max_seqlen_q = 31 exceeds the total query rows q.shape[0] (30)");
    p.max_seqlen_q = 20;
    p.max_seqlen_k = 51;  // longer than all 50 key rows
    expect_error([&] { reference::attention(p); }, "max_seqlen_k = 51 exceeds the total key rows k.shape[0] (50)");
    p.max_seqlen_k = 50;  // an upper bound: above the longest sequence (30) is fine
    EXPECT_NO_THROW(reference::attention(p));
    p.max_seqlen_k = 30;
    EXPECT_NO_THROW(reference::attention(p));
    auto r = detail::validate_attention(p, DeviceKind::cpu);
    EXPECT_EQ(r.max_q_len, 20);
    EXPECT_EQ(r.max_k_len, 30);
    EXPECT_EQ(r.q_len, (std::vector<std::int64_t>{10, 20}));
    EXPECT_EQ(r.k_start, (std::vector<std::int64_t>{0, 20}));
  }
  {
    AttentionProblem p = make(cq, ck, 2);
    p.lse = Tensor::contiguous(l.data(), DType::f32, {30, 2});
    expect_error([&] { reference::attention(p); }, "lse: dimension 0");
  }
  // Device-resident offsets in a CPU-only build: a clear error, no dereference.
  {
    AttentionProblem p = make(cq, ck, 2);
    for (Tensor* t : {&p.q, &p.k, &p.v, &p.out, &p.lse}) t->device = DeviceKind::cuda;
    if (!detail::copy_to_host) expect_error([&] { detail::validate_attention(p, DeviceKind::cuda); }, "cu_seqlens_q");
  }
}

TEST(Validation, Decode) {
  const std::int64_t B = 2, Hq = 4, Hk = 2, d = 16, ps = 8, np = 6;
  std::vector<float> q(B * 1 * Hq * d), kc(np * ps * Hk * d), vc(np * ps * Hk * d), o(B * Hq * d), l(B * Hq);
  std::vector<std::int32_t> pt = {0, 1, 2, 3, 4, 5}, sl = {20, 24};
  auto make = [&]() {
    DecodeProblem p;
    p.q = Tensor::contiguous(q.data(), DType::f32, {B, 1, Hq, d});
    p.k_cache = Tensor::contiguous(kc.data(), DType::f32, {np, ps, Hk, d});
    p.v_cache = Tensor::contiguous(vc.data(), DType::f32, {np, ps, Hk, d});
    p.page_table = pt.data();
    p.page_table_stride = 3;
    p.seqlens_k = sl.data();
    p.out = Tensor::contiguous(o.data(), DType::f32, {B, 1, Hq, d});
    p.lse = Tensor::contiguous(l.data(), DType::f32, {B, Hq, 1});
    return p;
  };
  EXPECT_NO_THROW(reference::decode(make()));
  { auto p = make(); sl[1] = 25; expect_error([&] { reference::decode(p); }, "seqlens_k[1] = 25"); sl[1] = 24; }
  { auto p = make(); sl[0] = -1; expect_error([&] { reference::decode(p); }, "seqlens_k[0] = -1"); sl[0] = 20; }
  { auto p = make(); pt[4] = 6; expect_error([&] { reference::decode(p); }, "page_table[1][1] = 6"); pt[4] = 4; }
  { auto p = make(); pt[2] = -3; expect_error([&] { reference::decode(p); }, "page_table[0][2] = -3"); pt[2] = 2; }
  { auto p = make(); p.seqlens_k = nullptr; expect_error([&] { reference::decode(p); }, "seqlens_k: required"); }
  { auto p = make(); p.page_table_stride = 0; expect_error([&] { reference::decode(p); }, "page_table_stride"); }
  { auto p = make(); p.max_seqlen_k = 23; expect_error([&] { reference::decode(p); }, "max_seqlen_k = 23"); }
  {  // the table's columns bound the capacity (a column slice of a wider table keeps its stride)
    auto p = make();
    p.page_table_cols = 4;
    expect_error([&] { reference::decode(p); }, "page_table_cols = 4 must lie in [0, page_table_stride = 3]");
    p.page_table_cols = 2;  // 16 keys a sequence: seqlens 20 and 24 no longer fit
    expect_error([&] { reference::decode(p); }, "seqlens_k[0] = 20 must lie in [0, 16]");
    sl[0] = 16;
    sl[1] = 9;
    EXPECT_NO_THROW(reference::decode(p));
    sl[0] = 20;
    sl[1] = 24;
  }
  {  // above the cache capacity (3 pages of the paged cache): refused on the CPU path too
    auto p = make();
    p.max_seqlen_k = p.page_table_stride * p.k_cache.shape[1] + 1;
    expect_error([&] { reference::decode(p); }, "exceeds the cache capacity");
    p.max_seqlen_k = p.page_table_stride * p.k_cache.shape[1];
    EXPECT_NO_THROW(reference::decode(p));
  }
  { auto p = make(); p.v_cache.shape[1] = 4; expect_error([&] { reference::decode(p); }, "v_cache: dimension 1"); }
  { auto p = make(); p.k_cache.dtype = DType::f64; expect_error([&] { reference::decode(p); }, "k_cache: dtype f64"); }
  { auto p = make(); p.lse.shape[2] = 2; expect_error([&] { reference::decode(p); }, "lse: dimension 2"); }
  // Contiguous cache: batch must match, seqlens bounded by Lmax.
  {
    auto p = make();
    p.page_table = nullptr;
    p.page_table_stride = 0;
    p.k_cache = Tensor::contiguous(kc.data(), DType::f32, {B, 24, Hk, d});
    p.v_cache = Tensor::contiguous(vc.data(), DType::f32, {B, 24, Hk, d});
    EXPECT_NO_THROW(reference::decode(p));
    sl[0] = 30;
    expect_error([&] { reference::decode(p); }, "seqlens_k[0] = 30");
    sl[0] = 20;
    p.k_cache.shape[0] = 3;
    p.v_cache.shape[0] = 3;
    expect_error([&] { reference::decode(p); }, "k_cache: dimension 0");
  }
}

TEST(Validation, SkipConfig) {
  Fixture f;
  auto with = [&](SkipConfig c) { return [&f, c] { reference::attention(f.p, c); }; };
  expect_error(with(SkipConfig::from_threshold(std::nan(""))), "skip.threshold");
  expect_error(with(SkipConfig::from_threshold(INFINITY)), "skip.threshold");
  expect_error(with(SkipConfig::from_threshold(0.0)), "skip.threshold");
  expect_error(with(SkipConfig::from_threshold(-0.1)), "skip.threshold");
  expect_error(with(SkipConfig::from_factor(-5)), "skip.factor");
  expect_error(with(SkipConfig::from_calibration({std::nan(""), 1.0}, 0.5)), "skip.calibration.a");
  expect_error(with(SkipConfig::from_calibration({1.0, INFINITY}, 0.5)), "skip.calibration.b");
  expect_error(with(SkipConfig::from_calibration({1.0, 1.0}, 1.5)), "target_sparsity");
  expect_error(with(SkipConfig::from_calibration({1.0, 1.0}, -0.1)), "target_sparsity");
  expect_error(with(SkipConfig::from_calibration({1.0, 1e6}, 1.0)), "skip.calibration");  // exp overflow
  SkipConfig c = SkipConfig::from_threshold(0.1).with_order(VisitOrder::natural);
  c.vote.rows = 0;
  expect_error(with(c), "skip.vote.rows");
  c.vote.rows = 64;
  c.vote.tile_keys = 0;
  expect_error(with(c), "skip.vote.tile_keys");
  c.vote.tile_keys = 128;
  c.vote.heads = 3;
  expect_error(with(c), "skip.vote.heads = 3");
  c.vote.heads = 1;
  c.vote.split_tiles = -1;
  expect_error(with(c), "skip.vote.split_tiles");
  SkipConfig none;
  none.enabled = true;
  expect_error(with(none), "no threshold");
  RunOptions opt;
  opt.num_threads = -2;
  expect_error([&] { reference::attention(f.p, {}, opt); }, "num_threads");
}

TEST(Validation, EmptySequencesAreAllowed) {
  // Lq = 0: nothing to do. Lk = 0: every row fully masked -> O = 0, LSE = -inf.
  Dense A(1, 0, 10, 2, 2, 8, 8, 3);
  EXPECT_NO_THROW(reference::attention(A.problem(MaskKind::full)));
  Dense Bz(1, 5, 0, 2, 2, 8, 8, 3);
  SkipStats st;
  RunOptions opt;
  opt.collect_stats = true;
  reference::attention(Bz.problem(MaskKind::full), SkipConfig::from_factor(10).with_order(VisitOrder::natural), opt, &st);
  for (float x : Bz.out) EXPECT_EQ(x, 0.0f);
  for (float x : Bz.lse) EXPECT_TRUE(std::isinf(x) && x < 0);
  EXPECT_EQ(st.total_visited(), 0);
  EXPECT_EQ(st.sparsity(), 0.0);
}

namespace {
int g_copies = 0;
void fake_copy(void* dst, const void* src, std::size_t n) {
  ++g_copies;
  std::memcpy(dst, src, n);
}
}  // namespace

// The CUDA layer's view of validation, with host memory standing in for the device: offsets are
// read through copy_to_host, and not at all in the capture-safe case (both max_seqlen given).
TEST(Validation, DeviceOffsetsGoThroughCopyToHost) {
  std::vector<float> q(30 * 2 * 8), k(50 * 8), v(50 * 8), o(30 * 2 * 8);
  const std::int32_t cq[] = {0, 10, 30}, ck[] = {0, 20, 50};
  AttentionProblem p;
  p.q = Tensor::contiguous(q.data(), DType::f32, {30, 2, 8}, DeviceKind::cuda);
  p.k = Tensor::contiguous(k.data(), DType::f32, {50, 1, 8}, DeviceKind::cuda);
  p.v = Tensor::contiguous(v.data(), DType::f32, {50, 1, 8}, DeviceKind::cuda);
  p.out = Tensor::contiguous(o.data(), DType::f32, {30, 2, 8}, DeviceKind::cuda);
  p.cu_seqlens_q = cq;
  p.cu_seqlens_k = ck;
  p.batch = 2;
  const auto saved = detail::copy_to_host;
  detail::copy_to_host = fake_copy;
  g_copies = 0;
  auto r = detail::validate_attention(p, DeviceKind::cuda);
  EXPECT_EQ(g_copies, 2);
  EXPECT_EQ(r.k_len, (std::vector<std::int64_t>{20, 30}));
  EXPECT_EQ(r.max_q_len, 20);
  p.max_seqlen_q = 20;
  p.max_seqlen_k = 30;
  g_copies = 0;
  r = detail::validate_attention(p, DeviceKind::cuda);
  EXPECT_EQ(g_copies, 0);
  EXPECT_TRUE(r.q_len.empty());
  EXPECT_EQ(r.max_k_len, 30);
  // The reference refuses device tensors.
  expect_error([&] { reference::attention(p); }, "q: tensor is on cuda");
  detail::copy_to_host = saved;
}
