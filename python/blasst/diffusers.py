"""diffusers integration: run a pipeline's (or a model's) self-attention through blasst.

    import blasst.diffusers
    blasst.diffusers.enable(pipe, config="/path/to/Wan2.2-T2V-A14B-Diffusers")
    video = pipe(prompt, num_inference_steps=40).frames[0]    # the loop is unchanged
    blasst.diffusers.disable(pipe)

Each attention module of a denoiser component (``transformer``, ``transformer_2``, ``unet``...)
whose processor calls diffusers' attention dispatcher is pointed at a blasst backend
(blasst._diffusers_registry registers it). Settings are per component and per layer:

* ``config``: a SPEC §7 sparse_attention_config per component: a pipeline folder (read with
  blasst.load_model_configs: transformer/config.json, transformer_2/config.json, ...), one
  config.json / dict / SparseAttentionConfig (then it applies to every component), or a dict
  {component: config}. None: the component's own config.json when the model was loaded from a
  local folder. A component without a block stays dense (its processors are left alone).
  Layer names are the module paths inside the component (``blocks.0.attn1``, ``blocks.0.attn2``),
  matched against the config's ignore patterns; ignored layers run diffusers' own backend.
  Phase: prefill. ``target_sparsity`` (a number or {component: number}) overrides the target of
  calibrated configs.
* ``skip``: a blasst.SkipSoftmax for components without a config block, with ``ignore`` patterns
  (fnmatch, default: cross-attention, ``*attn2*`` and ``*cross_attn*``).

Timestep gating (SPEC §4) needs no change to the loop: a forward pre-hook on each component whose
layers carry disabled_until_timestep reads the ``timestep`` argument of its forward and publishes
t = max(timestep) / num_train_timesteps through blasst.diffusion (num_train_timesteps: the
pipeline scheduler's, else 1000; give 1 for pipelines that pass sigma in [0, 1], e.g. Flux).

Calls blasst cannot serve run diffusers' own backend for that processor (the one it had before,
or the dispatcher's active one), counted per reason in ``Enabled.fallbacks``: attention masks,
dropout, context parallelism on a diffusers without the templated loops, inputs that need gradients
inside blasst.calibration.record(), unsupported dtypes,
head dims or devices, mixed head counts without enable_gqa. Nothing is silently wrong.

Context parallelism (``enable_parallelism`` with a ContextParallelConfig): diffusers' templated
Ulysses / ring loops call blasst's forward and backward ops per chunk (``_cp_ops``; docs/python.md).

Inside ``blasst.calibration.record()`` every call a routed layer makes runs as the calibration
probe (no gating) and is recorded per component and layer; ``Recording.fit`` then gives one
config per component (``cal.save(pipeline_dir, ...)``: ``pipeline_dir/<component>/config.json``,
which ``enable(pipe, config=pipeline_dir)`` reads).
"""
from __future__ import annotations

import atexit
import fnmatch
import inspect
import os
import threading
import weakref
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _api, _calls, _diffusers_registry as _registry, _recording
from . import diffusion as _diffusion
from ._skip import SkipSoftmax, SparseAttentionConfig, check_skip, load_config, load_model_configs

DEFAULT_IGNORE = ("*attn2*", "*cross_attn*")
DEFAULT_NUM_TRAIN_TIMESTEPS = 1000
CUDA_HEAD_DIMS = (64, 128)          # the sm_90a kernels (docs/python.md)
_ATTR = "_blasst_diffusers"         # the Enabled handle, on each component it routes

_recorders: List["StatsRecorder"] = []
_lock = threading.Lock()
_current_layer = [""]               # set by the attention modules' pre-hooks while recording
_handles: "weakref.WeakSet[Enabled]" = weakref.WeakSet()


@atexit.register
def _release_settings() -> None:
    # Settings are C++ objects: drop those that models still hold before blasst._core goes away.
    for handle in list(_handles):
        handle.layers.clear()


