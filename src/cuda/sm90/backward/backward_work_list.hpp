// Internal: the backward's work list for calls with a skip set (backward_work_list.cu), and the
// sum of the split blocks' parts after the main kernel.
//
// Without a skip set every key block has the work its mask gives it, and the fixed launch order
// (launch_block_and_head) is longest first. With one, a block's work is its kept vote groups,
// which the launch order cannot know: key block 0 keeps every group of every query head (SPEC
// 2a: the first visited tile of both orders), and so do the tiles of a model's heavy-hitter keys,
// while the rest keep 1 - s of theirs. On the llm workload (causal, GQA 32/8, sink and 8 heavy
// hitters; a list-scheduling model of 132 SMs over its recorded sets at 8k, 70 %) the fixed order
// gives 1.75x over dense where the bound is 3.33x; with the heavy blocks split by query head and
// run first, 2.75x (bench/RESULTS.md, 2026-12-07). A list sorted by kept work throughout (3.06x in
// the model) lost the fixed order's L2 reuse where nothing is heavy: full-mask MHA rows ran
// 1.37-1.55x slower on the H100. Under MHA nothing can be split and the list cost more than it
// won (full mask d64 90 % +6.5 %, d128 70 % +2 %, H100): MHA keeps the fixed order with key
// block 0 first (backward_api.cu). So, per call with GQA / MQA:
//   1. count_kept_kernel: the kept vote groups of every (sequence, query head, key block), over
//      the groups the CTA would walk (BackwardScheduler::locate);
//   2. build_work_list_kernel, one CTA per sequence: the heavy blocks (>= kHeavyNum / kHeavyDen x
//      the sequence's mean), split by query head when above kSplitShareNum / kSplitShareDen of an
//      SM's share of the call's work (at most split_cap a sequence), first: by the
//      fixed order's section (causal: its sections of KV heads; full mask: each KV head), longest
//      first within one (a counting sort of section and cost, kCtaFixedCost + kept groups, in 4096
//      keys); then every other block in the fixed launch order (launch_block_and_head);
//   3. the main kernel takes item blockIdx.x of its sequence (BackwardScheduler::get);
//   4. split_sum_kernel adds each split block's parts into dk / dv, in part order (deterministic).
// The order inside a bucket follows the scatter's atomics (not deterministic); the gradients do
// not depend on it (each dK / dV row has one writer; dQ is a sum of atomics either way).
#pragma once

#include <cstddef>
#include <cuda_runtime.h>

#include "blasst/blasst.hpp"
#include "cuda/sm90/backward/backward_params.hpp"

namespace blasst::sm90::backward {

// Device scratch of a work list, carved from the call's workspace (work_list_bytes).
struct WorkListScratch {
  int* counts = nullptr;    // [batch][hq][num_n_blocks] kept vote groups, then (8-byte aligned)
                            // the call's total (unsigned long long), zeroed with them
  int* split_of = nullptr;  // [batch][hk * num_n_blocks] the block's split index or -1
  WorkItem* items = nullptr;  // [batch][work_items]
  SplitBlock* splits = nullptr;  // [batch][split_cap]
  int* counters = nullptr;  // [2][batch]: work_count, split_count
  float* parts = nullptr;   // [batch][split_cap][group][2][kSplitKeys][d] (dkv_part_index)
};

// Bytes of each array above for p's sizes (p.work_items, p.split_cap set), in that order.
void work_list_bytes(const BackwardParams& p, std::size_t (&bytes)[6]);

// Counts, splits and orders the work of p (p.skip_bits set; max_len_q: the longest sequence's
// query rows; num_sms: the device's SMs, for the split rule), and points p's work-list fields at
// the scratch. Stream-ordered: the main kernel launched after it reads the list.
void launch_work_list(BackwardParams& p, const WorkListScratch& s, int max_len_q, int num_sms, cudaStream_t stream);

// dk / dv of the split blocks: the sum of each one's parts (p.split_cap > 0). dtype: q's.
void launch_split_sum(const BackwardParams& p, DType dtype, cudaStream_t stream);

}  // namespace blasst::sm90::backward
