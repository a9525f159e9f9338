"""Offline corpus and tokenizer for the model benchmark (bench/model/README.md).

Corpus: the Python source files of the site-packages folders that hold torch, numpy, ... (found
through the modules' spec origins, i.e. their __file__ paths). Split by file: sha1 of the path relative to the site-packages folder;
files whose hash value mod 100 is below heldout_pct are held out.

Tokenizer: byte-level BPE trained here in pure Python on a sample of the training split.
Ids 0..255 are bytes, 256 is BOS, merges follow from 257. Words come from a small pre-tokenizer
(identifier runs with one leading space, digit runs, punctuation runs, newline + indentation,
other whitespace); merges never cross a word, so encodings are cached per word.
"""
from __future__ import annotations

import hashlib
import heapq
import importlib.util
import os
import re
from collections import Counter
from typing import Dict, List, Sequence, Tuple

import numpy as np

BOS = 256
N_BYTES = 256
DEFAULT_MODULES = ("torch", "numpy", "_pytest", "pluggy", "nanobind", "pip", "setuptools")

WORD_RE = re.compile(r" ?[A-Za-z_]+| ?[0-9]+| ?[^\sA-Za-z_0-9]+|\n[ \t]*|[ \t]+|\s")


def find_sources(modules: Sequence[str] = DEFAULT_MODULES, max_file_bytes: int = 400_000):
    """[(relative path, absolute path)] of every .py file under the site-packages folders that
    hold the given modules (torch's dependencies such as sympy come along), sorted. Paths are
    relative to their site-packages folder."""
    roots = []
    for name in modules:
        try:  # locate without importing (no import side effects, no warnings)
            spec = importlib.util.find_spec(name)
        except Exception:
            continue
        f = spec.origin if spec is not None else None
        if not f or not f.endswith(".py"):
            continue
        f = os.path.abspath(f)
        root = os.path.dirname(os.path.dirname(f)) if os.path.basename(f) == "__init__.py" \
            else os.path.dirname(f)
        if root not in roots:
            roots.append(root)
    found = {}
    for root in roots:
        for dp, dns, fns in os.walk(root):
            dns[:] = sorted(d for d in dns if d != "__pycache__" and not d.endswith(
                (".dist-info", ".egg-info")))
            for fn in sorted(fns):
                if not fn.endswith(".py"):
                    continue
                p = os.path.join(dp, fn)
                try:
                    size = os.path.getsize(p)
                except OSError:
                    continue
                if 0 < size <= max_file_bytes:
                    found.setdefault(os.path.relpath(p, root), p)
    return sorted(found.items())


def split_of(rel: str, heldout_pct: int) -> str:
    h = int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16)
    return "heldout" if h % 100 < heldout_pct else "train"


def hash_order(rel: str) -> int:
    return int(hashlib.sha1(("order:" + rel).encode()).hexdigest()[:12], 16)


def load_corpus(max_bytes: int, heldout_pct: int = 5, modules=DEFAULT_MODULES):
    """{'train': [(rel, text)], 'heldout': [...]}: files taken in a fixed hash order until the
    byte budget is spent (the held-out split gets its share of it)."""
    files = find_sources(modules)
    files.sort(key=lambda rp: hash_order(rp[0]))
    out = {"train": [], "heldout": []}
    total = 0
    for rel, p in files:
        if total >= max_bytes:
            break
        try:
            with open(p, "rb") as fh:
                text = fh.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        out[split_of(rel, heldout_pct)].append((rel, text))
        total += len(text.encode("utf-8", errors="replace"))
    return out


# ---------------------------------------------------------------------------------------------
# BPE training (incremental pair counts, lazy max-heap)

