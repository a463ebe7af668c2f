"""gpuguard.diagnostics.holding — who holds GPU memory: the live device buffers of this interpreter (PyTorch tensors
and storages, CuPy arrays, anything with ``__cuda_array_interface__``, gpuguard ``Allocation`` blocks),
grouped by the buffer they share, each with the shortest chain of references from a named root.

Pure Python and C-free: it never imports torch or cupy (it recognises their objects when the program
already imported them, and duck-typed objects otherwise) and never calls into CUDA, so it works under
PyTorch's own allocator, under ``gpuguard.torch.use_arena`` and on machines without a GPU.

How: one pass over ``gc.get_objects()`` finds the buffers (a type-keyed cache makes that ~1 dict lookup
per object); then one breadth-first walk *forward* from the named roots (the notebook or ``__main__``
namespace, the stored traceback, live frames' locals, every module's globals) over
``gc.get_referents`` finds the shortest chain to each of them and stops once all are found. The forward
walk needs no referrer map (the reverse of every edge of the heap, built before the first step) and
lets the roots be ranked: at equal length, a notebook variable wins over a library's global. Edges that
a reader does not see (an object to its ``__dict__``, a module to its ``_parameters`` dict) cost 0, a
dict key costs 2, so ``model.fc.weight`` wins over ``opt.param_groups[0]['params'][0]`` and
``opt.state`` keys. PyTorch keeps ``.grad`` and the autograd graph (``grad_fn``, saved tensors) in C++;
the walk follows them explicitly, so a tensor kept alive only by the graph of a returned tensor is found
as ``out.grad_fn → MmBackward0._saved_self``."""
from __future__ import annotations

import gc
import os
import sys
import time
import warnings
import types
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

__all__ = ["holders", "Holders", "Holder", "buffer_keys", "format_bytes"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_CO_NEWLOCALS = 0x2  # inspect.CO_NEWLOCALS: a function frame (without importing inspect)

# Kinds of object the walk treats specially, decided once per type (a dict lookup per object after).
_TENSOR, _STORAGE, _CUPY, _CAI, _BLOCK = "tensor", "storage", "cupy", "cuda array", "arena block"
_NODE, _MODULE = "node", "module"  # not buffers: an autograd node, an nn.Module
_NOT_BUFFERS = (None, _NODE, _MODULE)
_MODULE_DICTS = ("_parameters", "_buffers", "_modules")
_kind_cache: Dict[type, Optional[str]] = {}

# Types that never refer to anything: not worth a visit.
_LEAF_TYPES = frozenset({str, bytes, int, float, bool, complex, type(None), bytearray, range, slice,
                         types.CodeType, types.BuiltinFunctionType, type(Ellipsis), type(NotImplemented)})


def format_bytes(n: Optional[float]) -> str:
    """``1.5 GiB``, ``12 MiB``, ``512 B``; ``-`` for None."""
    if n is None:
        return "-"
    sign, n = ("-" if n < 0 else ""), abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(n)} B"
            return f"{sign}{n:.1f} {unit}" if n < 10 else f"{sign}{n:.0f} {unit}"
        n /= 1024
    return f"{sign}{n:.0f} TiB"  # not reached


def _type_has(tp: type, *names: str) -> bool:
    try:
        return all(hasattr(tp, n) for n in names)
    except Exception:  # a metaclass whose __getattr__ raises something odd
        return False


def _classify(tp: type) -> Optional[str]:
    """What the walk must know about objects of type ``tp`` (None: nothing special)."""
    kind: Optional[str] = None
    mod = getattr(tp, "__module__", "") or ""
    if tp in _LEAF_TYPES or tp is type or issubclass(tp, type):
        kind = None
    elif _type_has(tp, "untyped_storage", "is_cuda", "data_ptr"):
        kind = _TENSOR  # torch.Tensor, nn.Parameter, subclasses; stand-ins with the same methods
    elif "Storage" in tp.__name__ and _type_has(tp, "data_ptr", "nbytes", "is_cuda"):
        kind = _STORAGE
    elif mod.split(".")[0] == "cupy" and tp.__name__ == "ndarray":
        kind = _CUPY
    elif _type_has(tp, "__cuda_array_interface__"):
        kind = _CAI
    elif tp.__name__ == "Allocation" and mod == "gpuguard.arena":
        kind = _BLOCK
    elif _type_has(tp, "next_functions", "register_hook"):
        kind = _NODE  # an autograd graph node (grad_fn)
    elif _type_has(tp, "named_parameters", "_apply"):
        kind = _MODULE  # torch.nn.Module: its parameter dicts are not part of the names people write
    _kind_cache[tp] = kind
    return kind


