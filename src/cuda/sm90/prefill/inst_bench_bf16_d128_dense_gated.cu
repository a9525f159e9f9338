// Bench-only variant (bench_knobs 32): bf16, head dim 128, dense with the softmax under a
// never-taken runtime branch; the library's own calls never launch it.
#include "cuda/sm90/prefill/prefill_kernel.hpp"
namespace blasst::sm90::prefill {
template void run_prefill_gated<Elem::bf16, 128>(const PrefillParams&, cudaStream_t);
}
