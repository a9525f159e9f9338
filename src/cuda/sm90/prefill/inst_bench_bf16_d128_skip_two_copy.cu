// Bench-only variant (bench_knobs 64, BLASST_PREFILL_BENCH_VARIANTS builds): bf16, head dim 128,
// skip with run 3's loop structure, for an A/B against the library's skip kernel in one run.
#include "cuda/sm90/prefill/prefill_kernel.hpp"
namespace blasst::sm90::prefill {
template void run_prefill_two_copy_skip<Elem::bf16, 128>(const PrefillParams&, cudaStream_t);
}