def _kind(o: Any) -> Optional[str]:
    tp = type(o)
    try:
        return _kind_cache[tp]
    except KeyError:
        return _classify(tp)


# ---- what a buffer is ------------------------------------------------------------------------------

_block_live: Dict[int, set] = {}  # per scan: the addresses each arena holds a block at, by id(arena)


def _describe(o: Any, kind: str) -> Optional[Dict[str, Any]]:
    """The buffer ``o`` lives in, as {key, bytes, device, kind, shape, dtype}; None when it is not device
    memory (a CPU tensor) or cannot be read."""
    try:
        if kind == _TENSOR:
            if not o.is_cuda:
                return None
            st = o.untyped_storage()
            ptr, size = st.data_ptr(), st.nbytes()
            dev = str(o.device)
            return {"key": (dev, ptr), "bytes": size, "device": dev, "kind": _TENSOR,
                    "shape": tuple(o.shape), "dtype": str(o.dtype).replace("torch.", "")}
        if kind == _STORAGE:
            if not o.is_cuda:
                return None
            dev = str(getattr(o, "device", "cuda"))
            return {"key": (dev, o.data_ptr()), "bytes": o.nbytes(), "device": dev, "kind": _STORAGE,
                    "shape": None, "dtype": None}
        if kind == _CUPY:
            mem = o.data.mem
            dev = f"cuda:{o.device.id}"
            return {"key": (dev, mem.ptr), "bytes": mem.size, "device": dev, "kind": _CUPY,
                    "shape": tuple(o.shape), "dtype": str(o.dtype)}
        if kind == _CAI:
            cai = o.__cuda_array_interface__
            ptr = int(cai["data"][0])
            shape = tuple(cai.get("shape", ()))
            typestr = str(cai.get("typestr", "|u1"))
            n = 1
            for s in shape:
                n *= int(s)
            return {"key": ("cuda", ptr), "bytes": n * int(typestr[2:] or 1), "device": "cuda", "kind": _CAI,
                    "shape": shape, "dtype": typestr}
        if kind == _BLOCK:
            arena = o._arena
            if arena._h is None:
                return None
            # Freed (free(), or the end of its scope) it is no buffer: the arena must hold a block at its
            # address, and the block must be this Allocation's, not a newer one at a reused address.
            live = _block_live.get(id(arena))
            if live is None:
                live = _block_live[id(arena)] = {b["ptr"] for b in arena.blocks()}
            if o.ptr not in live or arena._gens.get(o.ptr) != getattr(o, "_gen", None):
                return None
            dev = f"{arena.backend}:{arena.device}"
            return {"key": (dev, o.ptr), "bytes": o.size, "device": dev, "kind": _BLOCK,
                    "shape": None, "dtype": o.tag}
    except Exception:  # a tensor whose storage cannot be read (meta, fake, freed): not device memory
        return None
    return None


def _scan() -> Tuple[Dict[Tuple[str, int], Dict[str, Any]], int]:
    """The device buffers alive now, by key, with the number of Python objects (views) of each, and the
    number of objects scanned: one pass over the garbage collector's objects, then over the autograd
    graphs of the tensors found (PyTorch keeps a saved tensor's buffer in C++ with no Python object:
    only its graph leads to it)."""
    _block_live.clear()
    objs = gc.get_objects()
    scanned = len(objs)
    groups: Dict[Tuple[str, int], Dict[str, Any]] = {}
    tensors = []
    cache = _kind_cache
    for o in objs:
        tp = type(o)
        k = cache[tp] if tp in cache else _classify(tp)
        if k in _NOT_BUFFERS:
            continue
        if k == _TENSOR:
            tensors.append(o)
        d = _describe(o, k)
        if d is None or d["bytes"] <= 0:
            continue
        views = 0 if k == _STORAGE else 1  # a storage object is the buffer, not a view of it
        g = groups.get(d["key"])
        if g is None:
            d["objects"] = views
            groups[d["key"]] = d
        else:
            g["objects"] += views
    del objs
    for t in _graph_tensors(tensors):
        d = _describe(t, _TENSOR)
        if d is not None and d["bytes"] > 0 and d["key"] not in groups:
            d["objects"] = 0  # no Python object holds it: the one seen was unpacked from the graph
            groups[d["key"]] = d
    return groups, scanned


