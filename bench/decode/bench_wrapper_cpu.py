"""The Python side of an eager blasst.decode / blasst.attention call alone (issue 18), on any machine:
_core's entry points replaced by no-ops after one real call, tiny CPU tensors (decode B 1, q_len 1,
32/8 heads, d 128, 256 keys; attention Lq 1), mean us per call over 20000 calls after 1000. What
is left out is the C++ side (DLPack import, validation, the launch) that scripts/device_eager.sh
measures on the GPU machine. Compare two trees by running it under each tree's PYTHONPATH in
alternation. Usage: bench_wrapper_cpu.py LABEL"""
import sys, time, types, torch, blasst
from blasst import _torch_eager
q = torch.randn(1, 1, 32, 128, dtype=torch.bfloat16)
k = torch.randn(1, 256, 8, 128, dtype=torch.bfloat16)
v = torch.randn(1, 256, 8, 128, dtype=torch.bfloat16)
qa = torch.randn(1, 1, 32, 128, dtype=torch.bfloat16)
blasst.decode(q, k, v); blasst.attention(qa, k, v)  # loads the ops (real core once)
_torch_eager._core = types.SimpleNamespace(decode=lambda *a: None, attention=lambda *a: None)
def bench(fn, n=20000):
    for _ in range(1000): fn()
    t = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - t) / n * 1e6
sk = blasst.SkipSoftmax(threshold=1e-3)
print("%s decode %.2f decode_skip %.2f attention %.2f" % (sys.argv[1], bench(lambda: blasst.decode(q, k, v)),
      bench(lambda: blasst.decode(q, k, v, skip=sk)), bench(lambda: blasst.attention(qa, k, v))))
