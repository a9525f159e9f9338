"""The one place that touches diffusers' attention dispatcher internals (blasst.diffusers uses it).

diffusers routes attention through ``diffusers.models.attention_dispatch.dispatch_attention_fn``,
which looks the backend up in ``_AttentionBackendRegistry._backends``, keyed by members of the
closed enum ``AttentionBackendName``. Each attention processor names its backend in
``processor._attention_backend``. To route a processor to blasst, this module makes a new value of
that enum (a pseudo-member: found by ``AttentionBackendName(value)`` and usable as a dict key, but
not listed in ``AttentionBackendName.__members__``, so ``set_attention_backend`` does not offer it)
and registers a backend function under it, the way diffusers' own register decorator does.

Everything it relies on is checked first, by ``check()``; a diffusers version whose internals
differ gets a RuntimeError naming what is missing, never a half-made registration.
"""
from __future__ import annotations

import atexit
import enum
import inspect
import sys
from typing import Callable, Dict

TESTED_VERSION = "0.42.1"
PREFIX = "blasst"

# What dispatch_attention_fn must accept (diffusers 0.35 ... 0.42) and what our backend receives.
_DISPATCH_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                  "enable_gqa", "attention_kwargs", "backend", "parallel_config")
_REGISTRY_ATTRS = ("_backends", "_constraints", "_supported_arg_names", "get_active_backend")
_ENUM_ATTRS = ("_value2member_map_", "_member_map_")

_members: Dict[str, object] = {}  # value -> pseudo-member made here


def _dispatch_module():
    try:
        from diffusers.models import attention_dispatch
    except ImportError as e:
        raise ImportError(f"blasst.diffusers needs diffusers (tested with diffusers=="
                          f"{TESTED_VERSION}): {e}") from None
    return attention_dispatch


def _version() -> str:
    import diffusers
    return getattr(diffusers, "__version__", "unknown")


def check(ad=None):
    """The attention_dispatch module, after checking the internals this module uses."""
    ad = _dispatch_module() if ad is None else ad
    missing = []
    names = getattr(ad, "AttentionBackendName", None)
    if not (isinstance(names, type) and issubclass(names, enum.Enum) and issubclass(names, str)):
        missing.append("AttentionBackendName (a str Enum)")
    else:
        missing += [f"AttentionBackendName.{a}" for a in _ENUM_ATTRS if
                    not isinstance(getattr(names, a, None), dict)]
        if "NATIVE" not in names.__members__:
            missing.append("AttentionBackendName.NATIVE")
    registry = getattr(ad, "_AttentionBackendRegistry", None)
    if registry is None:
        missing.append("_AttentionBackendRegistry")
    else:
        missing += [f"_AttentionBackendRegistry.{a}" for a in _REGISTRY_ATTRS
                    if not hasattr(registry, a)]
    dispatch = getattr(ad, "dispatch_attention_fn", None)
    if dispatch is None:
        missing.append("dispatch_attention_fn")
    else:
        params = inspect.signature(dispatch).parameters
        missing += [f"dispatch_attention_fn({a}=)" for a in _DISPATCH_ARGS if a not in params]
    if missing:
        raise RuntimeError(
            f"blasst.diffusers: diffusers {_version()} has an attention dispatcher this backend "
            f"does not know (missing: {', '.join(missing)}); it is written against diffusers=="
            f"{TESTED_VERSION}: install that version or update blasst")
    return ad


def member(index: int):
    """The AttentionBackendName pseudo-member 'blasst_<index>' (made on first use)."""
    ad = check()
    names = ad.AttentionBackendName
    value = f"{PREFIX}_{index}"
    existing = names._value2member_map_.get(value)
    if existing is not None:
        if value not in _members:
            raise RuntimeError(f"blasst.diffusers: AttentionBackendName already has a member "
                               f"{value!r} that blasst did not make")
        return existing
    m = str.__new__(names, value)
    m._name_ = value.upper()
    m._value_ = value
    m.__objclass__ = names
    m._sort_order_ = len(names._member_names_)
    names._value2member_map_[value] = m  # AttentionBackendName(value) finds it
    _members[value] = m
    return m


def is_ours(backend) -> bool:
    return backend is not None and getattr(backend, "value", backend) in _members


def context_parallel_available(ad=None) -> bool:
    """Whether this diffusers has the templated context parallelism blasst plugs into: the
    registry's set of context-parallel backends and ``_templated_context_parallel_attention``
    (Ulysses, ring and both), which calls a backend's forward_op / backward_op per chunk."""
    ad = check() if ad is None else ad
    return isinstance(getattr(ad._AttentionBackendRegistry, "_supports_context_parallel", None), set) and \
        callable(getattr(ad, "_templated_context_parallel_attention", None))


def register(backend_member, fn: Callable) -> None:
    """Register fn as the backend function of one of our members (what diffusers' register
    decorator does: the function, no constraints, the argument names it accepts), declared
    context-parallel capable where this diffusers has templated context parallelism."""
    if not is_ours(backend_member):
        raise ValueError(f"blasst.diffusers: {backend_member!r} is not a blasst backend")
    ad = check()
    registry = ad._AttentionBackendRegistry
    registry._backends[backend_member] = fn
    registry._constraints[backend_member] = []
    registry._supported_arg_names[backend_member] = set(inspect.signature(fn).parameters)
    if context_parallel_available(ad):
        registry._supports_context_parallel.add(backend_member.value)


def templated_context_parallel(*args, **kwargs):
    """diffusers' _templated_context_parallel_attention (Ulysses / ring / both)."""
    return check()._templated_context_parallel_attention(*args, **kwargs)


@atexit.register
def _unregister_all() -> None:
    """Drop our backend functions at exit: they hold blasst settings (C++ objects), which must
    not outlive blasst._core's teardown."""
    ad = sys.modules.get("diffusers.models.attention_dispatch")
    registry = getattr(ad, "_AttentionBackendRegistry", None)
    for m in _members.values():
        for table in ("_backends", "_constraints", "_supported_arg_names"):
            getattr(registry, table, {}).pop(m, None)
        getattr(registry, "_supports_context_parallel", set()).discard(m.value)


def native_backend(backend):
    """The backend a fallback runs: the processor's own (None: the dispatcher's active backend at
    call time), never one of ours."""
    ad = check()
    if backend is None:
        backend = ad._AttentionBackendRegistry.get_active_backend()[0]
    if is_ours(backend):
        backend = ad.AttentionBackendName.NATIVE
    return backend