def buffer_keys() -> Dict[Tuple[str, int], int]:
    """The device buffers alive now, as {(device, address): bytes}: the cheap half of ``holders`` (no
    chains). ``rounds`` compares two of these."""
    return {k: g["bytes"] for k, g in _scan()[0].items()}


def _graph_tensors(tensors: List[Any]) -> List[Any]:
    """The tensors the autograd graphs of ``tensors`` hold (saved tensors, gradients), each graph node
    visited once."""
    seen: Dict[int, Any] = {}
    out: List[Any] = []
    todo = [e for t in tensors for e in _extra_edges(t, _TENSOR)]
    while todo:
        o, _ = todo.pop()
        if id(o) in seen:
            continue
        seen[id(o)] = o  # keeps the node (or unpacked tensor) alive: its id stays unique meanwhile
        k = _kind(o)
        if k == _TENSOR:
            out.append(o)
        if k in (_TENSOR, _NODE):
            todo.extend(_extra_edges(o, k))
    return out


# ---- the walk --------------------------------------------------------------------------------------

def _extra_edges(o: Any, kind: Optional[str]) -> List[Tuple[Any, str]]:
    """References the garbage collector does not show: PyTorch keeps ``.grad`` and the autograd graph in
    C++, and a live frame's locals are not its referents. Each comes with the label that names it."""
    out: List[Tuple[Any, str]] = []
    try:
        if kind == _TENSOR:
            gf = getattr(o, "grad_fn", None)
            if gf is not None:
                out.append((gf, ".grad_fn"))
            # PyTorch warns when .grad of a non-leaf is read; only leaves accumulate gradients
            g = getattr(o, "grad", None) if getattr(o, "is_leaf", True) else None
            if g is not None:
                out.append((g, ".grad"))
        elif kind == _NODE:
            for i, nf in enumerate(getattr(o, "next_functions", ()) or ()):
                if nf and nf[0] is not None:
                    out.append((nf[0], f".next_functions[{i}][0]"))
            var = getattr(o, "variable", None)  # AccumulateGrad: the leaf it accumulates into
            if var is not None:
                out.append((var, ".variable"))
            for name in dir(o):
                if name.startswith("_saved_"):
                    try:
                        v = getattr(o, name)
                    except Exception:  # freed by backward(): nothing held any more
                        continue
                    for j, t in enumerate(v if isinstance(v, (tuple, list)) else (v,)):
                        if _kind(t) == _TENSOR:
                            out.append((t, f".{name}" + (f"[{j}]" if isinstance(v, (tuple, list)) else "")))
        elif type(o) is types.FrameType:
            for name, v in o.f_locals.items():
                out.append((v, f"\0local {name}"))
    except Exception:
        pass
    return out


def _instance_dict(o: Any) -> Optional[dict]:
    try:
        d = object.__getattribute__(o, "__dict__")
    except Exception:
        return None
    return d if type(d) is dict else None


_NOT_INSTANCE = (dict, list, tuple, set, frozenset, deque, types.FrameType, types.FunctionType,
                 types.CellType, types.ModuleType, types.TracebackType, types.MethodType, type)


def _dict_weights(d: dict) -> Dict[int, int]:
    """Edge weights out of dict ``d`` that differ from 1: 0 for a module's ``_parameters``, ``_buffers``
    and ``_modules`` (a reader writes ``model.fc.weight``), 4 for a key that is not a string (a dict's
    values name their holder better than its keys: ``opt.state`` holds each parameter as a key, and
    ``opt.param_groups[0]['params'][0]`` says more)."""
    out: Dict[int, int] = {}
    if "_parameters" in d and "_modules" in d:
        for k in _MODULE_DICTS:
            v = d.get(k)
            if v is not None:
                out[id(v)] = 0
    for k in d:
        if type(k) not in _LEAF_TYPES:
            out[id(k)] = 4
    return out


