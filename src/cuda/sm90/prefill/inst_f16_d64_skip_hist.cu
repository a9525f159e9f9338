// One kernel variant per translation unit (parallel builds): f16, head dim 64, skip with the delta histogram (statistics).
#include "cuda/sm90/prefill/prefill_kernel.hpp"
BLASST_PREFILL_INSTANTIATE(Elem::f16, 64, kKindSkipHist)
