// One kernel variant per translation unit (parallel builds): bf16, head dim 64, skip.
#include "cuda/sm90/prefill/prefill_kernel.hpp"
BLASST_PREFILL_INSTANTIATE(Elem::bf16, 64, kKindSkip)