class _Walk:
    """One walk: seeds (named roots) in rank order, then a bucketed breadth-first search (weights 0, 1
    and 4) until every wanted buffer is reached or the heap is exhausted."""

    def __init__(self, wanted: Dict[Tuple[str, int], Dict[str, Any]], exclude: set) -> None:
        self.wanted = wanted  # key -> group record; found ones get "path"
        self.missing = set(wanted)
        self.exclude = exclude
        # id -> [object, parent id or None, label (a seed's name when no parent), root kind, distance]
        self.seen: Dict[int, List[Any]] = {}
        self.buckets: List[Deque[int]] = [deque()]
        self.visited = 0
        self.discovered: Dict[Tuple[str, int], Dict[str, Any]] = {}

    def seed(self, obj: Any, name: str, root_kind: str) -> None:
        if id(obj) in self.seen or id(obj) in self.exclude:
            return
        self.seen[id(obj)] = [obj, None, name, root_kind, 0]
        self.buckets[0].append(id(obj))

    def _push(self, child: Any, parent_id: int, label: Optional[str], dist: int, w: int) -> None:
        cid = id(child)
        d = dist + w
        rec = self.seen.get(cid)
        if rec is not None:
            if rec[4] <= d:
                return
            rec[1], rec[2], rec[4] = parent_id, label, d  # a shorter way to an object not visited yet
        elif cid in self.exclude:
            return
        else:
            self.seen[cid] = [child, parent_id, label, "", d]
        while len(self.buckets) <= d:
            self.buckets.append(deque())
        self.buckets[d].append(cid)

    def run(self) -> None:
        dist = 0
        wanted, seen, missing = self.wanted, self.seen, self.missing
        seen_get, exclude, buckets, leaf = seen.get, self.exclude, self.buckets, _LEAF_TYPES
        cache = _kind_cache
        while dist < len(self.buckets) and missing:
            bucket = self.buckets[dist]
            while bucket and missing:
                oid = bucket.popleft()
                rec = seen[oid]
                if rec[4] != dist or len(rec) > 5:
                    continue  # visited already, at a shorter distance
                rec.append(True)
                o = rec[0]
                self.visited += 1
                tp = type(o)
                k = cache[tp] if tp in cache else _classify(tp)
                if k not in _NOT_BUFFERS:
                    d = _describe(o, k)
                    if d is not None and d["bytes"] > 0:
                        g = wanted.get(d["key"])
                        if g is None:  # only the walk sees it (a tensor unpacked from the graph)
                            d["objects"] = 1
                            wanted[d["key"]] = self.discovered[d["key"]] = g = d
                        if "path_end" not in g:
                            g["path_end"] = oid
                            g["shape"], g["dtype"] = d["shape"], d["dtype"]
                            if g["kind"] == _STORAGE:  # named after the tensor that reaches it
                                g["kind"] = d["kind"]
                            missing.discard(d["key"])
                try:
                    refs = gc.get_referents(o)
                except Exception:
                    refs = []
                weights: Optional[Dict[int, int]] = None
                if isinstance(o, dict):
                    # CPython lists only the values of a dict whose keys are all strings: no key to weigh
                    if len(refs) > len(o) or "_parameters" in o:
                        weights = _dict_weights(o)
                elif k == _MODULE:
                    pdict = _instance_dict(o)
                    if pdict is not None:
                        weights = {id(pdict): 0}
                        weights.update((id(pdict[n]), 0) for n in _MODULE_DICTS if n in pdict)
                elif len(refs) <= 2 and not isinstance(o, _NOT_INSTANCE) and any(type(r) is dict for r in refs):
                    pdict = _instance_dict(o)  # [its __dict__, its type]: the dict is the object itself
                    if pdict is not None:
                        weights = {id(pdict): 0}
                # _push inlined: this loop runs once per reference of every object visited
                if len(buckets) <= dist + 1:
                    buckets.append(deque())
                nxt = buckets[dist + 1]
                for r in refs:
                    if type(r) in leaf:
                        continue
                    cid = id(r)
                    if weights and cid in weights:
                        self._push(r, oid, None, dist, weights[cid])
                        continue
                    known = seen_get(cid)
                    if known is None:
                        if cid not in exclude:
                            seen[cid] = [r, oid, None, "", dist + 1]
                            nxt.append(cid)
                    elif known[4] > dist + 1:
                        known[1], known[2], known[4] = oid, None, dist + 1
                        nxt.append(cid)
                if k is not None or tp is types.FrameType:
                    for r, label in _extra_edges(o, k):
                        if type(r) not in _LEAF_TYPES:
                            self._push(r, oid, label, dist, 1)
            dist += 1

    def chain(self, end_id: int) -> Tuple[List[Any], List[Optional[str]], str, str]:
        """Objects root → end, the synthetic labels of their edges, the root's name and kind."""
        objs: List[Any] = []
        labels: List[Optional[str]] = []
        cur: Optional[int] = end_id
        name, root_kind = "", ""
        while cur is not None:
            obj, parent, label, rk = self.seen[cur][:4]
            objs.append(obj)
            if parent is None:
                name, root_kind = label or "", rk
                labels.append(None)
            else:
                labels.append(label)
            cur = parent
        objs.reverse()
        labels.reverse()
        return objs, labels, name, root_kind


