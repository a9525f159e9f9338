// One kernel variant per translation unit (parallel builds): bf16, head dim 128, skip with the delta histogram (statistics).
#include "cuda/sm90/prefill/prefill_kernel.hpp"
BLASST_PREFILL_INSTANTIATE(Elem::bf16, 128, kKindSkipHist)
