// One kernel variant per translation unit (parallel builds): bf16, head dim 128, dense.
#include "cuda/sm90/prefill/prefill_kernel.hpp"
BLASST_PREFILL_INSTANTIATE(Elem::bf16, 128, kKindDense)