# ---- naming the edges ------------------------------------------------------------------------------

def _short_repr(k: Any) -> str:
    kind = _kind(k)
    if kind == _TENSOR:
        try:
            return f"<{type(k).__name__} {tuple(k.shape)}>"
        except Exception:
            return f"<{type(k).__name__}>"
    r = repr(k) if isinstance(k, (str, int, float, bool, tuple, type(None))) else f"<{type(k).__name__}>"
    return r if len(r) <= 40 else r[:37] + "..."


def _frame_name(f: types.FrameType) -> str:
    code = f.f_code
    return f"{code.co_name}() ({os.path.basename(code.co_filename)}:{f.f_lineno})"


def _label(parent: Any, child: Any, grand: Any, namespace: bool = False) -> str:
    """How ``parent`` refers to ``child``, as text to append to the chain (``.x``, ``[3]``, ``['k']``,
    `` → f() x``); ``grand`` is the parent's own holder (to tell an attribute dict from a plain one);
    ``namespace``: ``parent`` is a root namespace (globals), whose keys are names."""
    if isinstance(parent, dict):
        if grand is not None and _kind(grand) == _MODULE and _instance_dict(grand) is parent and any(
                parent.get(k) is child for k in _MODULE_DICTS):
            return ""  # model.__dict__['_modules'] is not part of the name people write
        attr = namespace or (grand is not None and _instance_dict(grand) is parent)
        if not attr and grand is not None and (_kind(grand) == _MODULE or isinstance(grand, dict)):
            gd = grand if isinstance(grand, dict) else _instance_dict(grand) or {}
            attr = any(gd.get(k) is parent for k in _MODULE_DICTS)
        if isinstance(grand, type) and getattr(grand, "__dict__", None) == parent:
            attr = True
        for k, v in parent.items():
            if v is child:
                if attr and isinstance(k, str):
                    return f".{k}"
                return f"[{_short_repr(k)}]"
        for k in parent:
            if k is child:
                return " (as a key)"
        return " → ?"
    if isinstance(parent, (list, tuple, deque)):
        if isinstance(grand, types.FunctionType) and grand.__closure__ is parent:
            for i, c in enumerate(parent):
                if c is child:
                    return f" (closure variable {grand.__code__.co_freevars[i]!r})"
        for i, v in enumerate(parent):
            if v is child:
                return f"[{i}]"
        return " → ?"
    if isinstance(parent, (set, frozenset)):
        return " (in a set)"
    if isinstance(parent, types.CellType):
        return ""
    if isinstance(parent, types.FunctionType):
        if child is parent.__closure__:
            return ""
        if child is parent.__defaults__:
            return ".__defaults__"
        if child is parent.__kwdefaults__:
            return ".__kwdefaults__"
        return " → ?"
    if isinstance(parent, types.MethodType):
        return ".__self__" if child is parent.__self__ else ".__func__"
    if isinstance(parent, types.TracebackType):
        return ""
    if isinstance(parent, types.FrameType):
        try:
            for k, v in parent.f_locals.items():
                if v is child:
                    return f" → {_frame_name(parent)} {k}"
        except Exception:
            pass
        if child is parent.f_back:
            return " → caller"
        return " → frame"
    if isinstance(parent, types.ModuleType):
        return ""
    if _kind(parent) == _MODULE and any((_instance_dict(parent) or {}).get(k) is child for k in _MODULE_DICTS):
        return ""
    if type(parent).__name__ == "_lru_cache_wrapper":
        return " (lru_cache entry)"
    pd = _instance_dict(parent)
    if pd is child:
        return ""
    if pd is not None:
        for k, v in pd.items():
            if v is child:
                return f".{k}"
    for cls in type(parent).__mro__:
        for slot in getattr(cls, "__slots__", ()) or ():
            try:
                if getattr(parent, slot) is child:
                    return f".{slot}"
            except Exception:
                continue
    return f" → (held by a {type(parent).__name__})"


