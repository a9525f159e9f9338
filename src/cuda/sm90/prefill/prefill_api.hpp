// Internal: the host entry of the prefill kernels on device tensors, for the library's CUDA path
// (prefill_api.cu: detail::cuda_attention) and for the benchmark's and tests' direct calls.
#pragma once

#include <cstddef>
#include <vector>

#include "blasst/blasst.hpp"

namespace blasst::sm90::prefill {

// Device tensors only: checks what the kernels cover (an Error naming the argument otherwise),
// resolves lambda, picks the instance (kernel_table.inc) and launches on `stream` without
// synchronising. Non-null counters (device memory, zeroed by the caller: visited/skipped [hq],
// hist [hq, kHistSlots]) turn the statistics on. force_skip_kernel runs the skip instance even
// when skipping is off (the benchmark's measure of its cost with nothing skipped). Returns lambda
// per sequence when the lengths are known on the host. The visit order is the effective one of
// SPEC §2a (detail::effective_attention_order, src/core/problem.hpp: a defaulted max-first falls
// back to natural where the kernel cannot do it; an explicit one there is an Error); *order_used,
// when given, receives it.
// SPEC §2b FP8 screen (skip.enabled and skip.screen.margin != off): its scratch memory (device,
// 256-byte aligned, screen_workspace_bytes) and optional per-head counters (device, zeroed by the
// caller). A non-null screen_wrong runs skip_screen_check, which computes the bf16 scores of
// screened tiles too, to count the wrong screens; else skip_screen.
struct ScreenRun {
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  unsigned long long* screened = nullptr;
  unsigned long long* screen_wrong = nullptr;
};
// Bytes of the screen's scratch memory for p (0 when the screen is off for this call).
std::size_t screen_workspace_bytes(const AttentionProblem& p, const SkipConfig& skip);

std::vector<double> launch_attention(const AttentionProblem& p, const SkipConfig& skip, void* stream,
                                     bool force_skip_kernel, unsigned long long* visited,
                                     unsigned long long* skipped, unsigned long long* hist,
                                     VisitOrder* order_used = nullptr, const ScreenRun* screen = nullptr);

}  // namespace blasst::sm90::prefill
