"""Launch plans: the thin host path of ``kda_prefill``.

The first call of a problem (``api.plan_key``: its shapes, dtypes, devices, alignment, options)
runs the normal path (validation, selection, ``launch.py``) while a ``Recorder`` watches it: each
kernel launch (``launch._launch`` reports it, with the kernel Triton's JIT compiled for it) and
each buffer allocated for it. The plan replays exactly that on later calls of the key: it
allocates the same buffers and launches the same compiled kernels through their launchers
directly, with the call's tensors in place of the recorded ones. Nothing else is redone: the
recorded run's integer arguments, grids and constexprs follow from the key alone (they are what
Triton's JIT specialises on, so the recorded kernel is the one the JIT would pick again).

A run that does any other torch work (a padded or strided copy, a pool's gather and scatter,
a slice of an output) cannot be replayed by launches alone: the recorder sees the op (a
``TorchFunctionMode``) and makes no plan, and such calls keep taking the normal path.
Under the Triton interpreter the plan replays through ``fn[grid](...)`` (no compiled kernels).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading

import torch
from torch.overrides import TorchFunctionMode

# allocations a plan replays: (function, whether it zero-fills)
_ALLOCATIONS = {
    torch.empty: False, torch.empty_like: False, torch.zeros: True, torch.zeros_like: True,
    torch.Tensor.new_empty: False, torch.Tensor.new_zeros: True,
}  # fmt: skip
# reads of metadata: no device work
_METADATA = {"shape", "dtype", "device", "is_cuda", "requires_grad", "data_ptr", "dim", "numel",
             "size", "stride", "is_contiguous", "element_size", "get_device", "__len__",
             "ndim", "layout", "is_floating_point", "storage_offset"}  # fmt: skip
_WORKSPACE_ALIGN = 256  # bytes: every intermediate's pointer keeps Triton's 16-byte alignment


class _PerThread(threading.local):
    """What a recording watches is its own thread's work: a launch or a torch op of another
    thread (an engine's other device) must neither enter its plan nor pass as in a launch."""

    recorder: Recorder | None = None
    launch_depth = 0


_thread = _PerThread()
_constants: dict = {}
_constant_ids: set = set()


def constant(key, make):
    """A cached tensor that kernels only read (the zero gate parameters): made once per key, so
    a plan can hold it. Made afresh under CUDA graph capture (a capture only records its fill)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return make()
    if key not in _constants:
        with launching():
            _constants[key] = make()
        _constant_ids.add(id(_constants[key]))
    return _constants[key]


def _name(func) -> str:
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property's getter: Tensor.shape.__get__
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


class Recorder(TorchFunctionMode):
    """Watches one run of the normal path. ``roles``: the launch call's input tensors by name
    (``api``'s plan inputs; the replay passes that call's tensors of the same names)."""

    def __init__(self, roles: dict, device: torch.device):
        super().__init__()
        self.device = device
        self.roles = {id(t): name for name, t in roles.items() if t is not None}
        self.keep = list(roles.values())  # ids stay unique while recorded
        self.buffers: list[tuple] = []  # (shape, dtype, device, zero)
        self.buffer_ids: dict[int, int] = {}
        self.launches: list[_Launch] = []
        self.refused: str | None = None

    def __enter__(self):
        _thread.recorder = self
        return super().__enter__()

    def __exit__(self, *exc):
        _thread.recorder = None
        return super().__exit__(*exc)

    def refuse(self, why: str) -> None:
        self.refused = self.refused or why

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if in_launch():
            return out
        if func in _ALLOCATIONS:
            if not out.is_contiguous():
                self.refuse("a strided allocation")
            self.buffer_ids[id(out)] = len(self.buffers)
            self.buffers.append((tuple(out.shape), out.dtype, out.device, _ALLOCATIONS[func]))
            self.keep.append(out)
        elif func is torch.Tensor.contiguous and out is args[0]:
            pass  # already contiguous: no copy
        elif _name(func) not in _METADATA:
            self.refuse(f"torch op {_name(func) or func}")
        return out

    def source(self, x):
        """Where the replay finds ``x``: ("buf", i), ("in", role) or ("lit", x)."""
        if not isinstance(x, torch.Tensor):
            return ("lit", x)
        if id(x) in self.buffer_ids:
            return ("buf", self.buffer_ids[id(x)])
        if id(x) in self.roles:
            return ("in", self.roles[id(x)])
        if id(x) in _constant_ids:
            return ("lit", x)
        self.refuse("a tensor the plan cannot name (made by a torch op)")
        return ("lit", None)

    def plan(self, out) -> Plan | None:
        """The plan of the recorded run returning ``out`` (a tuple of tensors or None), or None
        where it cannot be replayed."""
        returns = tuple(None if x is None else self.source(x) for x in out)
        if self.refused or not self.launches:
            return None
        returned = {src[1] for src in returns if src is not None and src[0] == "buf"}
        return Plan(self.buffers, self.launches, returns, returned, self.device)


@contextlib.contextmanager
def launching():
    """Marks a kernel launch (Triton's JIT reads metadata, the interpreter copies tensors) or a
    constant's creation: torch work that is not the call's own, which the recorder lets pass."""
    _thread.launch_depth += 1
    try:
        yield
    finally:
        _thread.launch_depth -= 1


def in_launch() -> bool:
    return _thread.launch_depth > 0


def note_launch(lc, grid, args, runtime, kernel) -> None:
    """``launch._launch`` reports each launch here; recorded while a plan is being made."""
    rec = _thread.recorder
    if rec is None:
        return
    bound = inspect.signature(lc.fn.fn).bind(*args, **runtime, **lc.constexprs)
    bound.apply_defaults()
    template, slots = [], []
    for pos, value in enumerate(bound.arguments.values()):
        kind, ref = rec.source(value)
        template.append(ref if kind == "lit" else None)
        if kind != "lit":
            slots.append((pos, kind, ref))
    grid = tuple(grid) + (1,) * (3 - len(grid))
    rec.launches.append(_Launch(lc, grid, list(bound.arguments), template, slots, kernel))


class _Launch:
    __slots__ = ("lc", "grid", "names", "template", "slots", "kernel", "run", "function",
                 "packed", "direct", "pointers")  # fmt: skip

    def __init__(self, lc, grid, names, template, slots, kernel):
        self.lc, self.grid, self.names = lc, grid, names
        self.template, self.slots = template, slots
        self.kernel = kernel
        self.run = self.function = self.packed = self.direct = self.pointers = None
        if hasattr(kernel, "packed_metadata"):  # a CompiledKernel: its launcher, directly
            self.run = kernel.run  # loads the module on first use
            self.function, self.packed = kernel.function, kernel.packed_metadata
            self.direct = _direct_launch(self.run, grid, function=self.function)
            # the literal tensors (cached constants, held by the template) as addresses: Triton's
            # launcher asks the driver about every tensor argument (cuPointerGetAttribute), not
            # about an int
            self.pointers = [x.data_ptr() if isinstance(x, torch.Tensor) else x
                             for x in template]  # fmt: skip

    def args(self, inputs, buffers, addresses: bool = False) -> list:
        """The launch's arguments; with ``addresses`` a compiled launch's, every tensor as its
        address (``inputs`` and ``buffers`` then hold addresses already)."""
        args = (self.pointers if addresses else self.template).copy()
        for pos, kind, ref in self.slots:
            args[pos] = inputs[ref] if kind == "in" else buffers[ref]
        return args


def _direct_launch(launcher, grid, function):
    """The C launch of Triton 3.6's CUDA launcher with the arguments its Python wrapper
    (``CudaLauncher.__call__``) would add, where that wrapper adds nothing else (no scratch
    memory to allocate): ``direct(stream, packed, *args)``. None where the launcher is another
    (other Triton versions, other backends): the replay then calls the launcher itself."""
    import triton

    if not triton.__version__.startswith("3.6.") or type(launcher).__name__ != "CudaLauncher":
        return None
    scratch = (getattr(launcher, "global_scratch_size", None),
               getattr(launcher, "profile_scratch_size", None))  # fmt: skip
    if scratch != (0, 0) or not hasattr(launcher, "launch"):
        return None
    launch, gx, gy, gz = launcher.launch, *grid
    coop, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl

    def direct(stream, packed, *args):
        launch(gx, gy, gz, stream, function, coop, pdl, None, None, packed, None, None, None,
               *args)  # fmt: skip

    return direct


class Plan:
    """A recorded run: its buffers, its launches, what it returns."""

    def __init__(self, buffers, launches, returns, returned, device):
        self.buffers, self.launches, self.returns = buffers, launches, returns
        self.compiled = device.type == "cuda" and all(L.run is not None for L in launches)
        self.device = device
        # intermediates (not returned, not zero-filled) share one workspace, at 256-byte offsets
        self.workspace: list = []  # (buffer index, byte offset)
        size = 0
        for i, (shape, dtype, _, zero) in enumerate(buffers):
            if self.compiled and i not in returned and not zero:
                self.workspace.append((i, size))
                nbytes = dtype.itemsize * _numel(shape)
                size += -(-max(nbytes, 1) // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN
        self.workspace_bytes = size
        in_workspace = {i for i, _ in self.workspace}
        self.own = [(i, b) for i, b in enumerate(buffers) if i not in in_workspace]
        # the inputs the launches read (a replay takes their addresses, nothing else of them)
        self.reads = sorted({ref for L in launches for _, kind, ref in L.slots if kind == "in"})

    def run(self, inputs: dict):
        """Replay on ``inputs`` (role -> tensor, as ``Recorder(roles)``); returns the recorded
        run's outputs, freshly allocated."""
        made: list = [None] * len(self.buffers)
        for i, (shape, dtype, device, zero) in self.own:
            made[i] = (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device)
        out = tuple([
            None if src is None else made[src[1]] if src[0] == "buf" else
            inputs[src[1]] if src[0] == "in" else src[1]
            for src in self.returns
        ])  # fmt: skip
        if not self.compiled:  # the interpreter: Triton's normal launch
            for L in self.launches:
                kwargs = dict(zip(L.names, L.args(inputs, made), strict=True))
                with launching():
                    L.lc.fn[L.grid](**kwargs, num_warps=L.lc.num_warps,
                                    num_stages=L.lc.num_stages)  # fmt: skip
            return out
        # addresses, not tensors: see _Launch.pointers
        buffers = made.copy()
        for i, _ in self.own:
            buffers[i] = made[i].data_ptr()
        if self.workspace:
            base = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=self.device)
            ptr = base.data_ptr()  # freed on return: later work on this stream runs after ours
            for i, offset in self.workspace:
                buffers[i] = ptr + offset
        addresses = {role: inputs[role].data_ptr() for role in self.reads}
        _launch_compiled(self.launches, addresses, buffers, self.device)
        return out


def _launch_compiled(launches, inputs, buffers, device) -> None:
    knobs = _knobs()
    stream = torch._C._cuda_getCurrentRawStream(device.index)
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    hooked = bool(enter.calls or leave.calls)  # a profiler: give it what Triton's run gives
    for L in launches:
        args = L.args(inputs, buffers, addresses=True)
        if L.direct is not None and not hooked:
            L.direct(stream, L.packed, *args)
            continue
        meta = L.kernel.launch_metadata(L.grid, stream, *args) if hooked else None
        L.run(*L.grid, stream, L.function, L.packed, meta, enter if hooked else None,
              leave if hooked else None, *args)  # fmt: skip


@functools.cache
def _knobs():
    from triton import knobs  # not at import: kreg's CPU paths load without Triton's runtime

    return knobs


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