def _via(objs: List[Any], text: str, root_name: str, root_kind: str) -> str:
    """The short reason a buffer is held: the most telling kind of holder on its chain."""
    if root_name.startswith("sys.last") or any(isinstance(o, types.TracebackType) for o in objs):
        return "stored traceback"
    if ".grad_fn" in text or "._saved_" in text or ".next_functions" in text:
        return "autograd graph"
    for i, o in enumerate(objs[:-1]):
        d = _instance_dict(o) if not isinstance(o, _NOT_INSTANCE) else None
        if d is not None and "param_groups" in d and "state" in d:
            st, pg = d["state"], d["param_groups"]
            if any(x is st for x in objs[i + 1:i + 3]):
                return "optimizer state"
            if any(x is pg for x in objs[i + 1:i + 3]) and ".grad" not in text:
                return "optimizer parameter"
    if ".grad" in text:
        return "gradient"
    if any(type(o).__name__ == "_lru_cache_wrapper" for o in objs):
        return "cache"
    if "closure variable" in text or any(isinstance(o, types.CellType) for o in objs):
        return "closure"
    for i, o in enumerate(objs[:-1]):
        if _kind(o) != _MODULE:
            continue
        d = _instance_dict(o) or {}
        rest = objs[i + 2:i + 3] if objs[i + 1] is d else objs[i + 1:i + 2]
        if rest and rest[0] is d.get("_parameters"):
            return "module parameter"
        if rest and rest[0] is d.get("_buffers"):
            return "module buffer"
    return root_kind


def _node_name(node: Any) -> str:
    try:
        return str(node.name())
    except Exception:
        return type(node).__name__


def _render(objs: List[Any], labels: List[Optional[str]], root_name: str) -> str:
    parts = [root_name]
    hops = 0  # a run of autograd edges is told as its length, not node by node
    for i in range(1, len(objs)):
        lab = labels[i]
        if lab is not None and lab.startswith(".next_functions"):
            hops += 1
            continue
        if hops:
            more = f" → ({hops - 1} more node{'s' if hops > 2 else ''})" if hops > 1 else ""
            parts.append(f"{more} → {_node_name(objs[i - 1])}")
            hops = 0
        elif lab is not None and lab.startswith("._saved_"):
            parts.append(f" → {_node_name(objs[i - 1])}")
        if lab is None:
            lab = _label(objs[i - 1], objs[i], objs[i - 2] if i >= 2 else None,
                         namespace=i == 1 and isinstance(objs[0], dict))
        elif lab.startswith("\0local "):  # a live frame's local: the root itself when the frame is one
            lab = lab[7:] if i == 1 else f" → {_frame_name(objs[i - 1])} {lab[7:]}"
        parts.append(lab)
    text = "".join(parts)
    if text.startswith("."):
        text = text[1:]
    if text.startswith(" → "):
        text = text[3:]
    return text


# ---- roots -----------------------------------------------------------------------------------------

def _user_namespace() -> Tuple[Optional[dict], str]:
    ip = sys.modules.get("IPython")
    if ip is not None:
        try:
            shell = ip.get_ipython()
            if shell is not None:
                return shell.user_ns, "notebook variable"
        except Exception:
            pass
    main = sys.modules.get("__main__")
    return (vars(main) if main is not None else None), "global variable"


_own_files: Dict[str, bool] = {}


def _own_file(fn: str) -> bool:
    """Whether a code file is one of this package's (its path may be relative or hold '..')."""
    own = _own_files.get(fn)
    if own is None:
        own = _own_files[fn] = os.path.dirname(os.path.abspath(fn)) == _HERE
    return own