# -- statistics ---------------------------------------------------------------------------------
class StatsRecorder:
    """Per-layer and per-denoise-step statistics of the calls made while it is active (each call
    then collects blasst statistics: a device sync per call on CUDA)."""

    def __init__(self):
        self.layers: Dict[str, Dict[str, int]] = {}
        self.steps: List[Dict[str, Any]] = []  # one per component forward (denoise step)
        self.fallbacks: Counter = Counter()

    def _layer(self, name: str) -> Dict[str, int]:
        return self.layers.setdefault(name, {"calls": 0, "blasst": 0, "gated": 0, "fallback": 0,
                                             "visited": 0, "skipped": 0})

    def _step(self) -> Dict[str, Any]:
        if not self.steps:
            self._begin_step("", None)
        return self.steps[-1]

    def _begin_step(self, component: str, t: Optional[float]) -> None:
        self.steps.append({"component": component, "t": t, "blasst": 0, "gated": 0,
                           "fallback": 0, "visited": 0, "skipped": 0})

    def _add(self, layer: str, stats: Optional[dict], reason: Optional[str]) -> None:
        entry, step = self._layer(layer), self._step()
        entry["calls"] += 1
        if reason is not None:
            entry["fallback"] += 1
            step["fallback"] += 1
            self.fallbacks[reason] += 1
            return
        entry["blasst"] += 1
        step["blasst"] += 1
        gated = int(bool(stats["gated"]))
        for d in (entry, step):
            d["gated"] += gated
            d["visited"] += int(stats["visited"])
            d["skipped"] += int(stats["skipped"])

    def sparsity(self) -> float:
        v = sum(e["visited"] for e in self.layers.values())
        return sum(e["skipped"] for e in self.layers.values()) / v if v else 0.0

    def merged(self, group=None) -> "StatsRecorder":
        """These statistics summed over the ranks of a torch.distributed process group (None:
        the world), e.g. of a model under context parallelism, where each rank records the calls
        it made (Ulysses: its heads over the whole sequence; ring: its rows against each key
        chunk). A collective: every rank of the group calls it. Layers and fallbacks are summed
        by name, steps by position (each rank runs the same steps; component and t are the
        first rank's)."""
        import torch.distributed as dist
        parts = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, (self.layers, self.steps, dict(self.fallbacks)), group=group)
        out = StatsRecorder()
        for layers, steps, fallbacks in parts:
            for name, entry in layers.items():
                acc = out._layer(name)
                for k, v in entry.items():
                    acc[k] += v
            for i, st in enumerate(steps):
                if i == len(out.steps):
                    out.steps.append(dict(st))
                    continue
                for k in ("blasst", "gated", "fallback", "visited", "skipped"):
                    out.steps[i][k] += st[k]
            out.fallbacks.update(fallbacks)
        return out

    def __repr__(self) -> str:
        return (f"StatsRecorder(steps={len(self.steps)}, layers={len(self.layers)}, "
                f"sparsity={self.sparsity():.4f}, fallbacks={dict(self.fallbacks)})")


def record_stats():
    """Collect per-layer and per-step statistics while the block runs (eager mode only):
    ``with blasst.diffusers.record_stats() as rec: ...``."""
    return _recording.active(_recorders, _lock, StatsRecorder())


def _compiling() -> bool:
    import torch
    return torch.compiler.is_compiling()


# -- routes: one registered backend per distinct setting ----------------------------------------
class _Route:
    """What the layers routed to one backend share: the component, the blasst settings (None: the
    layer is dense by its config, e.g. ignored, and runs diffusers' backend) and the backend the
    processor had (the fallback). Layers with equal settings share a route, so identical blocks
    carry the same backend value (torch.compile of repeated blocks does not recompile per block)."""

    __slots__ = ("component", "skip", "native", "dense_reason", "member", "handle")

    def __init__(self, component, skip, native, dense_reason, handle):
        self.component = component
        self.skip = skip
        self.native = native
        self.dense_reason = dense_reason
        self.handle = handle
        self.member = None


_route_index: Dict[Tuple, int] = {}


def _route_member(route: _Route):
    # One member per enable() call and setting: a second enable() (another pipeline) never takes
    # over the backend, and so the counters, of a first one that is still in use.
    key = (id(route.handle), route.component,
           None if route.skip is None else route.skip.fields(),
           None if route.native is None else str(getattr(route.native, "value", route.native)),
           route.dense_reason)
    index = _route_index.setdefault(key, len(_route_index))
    member = _registry.member(index)
    _registry.register(member, _backend_fn(route))
    route.member = member
    return member