def train_bpe(texts: Sequence[str], n_merges: int) -> List[Tuple[int, int]]:
    counts = Counter()
    for t in texts:
        counts.update(WORD_RE.findall(t))
    words = [list(w.encode("utf-8")) for w in counts]
    freqs = list(counts.values())
    pair_count: Dict[Tuple[int, int], int] = {}
    where: Dict[Tuple[int, int], set] = {}
    for wi, (sym, f) in enumerate(zip(words, freqs)):
        for a, b in zip(sym, sym[1:]):
            pair_count[(a, b)] = pair_count.get((a, b), 0) + f
            where.setdefault((a, b), set()).add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    next_id = BOS + 1
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        cur = pair_count.get(pair, 0)
        if cur <= 0:
            continue
        if -negc != cur:  # stale entry
            heapq.heappush(heap, (-cur, pair))
            continue
        if cur < 2:
            break
        new = next_id
        next_id += 1
        merges.append(pair)
        a, b = pair
        changed = set()
        for wi in where.pop(pair, ()):
            sym = words[wi]
            f = freqs[wi]
            if len(sym) < 2:
                continue
            # remove this word's old pairs
            for x, y in zip(sym, sym[1:]):
                pair_count[(x, y)] -= f
                changed.add((x, y))
            out = []
            i = 0
            n = len(sym)
            while i < n:
                if i + 1 < n and sym[i] == a and sym[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(sym[i])
                    i += 1
            words[wi] = out
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] = pair_count.get((x, y), 0) + f
                where.setdefault((x, y), set()).add(wi)
                changed.add((x, y))
        pair_count.pop(pair, None)
        for p in changed:
            c = pair_count.get(p, 0)
            if c > 0 and p != pair:
                heapq.heappush(heap, (-c, p))
    return merges


class Tokenizer:
    def __init__(self, merges: Sequence[Tuple[int, int]]):
        self.merges = [tuple(m) for m in merges]
        self.rank = {p: i for i, p in enumerate(self.merges)}
        self.vocab_size = BOS + 1 + len(self.merges)
        self.cache: Dict[str, List[int]] = {}

    def encode_word(self, w: str) -> List[int]:
        got = self.cache.get(w)
        if got is not None:
            return got
        sym = list(w.encode("utf-8"))
        rank = self.rank
        while len(sym) > 1:
            best = None
            br = None
            for i in range(len(sym) - 1):
                r = rank.get((sym[i], sym[i + 1]))
                if r is not None and (br is None or r < br):
                    br, best = r, i
            if best is None:
                break
            a, b = self.merges[br]
            new = BOS + 1 + br
            out = []
            i = 0
            while i < len(sym):
                if i + 1 < len(sym) and sym[i] == a and sym[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(sym[i])
                    i += 1
            sym = out
        self.cache[w] = sym
        return sym

    def encode_doc(self, text: str) -> np.ndarray:
        ids = [BOS]
        enc = self.encode_word
        for w in WORD_RE.findall(text):
            ids.extend(enc(w))
        return np.asarray(ids, dtype=np.uint16)

    def decode(self, ids) -> str:
        table = {i: bytes([i]) for i in range(N_BYTES)}
        table[BOS] = b""
        for i, (a, b) in enumerate(self.merges):
            table[BOS + 1 + i] = table[a] + table[b]
        return b"".join(table[int(i)] for i in ids).decode("utf-8", errors="replace")


_worker_tok = None


def _init_worker(merges):
    global _worker_tok
    _worker_tok = Tokenizer(merges)


def _encode_chunk(texts):
    return [_worker_tok.encode_doc(t) for t in texts]


def encode_docs(tok: Tokenizer, texts: Sequence[str], workers: int = 1) -> List[np.ndarray]:
    if workers <= 1 or len(texts) < 64:
        return [tok.encode_doc(t) for t in texts]
    import multiprocessing as mp
    n = max(1, len(texts) // (workers * 4))
    chunks = [texts[i:i + n] for i in range(0, len(texts), n)]
    ctx = mp.get_context("fork")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(tok.merges,)) as pool:
        parts = pool.map(_encode_chunk, chunks)
    return [d for part in parts for d in part]