def _seed_roots(walk: _Walk, namespace: Optional[dict]) -> None:
    ns, ns_kind = (namespace, "variable") if namespace is not None else _user_namespace()
    if ns is not None:
        walk.seed(ns, "", ns_kind)
    for name in ("last_traceback", "last_value", "last_exc"):
        v = getattr(sys, name, None)
        if v is not None:
            walk.seed(v, f"sys.{name}", "stored traceback")
    top: Optional[types.FrameType]
    for _tid, top in sys._current_frames().items():
        f: Optional[types.FrameType] = top
        while f is not None:
            # function frames only (module-level code's locals are its globals, seeded as a module); this
            # package's own frames are no roots (nor read: f_locals would snapshot the walk itself)
            if f.f_code.co_flags & _CO_NEWLOCALS and not _own_file(f.f_code.co_filename):
                walk.seed(f, "", "local variable")
            f = f.f_back
    top = f = None  # this frame refers to itself through them: no cycle may keep the walk alive
    for mname, mod in list(sys.modules.items()):
        d = getattr(mod, "__dict__", None)
        if type(d) is dict:
            walk.seed(d, mname, "global variable")
    walk.seed(gc.garbage, "gc.garbage", "uncollectable garbage")


# ---- results ---------------------------------------------------------------------------------------

class Holder:
    """One device buffer and who holds it: ``bytes``, ``device``, ``kind`` (tensor, storage, cupy,
    cuda array, arena block), ``shape``, ``dtype``, ``objects`` (Python objects sharing the buffer:
    views), ``chain`` (the shortest chain of references from a named root, as text), ``via`` (what kind
    of holder: notebook/global/local variable, module parameter or buffer, optimizer parameter or state,
    gradient, autograd graph, stored traceback, closure, cache, unreachable)."""

    __slots__ = ("bytes", "device", "kind", "shape", "dtype", "objects", "chain", "via", "address")

    def __init__(self, rec: Dict[str, Any]) -> None:
        self.bytes: int = rec["bytes"]
        self.device: str = rec["device"]
        self.kind: str = rec["kind"]
        self.shape = rec.get("shape")
        self.dtype = rec.get("dtype")
        self.objects: int = rec.get("objects", 1)
        self.chain: str = rec.get("chain", "")
        self.via: str = rec.get("via", "")
        self.address: int = rec["key"][1]

    def as_dict(self) -> Dict[str, Any]:
        """The holder as plain data (JSON-ready)."""
        return {"bytes": self.bytes, "device": self.device, "kind": self.kind,
                "shape": list(self.shape) if self.shape is not None else None, "dtype": self.dtype,
                "objects": self.objects, "chain": self.chain, "via": self.via, "address": self.address}

    @property
    def culprit(self) -> str:
        """The root name a fix would start from (``total_loss``, ``sys.last_traceback``, ``opt``)."""
        c = self.chain
        if c.startswith("sys.last_"):
            return c.split(" ")[0]
        cut = [i for i in (c.find(sep) for sep in (".", "[", " ")) if i > 0]
        return (c[:min(cut)] if cut else c) or self.via

    def __repr__(self) -> str:
        return f"Holder({format_bytes(self.bytes)} {self.device} {self.chain!r} via {self.via})"