def unsupported_reason(query, key, value, attn_mask=None, dropout_p=0.0, enable_gqa=False,
                       parallel_config=None) -> Optional[str]:
    """Why blasst cannot serve a dispatcher call (None: it can)."""
    import torch
    if parallel_config is not None and not _registry.context_parallel_available():
        return "context_parallel"
    if attn_mask is not None:
        return "attn_mask"
    if dropout_p:
        return "dropout"
    ts = (query, key, value)
    if not all(isinstance(x, torch.Tensor) for x in ts) or any(x.dim() != 4 for x in ts):
        return "shape"
    # Inputs that need gradients run blasst's differentiable op (SPEC §9; under context
    # parallelism diffusers' autograd.Function and _cp_ops' backward_op), except inside
    # blasst.calibration.record(), whose probe needs the statistics autograd's op path leaves out.
    if parallel_config is None and _recording.needs_grad(*ts) and \
            _recording.calibration() is not None:
        return "autograd"
    if query.dtype != key.dtype or query.dtype != value.dtype:
        return "dtype"
    if query.device != key.device or query.device != value.device:
        return "device"
    (b, _, hq, d), (bk, lk, hk, dk), (bv, lv, hv, dv) = query.shape, key.shape, value.shape
    if b != bk or b != bv or lk != lv or hk != hv or d != dk:
        return "shape"
    if hq != hk and not (enable_gqa and hk > 0 and hq % hk == 0):
        return "heads"
    if query.device.type == "cuda":
        if not _calls.cuda_available():
            return "device"
        if query.dtype not in (torch.bfloat16, torch.float16):
            return "dtype"
        if d not in CUDA_HEAD_DIMS or dv != d:
            return "head_dim"
        if any(x.stride(-1) != 1 for x in ts):
            return "layout"
    elif query.device.type == "cpu":
        if query.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            return "dtype"
    else:
        return "device"
    return None


def _backend_fn(route: _Route):
    def blasst_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                         is_causal: bool = False, scale: Optional[float] = None,
                         enable_gqa: bool = False, return_lse: bool = False,
                         _parallel_config=None):
        reason = route.dense_reason or unsupported_reason(query, key, value, attn_mask,
                                                          dropout_p, enable_gqa, _parallel_config)
        compiling = _compiling()
        recording = bool(_recorders) and not compiling
        if reason is not None:
            if not compiling:
                route.handle.fallbacks[reason] += 1
            if recording:
                _record(None, reason)
            ad = _registry.check()
            return ad.dispatch_attention_fn(
                query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                attention_kwargs={"return_lse": True} if return_lse else None,
                backend=_registry.native_backend(route.native), parallel_config=_parallel_config)
        if _parallel_config is not None:  # Ulysses / ring: diffusers' templated loop, our ops
            if not compiling:
                route.handle.blasst_calls[route.component] += 1
            forward_op, backward_op = _cp_ops(route, _parallel_config, recording)
            return _registry.templated_context_parallel(
                query, key, value, None, dropout_p, is_causal, scale, enable_gqa, return_lse,
                forward_op=forward_op, backward_op=backward_op, _parallel_config=_parallel_config)
        # blasst.calibration.record(): the call runs as its probe, with a histogram
        cal = None if compiling else _recording.calibration()
        if cal is not None:
            skip, stats = cal.probe, cal.new_stats()
        else:
            grad = _recording.needs_grad(query, key, value)
            skip, stats = route.skip, ({} if recording and not grad else None)
        res = _api.attention(query, key, value, causal=bool(is_causal), scale=scale,
                             skip=skip, return_lse=bool(return_lse), stats=stats)
        if not compiling:
            route.handle.blasst_calls[route.component] += 1
        if cal is not None:
            layer = _current_layer[0]
            prefix = route.component + "/"
            cal.add(route.component, layer[len(prefix):] if layer.startswith(prefix) else layer,
                    "prefill", query.shape[1], key.shape[1], bool(is_causal), stats)
        if recording:
            _record(_recording.stats_counts(stats), None)
        return res  # out [B, S, H, dv]; with return_lse (out, lse [B, H, S]) like the flash backend

    return blasst_attention


# -- context parallelism: the forward / backward ops diffusers' templated loops call ------------
SEED_BLOCK_ROWS = 8192  # rows per batch of seed scores: memory rows * H * tile_keys * 4 bytes


