// Seeded synthetic workloads (SPEC §8), documented in docs/workloads.md.
//   random: i.i.d. normal Q, K, V (no structure, little sparsity)
//   llm:    RoPE positions, an attention-sink key, recency, a few heavy hitters
//   dit:    tokens on a T x H x W grid whose attention falls off with 3-D distance
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace blasst {

enum class WorkloadKind : std::uint8_t { random, llm, dit };
WorkloadKind parse_workload(const std::string& s);  // "random" | "llm" | "dit"; throws Error
const char* to_string(WorkloadKind k);

struct WorkloadSpec {
  WorkloadKind kind = WorkloadKind::random;
  std::int64_t batch = 1;
  std::int64_t seq_len = 1024;  // Lq = Lk
  std::int64_t heads_q = 8;
  std::int64_t heads_k = 8;
  std::int64_t head_dim = 128;
  std::uint64_t seed = 0;
};

// fp32 host tensors in the SPEC layout: q [B, L, Hq, d], k and v [B, L, Hk, d].
struct Workload {
  WorkloadSpec spec;
  std::vector<float> q, k, v;
};

Workload make_workload(const WorkloadSpec& spec);

}  // namespace blasst