class Holders:
    """The result of ``holders()``: a list of ``Holder`` rows, biggest first, printed as a table.
    ``total_bytes`` and ``count`` cover every buffer found, ``rows`` only the ``top`` biggest;
    ``objects_scanned``, ``objects_visited`` and ``seconds`` say what the walk cost."""

    def __init__(self, rows: List[Holder], total_bytes: int, count: int, scanned: int, visited: int,
                 seconds: float) -> None:
        self.rows = rows
        self.total_bytes = total_bytes
        self.count = count
        self.objects_scanned = scanned
        self.objects_visited = visited
        self.seconds = seconds

    def __iter__(self) -> Iterator[Holder]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Holder:
        return self.rows[i]

    def as_dict(self) -> Dict[str, Any]:
        """Everything as plain data: {"total_bytes", "count", "objects_scanned", "seconds", "rows"}."""
        return {"total_bytes": self.total_bytes, "count": self.count, "objects_scanned": self.objects_scanned,
                "objects_visited": self.objects_visited, "seconds": round(self.seconds, 4),
                "rows": [h.as_dict() for h in self.rows]}

    def table(self, width: int = 120) -> str:
        """The rows as a text table (what ``print`` shows)."""
        head = (f"gpuguard holders: {self.count} device buffer{'s' if self.count != 1 else ''}, "
                f"{format_bytes(self.total_bytes)} ({self.objects_scanned} objects scanned in "
                f"{self.seconds:.2f} s)")
        if not self.rows:
            return head + "\n  (no live device buffers held by Python objects)"
        cols = []
        for h in self.rows:
            what = "-" if h.shape is None else "x".join(str(s) for s in h.shape) or "scalar"
            if h.dtype:
                what += f" {h.dtype}"
            if h.objects > 1:
                what += f" ({h.objects} views)"
            cols.append((format_bytes(h.bytes), h.device, what, h.via, h.chain))
        w = [max(len(c[i]) for c in cols + [("size", "device", "what", "via", "held by")]) for i in range(4)]
        lines = [head, f"  {'size':>{w[0]}}  {'device':<{w[1]}}  {'what':<{w[2]}}  {'via':<{w[3]}}  held by"]
        room = max(30, width - sum(w) - 10)
        for c in cols:
            chain = c[4] if len(c[4]) <= room else "…" + c[4][-(room - 1):]
            lines.append(f"  {c[0]:>{w[0]}}  {c[1]:<{w[1]}}  {c[2]:<{w[2]}}  {c[3]:<{w[3]}}  {chain}")
        if self.count > len(self.rows):
            rest = self.total_bytes - sum(h.bytes for h in self.rows)
            lines.append(f"  ... {self.count - len(self.rows)} more, {format_bytes(rest)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    __repr__ = __str__

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython's display
        p.text(self.table())


def holders(top: int = 20, min_bytes: int = 0, namespace: Optional[dict] = None,
            only: Optional[Callable[[Tuple[str, int]], bool]] = None) -> Holders:
    """Who holds device memory: the live device buffers of this interpreter, biggest first (``top`` of
    them; 0 or None: all), each with the shortest chain of references from a named root. ``namespace``
    overrides the user namespace root (default: IPython's, else ``__main__``'s globals); ``min_bytes``
    drops smaller buffers; ``only(key)`` keeps the buffers whose (device, address) key it accepts.

    Costs one pass over ``gc.get_objects()`` and at most one over what the roots reach (measured for
    113k objects on a loaded 2-core machine: 0.25-0.5 s, 0.7-1.2 s when the whole heap is walked); it
    allocates no device memory and never initialises CUDA."""
    t0 = time.perf_counter()
    groups, scanned = _scan()
    if only is not None:
        groups = {k: g for k, g in groups.items() if only(k)}
    walk = _Walk(groups, exclude={id(groups)})
    if groups:
        with warnings.catch_warnings():  # reading module attributes can raise deprecation warnings
            warnings.simplefilter("ignore")
            _seed_roots(walk, namespace)
            walk.run()
    if any("path_end" not in g for g in groups.values()):
        # Python <= 3.12: reading a running function's locals (f_locals) refreshes a snapshot that an
        # earlier read left on its frame, and may free what only that stale snapshot held. Such a buffer
        # died during the walk: it is no holder.
        alive = buffer_keys()
        groups = {k: g for k, g in groups.items() if "path_end" in g or k in alive}
    for key, g in list(groups.items()):
        if only is not None and not only(key):
            del groups[key]
            continue
        end = g.pop("path_end", None)
        if end is None:
            g["chain"] = "(no chain from a named root: a reference cycle that gc.collect() frees, or held " \
                         "from C/C++)"
            g["via"] = "unreachable"
            continue
        objs_, labels, name, root_kind = walk.chain(end)
        text = _render(objs_, labels, name)
        g["chain"] = text
        g["via"] = _via(objs_, text, name, root_kind)
        if g["via"] == "local variable":
            for o in objs_:
                if isinstance(o, types.FrameType):
                    g["via"] = f"local in {o.f_code.co_name}()"
                    break
    rows = sorted((g for g in groups.values() if g["bytes"] >= min_bytes), key=lambda g: -g["bytes"])
    total = sum(g["bytes"] for g in rows)
    count = len(rows)
    if top:
        rows = rows[:top]
    visited = walk.visited
    walk.seen.clear()  # drop the references the walk held before the result goes out
    return Holders([Holder(g) for g in rows], total, count, scanned, visited, time.perf_counter() - t0)
