// Bench-only instantiation kBenchVariants[4] (prefill_params.hpp), BLASST_PREFILL_BENCH_VARIANTS
// builds only: an A/B of kernel structures in one device run (bench_knobs = 4 << 8).
#include "cuda/sm90/prefill/prefill_kernel.hpp"
namespace blasst::sm90::prefill {
template void run_prefill_bench<4>(const PrefillParams&, cudaStream_t);
}