def _ring_sink(key, tile_keys, cp):
    """The sink tile, keys [0, tile_keys) of the sequence, i.e. of ring rank 0's chunk, on every
    rank of the ring: one broadcast (two on a ring_anything ring, whose rank 0 may hold fewer
    keys than a tile: its count first)."""
    import torch
    import torch.distributed as dist
    group = cp._ring_mesh.get_group()
    src = dist.get_global_rank(group, 0)
    n = min(tile_keys, key.shape[1])
    if getattr(cp, "ring_anything", False):
        count = torch.tensor([n], dtype=torch.int64, device=key.device)
        dist.broadcast(count, src=src, group=group)
        n = int(count.item())
    # a copy: broadcast writes into it on every rank but the source (a view would overwrite this
    # rank's own keys; contiguous() of a leading slice is such a view)
    b, _, h, d = key.shape
    sink = key.new_empty((b, n, h, d))
    if cp._ring_local_rank == 0:
        sink.copy_(key[:, :n])
    dist.broadcast(sink, src=src, group=group)
    return sink


def _ring_seed(query, key, scale, skip, cp):
    """SPEC §2a seeded maxima for a ring rank's rows: per row, the max of scale * q . k over the
    sink tile (_ring_sink) and the row's own tile (of this rank's chunk: the tile holding the
    first row of its vote group), in lse's layout [B, H, S] and units: float64 for float64
    tensors, else float32 (the kernels' seeds; scores from float32 copies of q and k). Computed
    once per call, before the first chunk; every chunk's call starts its running maxima there.
    The own tiles are scored in one batched product per block of rows when tile_keys is a
    multiple of vote_rows (every row of a tile then has that tile as its own), else per run of
    rows sharing an own tile."""
    import torch
    tile, rows = skip.tile_keys, skip.vote_rows
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    sink = _ring_sink(key, tile, cp).to(acc)
    b, s, h, d = query.shape
    lk = key.shape[1]
    sc = (1.0 / d ** 0.5) if scale is None else float(scale)
    seed = torch.empty((b, h, s), dtype=acc, device=query.device)
    step = max(tile, SEED_BLOCK_ROWS // tile * tile)
    for r0 in range(0, s, step):
        q = query[:, r0:r0 + step].to(acc)
        n = q.shape[1]
        m = torch.einsum("bshd,bthd->bhst", q, sink).amax(-1) if sink.shape[1] else \
            torch.full((b, h, n), float("-inf"), dtype=acc, device=query.device)
        if tile % rows == 0:
            nt = -(-n // tile)
            pad = nt * tile - n
            kt = key[:, r0:min(r0 + nt * tile, lk)].to(acc)
            if pad:  # the block's last own tile: rows padded with zeros, keys beyond lk masked
                q = torch.cat([q, q.new_zeros((b, pad, h, d))], 1)
            kpad = nt * tile - kt.shape[1]
            if kpad:
                kt = torch.cat([kt, kt.new_zeros((b, kpad, h, d))], 1)
            sco = torch.einsum("bnshd,bnthd->bnhst", q.view(b, nt, tile, h, d),
                               kt.view(b, nt, tile, h, d))
            if kpad:  # [b, nt, h, rows, keys]: the padded keys of the last tile(s)
                real = torch.arange(r0, r0 + nt * tile, device=query.device) < lk
                sco.masked_fill_(~real.view(1, nt, 1, 1, tile), float("-inf"))
            own = sco.amax(-1).permute(0, 2, 1, 3).reshape(b, h, nt * tile)[..., :n]
            m = torch.maximum(m, own)
        else:
            i = r0
            while i < r0 + n:
                t = ((i // rows) * rows) // tile  # the own tile of row i
                j = min(r0 + n, ((t + 1) * tile + rows - 1) // rows * rows)  # rows sharing it
                kt = key[:, min(t * tile, lk):min((t + 1) * tile, lk)].to(acc)
                if kt.shape[1]:
                    own = torch.einsum("bshd,bthd->bhst", q[:, i - r0:j - r0], kt).amax(-1)
                    m[..., i - r0:j - r0] = torch.maximum(m[..., i - r0:j - r0], own)
                i = j
        seed[..., r0:r0 + n] = m * sc
    return seed


EMPTY_FIRST_CHUNK_NATS = 20.0


def _first_chunk_lse(lse, seed):
    """The LSE a seeded ring's first call (the rank's own chunk) reports. A row whose kept set
    there is empty has LSE -inf (SPEC §2a), which diffusers' ring merge cannot take first:
    prev_lse - logsigmoid(prev_lse - lse) is -inf + inf = NaN for prev_lse = -inf, and the
    backward then reads that NaN. Such a row reports seed - EMPTY_FIRST_CHUNK_NATS instead (its
    out is 0): every row keeps the tile that reaches its seed (its delta there is >= 0), so the
    merged LSE is >= the seed and this stand-in weighs at most e^-20 (2e-9) of the row's merged
    result, below the float32 rounding of the merge itself (blasst's LSE is float32)."""
    import torch  # (no test of empty.any(): that would be a host sync per call on CUDA)
    empty = torch.isneginf(lse) & torch.isfinite(seed)
    return torch.where(empty, (seed - EMPTY_FIRST_CHUNK_NATS).to(lse.dtype), lse)


def _cp_ops(route, parallel_config, recording):
    """(forward_op, backward_op) for diffusers' TemplatedRingAttention / TemplatedUlyssesAttention
    (and the two combined). Every call of one templated forward shares its autograd ctx: the
    first (``_save_ctx``) is this rank's own chunk. Tensors in the model layout (B, S, H, D); the
    returned LSE is (B, S, H), the layout the ring's merge broadcasts.

    forward: blasst attention over one K/V chunk. A ring (pure, or the ring of Ulysses x ring)
    with skipping seeds every chunk's running maxima with the rows' sink- and own-tile maxima
    (_ring_seed, SPEC §2a), so a chunk that holds neither still skips against them, at inference
    and in training alike. With gradients: the chunk's skip set (decided with the seeds) is
    recorded per call, and backward: the SPEC §9 gradient of each chunk against the merged out /
    LSE the ring hands it (the same chunk order as the forward)."""
    import torch
    from . import _torch_ops as ops
    skip = route.skip
    skip_str = ops.skip_to_str(skip)
    ring = parallel_config.context_parallel_config.ring_degree > 1

    def forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                   scale=None, enable_gqa=False, return_lse=False, _save_ctx=True,
                   _parallel_config=None):
        # the ring's chunks are views of an all-gathered AsyncCollectiveTensor: waited on here
        query, key, value = (_api._plain(x, n) for x, n in ((query, "query"), (key, "key"),
                                                             (value, "value")))
        grad = any(getattr(ctx, "needs_input_grad", (False,))[:3])
        # the first call of this templated forward: the rank's own chunk on a ring (_save_ctx;
        # diffusers' Ulysses-anything loop passes _save_ctx=False to its only call)
        first = not hasattr(ctx, "blasst_sets")
        if first:
            ctx.blasst_sets = []  # per call: the skip set its forward recorded
            ctx.blasst_next = 0   # the next call the backward takes
            # seeds only where the skip test runs (not dense, not held off by timestep gating:
            # decided once, here, for every chunk of the call)
            ctx.blasst_seed = None
            if ring and _calls._effective_skip(skip)[0] is not None:
                ctx.blasst_seed = _ring_seed(query, key, scale, skip,
                                             _parallel_config.context_parallel_config)
        if grad:  # (autograd is off inside diffusers' autograd.Function: a direct call)
            (out, lse), words = _calls.attention(
                query, key, value, bool(is_causal), scale, skip, None, None, None, None, True,
                None, record_skip_set=True, seed_max=ctx.blasst_seed)
            ctx.blasst_sets.append(query.new_empty((0,), dtype=torch.int32) if words is None
                                   else words)
            if recording:  # (as outside context parallelism: a call without statistics)
                _record(_recording.stats_counts(None), None)
        else:
            stats = {} if recording else None
            out, lse = _api.attention(query, key, value, causal=bool(is_causal), scale=scale,
                                      skip=skip, return_lse=True, stats=stats,
                                      seed_max=ctx.blasst_seed)
            if recording:
                _record(stats, None)
        if first and ctx.blasst_seed is not None:
            lse = _first_chunk_lse(lse, ctx.blasst_seed)
        if _save_ctx:
            ctx.save_for_backward(query, key, value, out, lse)
            ctx.blasst_causal, ctx.blasst_scale = bool(is_causal), scale
        lse_sh = lse.transpose(1, 2)  # [B, H, S] -> (B, S, H)
        return (out, lse_sh) if return_lse else out

    def backward_op(ctx, grad_out, *args, query=None, key=None, value=None, out=None, lse=None,
                    **kwargs):
        q0, k0, v0, out0, lse0 = ctx.saved_tensors
        query = q0 if query is None else _api._plain(query, "query")
        key = k0 if key is None else _api._plain(key, "key")
        value = v0 if value is None else _api._plain(value, "value")
        out = out0 if out is None else out
        lse = lse0 if lse is None else lse.transpose(1, 2)  # the ring's (B, S, H) -> [B, H, S]
        i = ctx.blasst_next
        ctx.blasst_next += 1
        words = ctx.blasst_sets[i] if i < len(ctx.blasst_sets) else \
            query.new_empty((0,), dtype=torch.int32)
        # the LSE as given (merged over every chunk of the ring), also for float64 tensors
        return ops.backward_into(grad_out, query, key, value, out.to(query.dtype).contiguous(),
                                 lse.float().contiguous(), None, None, None, 0, 0,
                                 ctx.blasst_causal, ctx.blasst_scale, skip_str, words)

    return forward_op, backward_op


def _record(stats, reason):
    with _lock:
        for rec in _recorders:
            rec._add(_current_layer[0], stats, reason)


# -- configuration per component ------------------------------------------------------------------
def _is_config_like(x) -> bool:
    if isinstance(x, (SparseAttentionConfig, str, os.PathLike)):
        return True
    return isinstance(x, Mapping) and ("sparse_attention_config" in x or "config_groups" in x)


def _parse(x) -> Optional[SparseAttentionConfig]:
    if x is None:
        return None
    parsed = load_config(x)
    return parsed if parsed.present else None


def _own_config(module) -> Optional[SparseAttentionConfig]:
    """The block in the config.json a model was loaded from (diffusers drops unknown keys from
    model.config, so the file is read again)."""
    path = getattr(getattr(module, "config", None), "_name_or_path", None)
    if isinstance(path, str) and os.path.isfile(os.path.join(path, "config.json")):
        return _parse(path)
    return None


def _component_configs(components: Dict[str, Any], config, pipe_path: Optional[str]):
    if config is None:
        found = {}
        if pipe_path and os.path.isdir(pipe_path):
            found = load_model_configs(pipe_path)
        return {n: found.get(n) or _own_config(m) for n, m in components.items()}
    if isinstance(config, (str, os.PathLike)) and os.path.isdir(config) and \
            not os.path.isfile(os.path.join(config, "config.json")):
        found = load_model_configs(config)  # a pipeline folder: one subfolder per component
        if not found:
            raise ValueError(f"config: {os.fspath(config)!r} holds no component folder with a "
                             "sparse_attention_config (transformer/config.json, ...)")
        return {n: found.get(n) for n in components}
    if _is_config_like(config):
        parsed = _parse(config)
        if parsed is None:
            raise ValueError(f"config: {config!r} has no sparse_attention_config block")
        return {n: parsed for n in components}
    if isinstance(config, Mapping):
        unknown = sorted(set(config) - set(components))
        if unknown:
            raise ValueError(f"config: no component named {unknown} here (components: "
                             f"{sorted(components)})")
        return {n: _parse(config.get(n)) for n in components}
    raise TypeError("config: expected a pipeline folder, a config.json path, a dict, a "
                    "blasst.SparseAttentionConfig or {component: config}, got "
                    f"{type(config).__name__}")


def _per_component(value, components, name):
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return {n: None if value is None else float(value) for n in components}
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(components))
        if unknown:
            raise ValueError(f"{name}: no component named {unknown} here")
        return {n: None if value.get(n) is None else float(value[n]) for n in components}
    raise TypeError(f"{name}: expected a number or {{component: number}}, got "
                    f"{type(value).__name__}")


def _is_pipeline(x) -> bool:
    return isinstance(getattr(x, "components", None), dict) and hasattr(x, "config")


def _components_of(target, components: Optional[Sequence[str]]) -> Dict[str, Any]:
    import torch
    if _is_pipeline(target):
        mods = {n: m for n, m in target.components.items() if isinstance(m, torch.nn.Module)}
        if components is None:
            names = [n for n in mods if n.startswith(("transformer", "unet", "prior"))]
        else:
            names = list(components)
            missing = [n for n in names if n not in mods]
            if missing:
                raise ValueError(f"components: {missing} not in this pipeline (its models: "
                                 f"{sorted(mods)})")
        if not names:
            raise ValueError("blasst.diffusers: this pipeline has no denoiser component "
                             f"(transformer*, unet*); its models: {sorted(mods)}")
        return {n: mods[n] for n in names}
    if isinstance(target, torch.nn.Module):
        if components is not None and len(components) != 1:
            raise ValueError("components: a single model is one component; give one name")
        return {components[0] if components else "transformer": target}
    raise TypeError("blasst.diffusers.enable: expected a diffusers pipeline or model "
                    f"(torch.nn.Module), got {type(target).__name__}")


def _attention_modules(module):
    """(name, module) of the attention modules whose processor uses the dispatcher."""
    return [(n, m) for n, m in module.named_modules()
            if n and hasattr(getattr(m, "processor", None), "_attention_backend")]


def _timestep_index(module) -> Optional[int]:
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return None
    return params.index("timestep") if "timestep" in params else None


# -- enable / disable -------------------------------------------------------------------------------
class Enabled:
    """What enable() did: per component and layer the settings in force, and counters of the
    calls (eager calls only): ``blasst_calls`` per component, ``fallbacks`` per reason."""

    def __init__(self, num_train_timesteps: float):
        self.num_train_timesteps = float(num_train_timesteps)
        self.layers: Dict[str, Dict[str, Any]] = {}   # "component/layer" -> settings
        self.components: Dict[str, str] = {}          # component -> "routed" / "dense (...)"
        self.blasst_calls: Counter = Counter()
        self.fallbacks: Counter = Counter()
        self._undo: List[Any] = []

    def skip_for(self, component: str, layer: str) -> Optional[SkipSoftmax]:
        entry = self.layers.get(f"{component}/{layer}")
        return None if entry is None else entry["skip"]

    def __repr__(self) -> str:
        return (f"blasst.diffusers.Enabled(components={self.components}, "
                f"blasst_calls={dict(self.blasst_calls)}, fallbacks={dict(self.fallbacks)})")


def _make_timestep_hook(handle: Enabled, component: str, index: Optional[int], gated: bool):
    import torch

    def pre_hook(module, args, kwargs):
        recording = bool(_recorders)
        if not gated and not recording:
            return None
        ts = kwargs.get("timestep")
        if ts is None and index is not None and len(args) > index:
            ts = args[index]
        t = None
        if ts is not None:
            top = ts.max() if isinstance(ts, torch.Tensor) else max(ts) if \
                isinstance(ts, (list, tuple)) else ts
            t = _diffusion.record_denoise_step(top, handle.num_train_timesteps)  # one host sync
        if recording:
            with _lock:
                for rec in _recorders:
                    rec._begin_step(component, t)
        return None

    # Runs eagerly under torch.compile too (a graph break at the component's entry): the published
    # t is read by each blasst call at run time, never baked into a traced graph.
    return torch.compiler.disable(pre_hook)


def _layer_hook(label: str):
    def pre_hook(module, args):
        if _recorders or _recording.calibration() is not None:
            _current_layer[0] = label
        return None
    return pre_hook


def enable(pipe_or_model, config=None, *, target_sparsity=None,
           skip: Optional[SkipSoftmax] = None, ignore: Sequence[str] = DEFAULT_IGNORE,
           components: Optional[Sequence[str]] = None,
           num_train_timesteps: Optional[float] = None) -> Enabled:
    """Route the self-attention of a diffusers pipeline's denoisers (or of one model) through
    blasst. Returns an Enabled handle (also stored on each component); see the module docstring
    for config, target_sparsity, skip and ignore. ``components`` picks pipeline components by
    name (default: transformer*, unet*). Calling enable again replaces the previous settings."""
    check_skip(skip)
    if isinstance(ignore, str) or not all(isinstance(p, str) for p in ignore):
        raise TypeError(f"ignore: expected a sequence of fnmatch patterns, got {ignore!r}")
    _registry.check()
    mods = _components_of(pipe_or_model, components)
    if num_train_timesteps is None:
        sched = getattr(pipe_or_model, "scheduler", None)
        num_train_timesteps = getattr(getattr(sched, "config", None), "num_train_timesteps",
                                      None) or DEFAULT_NUM_TRAIN_TIMESTEPS
    if not float(num_train_timesteps) > 0:
        raise ValueError(f"num_train_timesteps: must be > 0, got {num_train_timesteps!r}")
    pipe_path = getattr(pipe_or_model, "name_or_path", None) if _is_pipeline(pipe_or_model) \
        else None
    configs = _component_configs(mods, config, pipe_path)
    targets = _per_component(target_sparsity, mods, "target_sparsity")
    if skip is None and not any(configs.values()):
        raise ValueError(
            "blasst.diffusers.enable: no sparse_attention_config found for "
            f"{sorted(mods)} and no skip= given; pass config= (a pipeline folder, a config.json, "
            "a dict) or skip=blasst.SkipSoftmax(...)")
    for m in mods.values():
        disable(m)
    handle = Enabled(num_train_timesteps)
    _handles.add(handle)
    routes: Dict[Tuple, _Route] = {}
    for comp, module in mods.items():
        attn = _attention_modules(module)
        cfg = configs[comp]
        if cfg is None and skip is None:
            handle.components[comp] = "dense (no sparse_attention_config)"
            continue
        if not attn:
            raise ValueError(f"blasst.diffusers: component {comp!r} ({type(module).__name__}) "
                             "has no attention module that uses diffusers' attention dispatcher")
        gated = False
        for name, am in attn:
            if cfg is not None:
                layer_skip = cfg.skip_softmax(layer=name, phase="prefill",
                                              target_sparsity=targets[comp])
                dense_reason = None if layer_skip.enabled else "ignored"
            else:
                ignored = any(fnmatch.fnmatchcase(name, p) for p in ignore)
                layer_skip = skip
                dense_reason = "ignored" if ignored else None
            if dense_reason is not None:
                layer_skip = None
            gated = gated or (layer_skip is not None and
                              layer_skip.disabled_until_timestep is not None)
            proc = am.processor
            native = getattr(proc, "_attention_backend", None)
            rkey = (comp, None if layer_skip is None else layer_skip.fields(), id(native),
                    dense_reason)
            route = routes.get(rkey)
            if route is None:
                route = routes[rkey] = _Route(comp, layer_skip, native, dense_reason, handle)
                _route_member(route)
            _set_backend(handle, am, route.member)
            handle._undo.append(am.register_forward_pre_hook(_layer_hook(f"{comp}/{name}")))
            handle.layers[f"{comp}/{name}"] = {"skip": layer_skip, "dense": dense_reason,
                                               "backend": route.member.value}
        hook = _make_timestep_hook(handle, comp, _timestep_index(module), gated)
        handle._undo.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        setattr(module, _ATTR, handle)
        handle._undo.append(lambda m=module: delattr(m, _ATTR) if hasattr(m, _ATTR) else None)
        handle.components[comp] = "routed" + (" (timestep-gated)" if gated else "")
    return handle


def _set_backend(handle: Enabled, module, member) -> None:
    proc = module.processor
    if _registry.is_ours(getattr(proc, "_attention_backend", None)):
        # A processor shared with a layer routed already: give this layer its own copy.
        import copy
        mine = copy.copy(proc)
        module.processor = mine
        handle._undo.append(lambda m=module, p=proc: setattr(m, "processor", p))
        proc = mine
    had = "_attention_backend" in vars(proc)
    old = vars(proc).get("_attention_backend")
    proc._attention_backend = member

    def undo(p=proc, had=had, old=old):
        if had:
            p._attention_backend = old
        elif "_attention_backend" in vars(p):
            del p._attention_backend
    handle._undo.append(undo)


def disable(pipe_or_model) -> None:
    """Undo enable(): every routed processor gets its backend back, the hooks are removed."""
    if _is_pipeline(pipe_or_model):
        targets = [m for m in pipe_or_model.components.values() if hasattr(m, _ATTR)]
    elif hasattr(pipe_or_model, "modules"):
        targets = [pipe_or_model] if hasattr(pipe_or_model, _ATTR) else []
    else:
        raise TypeError("blasst.diffusers.disable: expected a diffusers pipeline or model, got "
                        f"{type(pipe_or_model).__name__}")
    for module in targets:
        handle = getattr(module, _ATTR, None)
        if handle is None:
            continue
        for undo in reversed(handle._undo):
            (undo.remove if hasattr(undo, "remove") else undo)()
        handle._undo.clear()


def enabled(module) -> Optional[Enabled]:
    """The Enabled handle of a component, or None."""
    return getattr(module, _ATTR, None)
