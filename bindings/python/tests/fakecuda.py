"""Stand-ins for CUDA tensors on a machine without torch or a GPU, faithful where holders() depends on
it: a tensor has ``is_cuda``, ``untyped_storage()`` (``data_ptr()``, ``nbytes()``), ``shape``, ``dtype``,
``device``, ``grad``, ``grad_fn``; an autograd node has ``next_functions``, ``register_hook`` and
``_saved_*`` attributes that unpack a new tensor object on each access. Like PyTorch's C++ side, a
tensor's ``grad_fn``/``grad`` and a node's graph edges are references the garbage collector cannot see
(a reference count taken through the C API), and a saved tensor's buffer has no Python object at all
until it is unpacked, so only code that follows them explicitly finds what they hold. ``STATE.allocated`` counts the bytes of live storages:
``torch.cuda.memory_allocated()`` of this world."""
from __future__ import annotations

import ctypes
import itertools
from typing import Any, Dict, Optional, Tuple

_incref, _decref = ctypes.pythonapi.Py_IncRef, ctypes.pythonapi.Py_DecRef
_incref.argtypes = _decref.argtypes = [ctypes.py_object]


class _State:
    allocated = 0


STATE = _State()
_addresses = itertools.count(0x7F00_0000_0000, 1 << 20)


class Hidden:
    """A strong reference the garbage collector does not see (as a C++ object holding a PyObject)."""

    __slots__ = ("_addr",)

    def __init__(self, obj: Any) -> None:
        _incref(obj)
        self._addr = id(obj)

    def get(self) -> Any:
        return ctypes.cast(self._addr, ctypes.py_object).value

    def __del__(self) -> None:
        try:
            _decref(self.get())
        except Exception:
            pass


# The C++ side: storage implementations as plain integers (address -> [references, bytes]) that the
# garbage collector cannot follow. A buffer kept only by the autograd graph has no Python object at all,
# as in PyTorch; unpacking a saved tensor makes a new Python storage object over the same buffer.
_impls: Dict[int, list] = {}


def _impl_incref(ptr: int) -> None:
    _impls[ptr][0] += 1


def _impl_decref(ptr: int) -> None:
    rec = _impls[ptr]
    rec[0] -= 1
    if rec[0] == 0:
        del _impls[ptr]
        STATE.allocated -= rec[1]


class FakeUntypedStorage:
    """A Python storage object over a buffer: a new buffer (``nbytes``), or an existing one (``ptr``)."""

    def __init__(self, nbytes: int = 0, device: str = "cuda:0", ptr: Optional[int] = None) -> None:
        if ptr is None:
            ptr = next(_addresses)
            _impls[ptr] = [0, nbytes]
            STATE.allocated += nbytes
        _impl_incref(ptr)
        self._ptr, self._nbytes, self.device = ptr, _impls[ptr][1], device

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def data_ptr(self) -> int:
        return self._ptr

    def nbytes(self) -> int:
        return self._nbytes

    def __del__(self) -> None:
        _impl_decref(self._ptr)


class FakeNode:
    """An autograd node (``MmBackward0``...): its edges and saved tensors are hidden references."""

    def __init__(self, name: str, next_nodes: Tuple[Optional["FakeNode"], ...] = (),
                 saved: Optional[Dict[str, "FakeTensor"]] = None) -> None:
        self._name = name
        self._next = tuple(Hidden(n) if n is not None else None for n in next_nodes)
        self._saved = {k: (t._storage.data_ptr(), t.shape, t.device) for k, t in (saved or {}).items()}
        for ptr, _, _ in self._saved.values():
            _impl_incref(ptr)

    def name(self) -> str:
        return self._name

    @property
    def next_functions(self) -> Tuple[Tuple[Optional["FakeNode"], int], ...]:
        return tuple(((h.get() if h is not None else None), 0) for h in self._next)

    def register_hook(self, fn: Any) -> None:
        pass

    def __dir__(self) -> Any:
        return list(super().__dir__()) + [f"_saved_{k}" for k in self._saved]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_saved_") and name[7:] in self.__dict__.get("_saved", {}):
            ptr, shape, device = self._saved[name[7:]]
            # a new Python object each time, as in PyTorch
            return FakeTensor(shape, device, storage=FakeUntypedStorage(device=device, ptr=ptr))
        raise AttributeError(name)

    def __del__(self) -> None:
        for ptr, _, _ in self.__dict__.get("_saved", {}).values():
            _impl_decref(ptr)

    def __repr__(self) -> str:
        return f"<{self._name}>"


class FakeTensor:
    """A float32 tensor on ``device`` (``cuda:0`` by default; ``cpu`` tensors are not device memory)."""

    def __init__(self, shape: Tuple[int, ...], device: str = "cuda:0", requires_grad: bool = False,
                 storage: Optional[FakeUntypedStorage] = None, grad_fn: Optional[FakeNode] = None) -> None:
        n = 4
        for s in shape:
            n *= s
        self.shape = tuple(shape)
        self.dtype = "torch.float32"
        self.device = device
        self.requires_grad = requires_grad or grad_fn is not None
        self._storage = storage if storage is not None else FakeUntypedStorage(n, device)
        self._grad_fn = Hidden(grad_fn) if grad_fn is not None else None
        self._grad: Optional[Hidden] = None

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def untyped_storage(self) -> FakeUntypedStorage:
        return self._storage

    def data_ptr(self) -> int:
        return self._storage.data_ptr()

    @property
    def grad_fn(self) -> Optional[FakeNode]:
        return self._grad_fn.get() if self._grad_fn is not None else None

    @property
    def grad(self) -> Optional["FakeTensor"]:
        return self._grad.get() if self._grad is not None else None

    def set_grad(self, g: "FakeTensor") -> None:
        self._grad = Hidden(g)

    def _leaf_node(self) -> Optional[FakeNode]:
        if self.grad_fn is not None:
            return self.grad_fn
        return FakeNode("AccumulateGrad") if self.requires_grad else None

    def matmul(self, other: "FakeTensor") -> "FakeTensor":
        node = FakeNode("MmBackward0", (self._leaf_node(), other._leaf_node()), {"self": self, "mat2": other})
        return FakeTensor((self.shape[0], other.shape[1]), self.device, grad_fn=node)

    def sum(self) -> "FakeTensor":
        return FakeTensor((), self.device, grad_fn=FakeNode("SumBackward0", (self._leaf_node(),)))

    def __add__(self, other: Any) -> "FakeTensor":
        nxt = (self._leaf_node(), other._leaf_node() if isinstance(other, FakeTensor) else None)
        return FakeTensor(self.shape, self.device, grad_fn=FakeNode("AddBackward0", nxt))

    __radd__ = __add__

    def __iadd__(self, other: "FakeTensor") -> "FakeTensor":
        # In place: same storage, the graph grows by one node (what `total_loss += loss` does).
        self._grad_fn = Hidden(FakeNode("AddBackward0", (self._leaf_node(), other._leaf_node())))
        return self

    def item(self) -> float:
        return 0.0

    def detach(self) -> "FakeTensor":
        return FakeTensor(self.shape, self.device, storage=self._storage)


class CudaArray:
    """Anything exposing ``__cuda_array_interface__`` (Numba, a custom binding)."""

    def __init__(self, n: int, ptr: Optional[int] = None) -> None:
        self._n, self._ptr = n, ptr if ptr is not None else next(_addresses)

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        return {"shape": (self._n,), "typestr": "<f8", "data": (self._ptr, False), "version": 3}
