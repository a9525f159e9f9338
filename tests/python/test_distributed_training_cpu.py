"""blasst.attention in data-parallel training (issue 14: "works under DDP/FSDP like any op, no
process-group code of our own"): a small attention model whose attention is blasst.attention with
skipping on (the forward records its skip set, the backward honours it, SPEC §9), trained one
step under DistributedDataParallel and under FSDP2 (fully_shard) on 2 CPU processes (gloo,
float64, reference engine).

Expected values: the same model in one process on both ranks' batches (the mean of the two
losses: what DDP's averaged gradients and FSDP's reduce-scattered ones stand for), gradients
through the same op; the op's own gradient is checked against float64 autograd through a masked
softmax elsewhere (test_backward_cpu.py). Each rank asserts that its batch skipped tiles (a
no-grad call with statistics at the same setting), so the skip path is what ran.
"""
import json
import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

WORLD = 2
L, D, H, HD = 512, 64, 2, 32


def _model(blasst):
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(D, 3 * H * HD, dtype=torch.float64)
            self.out = torch.nn.Linear(H * HD, D, dtype=torch.float64)
            self.skip = blasst.SkipSoftmax(threshold=0.05, order="max_first")

        def forward(self, x):
            b = x.shape[0]
            q, k, v = _with_sink(*self.qkv(x).view(b, L, 3, H, HD).unbind(2))
            return self.out(blasst.attention(q, k, v, causal=True, skip=self.skip).reshape(b, L, -1))

    torch.manual_seed(0)
    return Attn()


def _with_sink(q, k, v):
    """q, k with a sink: every query scores key 0 about 16 above the rest (channel 0 of each
    head), so the tiles far from the diagonal pass the skip test."""
    e = torch.zeros(HD, dtype=q.dtype)
    e[0] = 1.0
    k0 = torch.zeros(L, 1, HD, dtype=q.dtype)
    k0[0] = 30.0 * e
    return q + 3.0 * e, k + k0, v


def _batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return (torch.randn(1, L, D, generator=g, dtype=torch.float64),
            torch.randn(1, L, D, generator=g, dtype=torch.float64))


def _loss(model, x, t):
    return (model(x) * t).sum() / t.numel()


def _worker(rank, init_file, out_dir, mode):
    import blasst
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    blasst.set_num_threads(1)
    res = {}
    # expected: one process, both batches, the mean of the two losses
    ref = _model(blasst)
    sum(_loss(ref, *_batch(r)) for r in range(WORLD)).div(WORLD).backward()
    want = {n: p.grad.clone() for n, p in ref.named_parameters()}
    x, t = _batch(rank)
    with torch.no_grad():  # the setting skips on this rank's batch
        st = {}
        m0 = _model(blasst)
        q, k, v = _with_sink(*m0.qkv(x).view(1, L, 3, H, HD).unbind(2))
        blasst.attention(q, k, v, causal=True, skip=m0.skip, stats=st)
        res["skipped"] = st["skipped"]
    model = _model(blasst)
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
        _loss(model, x, t).backward()
        got = {n.removeprefix("module."): p.grad for n, p in model.named_parameters()}
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        # An explicit CPU mesh: without one, fully_shard takes the machine's accelerator (cuda on
        # the GPU machine) and moves the parameters there, away from this test's CPU tensors.
        fully_shard(model, mesh=init_device_mesh("cpu", (WORLD,)))
        _loss(model, x, t).backward()
        got = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    res["err"] = {n: float((got[n] - want[n]).abs().max() / want[n].abs().max()) for n in want}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    from mp_helpers import end_worker
    end_worker()  # (the process ends here)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_skip_attention_under_data_parallel(tmp_path, mode):
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path), mode), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        res = json.load(open(tmp_path / f"rank{rank}.json"))
        print(f"[{mode}] rank {rank}: {res}")
        assert res["skipped"] > 0, res
        assert len(res["err"]) == 4 and all(e <= 1e-12 for e in res["err"].values()), (mode, rank, res)
