# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled hot loops of tb-cython-dispatch.

``_fallback.py`` implements the same API in plain Python, and the tests run against both. What
is here is only the per-call work: building a dispatch key, the inline-cache lookup, the hook
check that decides whether a module call may skip ``nn.Module.__call__``, running a resolved
step list, and running a compiled plan. Resolution (what a key maps to) is shared Python code in
``tb_cython_dispatch.resolve``.
"""

import torch
import torch.nn.modules.module as _module_mod

from tb_cython_dispatch import native as _native_mod

IMPLEMENTATION = "compiled"

cdef object _Tensor = torch.Tensor
cdef object _strided = torch.strided
cdef object _is_grad_enabled = torch.is_grad_enabled
cdef object _is_inference = torch.is_inference_mode_enabled
cdef object _is_tracing = torch._C._is_tracing
cdef dict _G = _module_mod.__dict__
cdef object _generic_call = torch.nn.Module.__call__
cdef object _linear = torch._C._nn.linear
cdef object _relu_ = torch.relu_

# step kinds of a resolved module plan (see resolve.py)
cdef enum:
    K_CALL = 0          # generic: call the child module (its own fast path applies)
    K_LINEAR = 1        # linear(x, W, b) from the child's _parameters
    K_LINEAR_RELU = 2   # relu_(linear(x, W, b)): the intermediate is invisible, so in place
    K_UNARY = 3         # fn(x)
    K_UNARY_ARG = 4     # fn(x, arg)
    K_IDENTITY = 5


# -- the dispatch cache -------------------------------------------------------------------------
cdef class OpStats:
    cdef public long hits
    cdef public long misses
    cdef public long entries
    cdef public long invalidations

    def as_dict(self):
        return {"hits": self.hits, "misses": self.misses, "entries": self.entries,
                "invalidations": self.invalidations}


cdef class DispatchCache:
    """Per-op statistics, the on/off switch and the epoch that ``clear()`` advances."""
    cdef public bint enabled
    cdef public long epoch
    cdef public int max_entries_per_site
    cdef dict _stats

    def __init__(self, bint enabled=True, int max_entries_per_site=8):
        self.enabled = enabled
        self.epoch = 0
        self.max_entries_per_site = max_entries_per_site
        self._stats = {}

    cpdef OpStats stats(self, str op):
        cdef OpStats s = self._stats.get(op)
        if s is None:
            s = OpStats()
            self._stats[op] = s
        return s

    def info(self):
        native = _native_mod.counts(self.epoch)
        out = {}
        for op, s in sorted(self._stats.items()):
            if not (s.hits or s.misses or s.entries or s.invalidations):
                continue  # a site that exists but was never called (turbo_torch.cos, say)
            d = s.as_dict()
            d["native"] = native.get(op, 0)
            out[op] = d
        return out

    def clear(self):
        """Forget every entry (live sites drop theirs on their next call) and the statistics."""
        self.epoch += 1
        self._stats = {}


CACHE = DispatchCache()


cdef class Site:
    """One call site's inline cache: a monomorphic fast slot backed by a small table.

    An entry is whatever the resolver returned for a key; it is used only for that exact key,
    within the cache epoch it was made in, and only while ``valid(entry)`` holds.
    """
    cdef public str op
    cdef object resolver
    cdef object last_key
    cdef object last_entry
    cdef dict table
    cdef long epoch
    cdef OpStats stats

    def __init__(self, str op, resolver):
        self.op = op
        self.resolver = resolver
        self.last_key = None
        self.last_entry = None
        self.table = {}
        self.epoch = CACHE.epoch
        self.stats = CACHE.stats(op)

    cpdef object lookup(self, object owner, object key):
        cdef object entry
        if self.epoch != CACHE.epoch:
            self._reset()
        if self.last_key is not None and (self.last_key is key or self.last_key == key):
            self.stats.hits += 1
            return self.last_entry
        entry = self.table.get(key)
        if entry is not None:
            self.stats.hits += 1
        else:
            self.stats.misses += 1
            entry = self.resolver(owner, key)
            if len(self.table) >= CACHE.max_entries_per_site:
                # A call site that sees many signatures keeps only the recent ones.
                self.table.pop(next(iter(self.table)))
                self.stats.invalidations += 1
                self.stats.entries -= 1
            self.table[key] = entry
            self.stats.entries += 1
        self.last_key = key
        self.last_entry = entry
        return entry

    cpdef invalidate(self):
        """Drop every entry: what they were resolved against has changed."""
        self.stats.invalidations += len(self.table)
        self.stats.entries -= len(self.table)
        self.table.clear()
        self.last_key = None
        self.last_entry = None

    cdef _reset(self):
        # clear() zeroed the statistics; the entries made before it are simply gone.
        self.stats = CACHE.stats(self.op)
        self.table.clear()
        self.last_key = None
        self.last_entry = None
        self.epoch = CACHE.epoch

    def __len__(self):
        return len(self.table)

    def __dealloc__(self):
        try:
            if self.stats is not None and self.epoch == CACHE.epoch:
                self.stats.entries -= len(self.table)
        except Exception:  # interpreter shutdown: the module's globals are already gone
            pass


cpdef object tensor_key(object x):
    """(shape, stride, dtype, device, requires_grad) of a strided tensor; None for anything else."""
    if type(x) is not _Tensor or x.layout is not _strided:
        return None
    return (x.shape, x.stride(), x.dtype, x.device, x.requires_grad)


cpdef object call_key(object x):
    """The dispatch key of a one-tensor call: the tensor's signature plus the grad mode."""
    cdef object tk = tensor_key(x)
    if tk is None:
        return None
    return (tk, _is_grad_enabled(), _is_inference())


# -- module calls -------------------------------------------------------------------------------
cpdef bint hooks_free(object module):
    """True when ``nn.Module.__call__`` would call ``forward`` directly with nothing around it."""
    cdef dict d = module.__dict__
    if d.get("_forward_hooks") or d.get("_forward_pre_hooks") or d.get("_backward_hooks") \
            or d.get("_backward_pre_hooks") or d.get("_compiled_call_impl") is not None \
            or "forward" in d:
        return False
    return True


cdef inline bint _globals_free():
    return not (_G["_global_forward_hooks"] or _G["_global_forward_pre_hooks"]
                or _G["_global_backward_hooks"] or _G["_global_backward_pre_hooks"])


cpdef bint fast_ok(object module):
    """The whole fast-path condition: no hook anywhere, not tracing, cache enabled."""
    return CACHE.enabled and _globals_free() and not _is_tracing() and hooks_free(module)


cpdef object run_steps(tuple steps, object x):
    """Run a resolved plan: each step is (kind, child, a, b); a hook on a child means a generic call."""
    cdef tuple step
    cdef int kind
    cdef object child, w
    cdef dict params
    for step in steps:
        kind = step[0]
        child = step[1]
        if kind == K_CALL:
            x = child(x)
        elif kind == K_LINEAR_RELU:
            params = step[2]
            w = params.get("weight")
            if w is None or not hooks_free(child) or not hooks_free(step[3]) \
                    or "weight" in child.__dict__ or "bias" in child.__dict__:
                x = step[3](child(x))
            else:
                x = _relu_(_linear(x, w, params.get("bias")))
        elif not hooks_free(child):
            x = child(x)
        elif kind == K_LINEAR:
            params = step[2]
            w = params.get("weight")
            if w is None or "weight" in child.__dict__ or "bias" in child.__dict__:
                x = child(x)
            else:
                x = _linear(x, w, params.get("bias"))
        elif kind == K_UNARY:
            x = step[2](x)
        elif kind == K_UNARY_ARG:
            x = step[2](x, child.__dict__[step[3]])
        # K_IDENTITY: nothing
    return x


# leaf kinds of a module type (see resolve.resolve_type)
cdef enum:
    T_FORWARD = 0       # module.forward(*args, **kwargs)
    T_LINEAR = 1        # linear(x, W, b)
    T_UNARY = 2         # fn(x)
    T_UNARY_ATTR = 3    # fn(x, module.<attr>)
    T_SEQUENTIAL = 4    # a cached plan of the children

cdef dict _NAT = _native_mod._state
cdef int _NAT_DECIDED_TORCH = _native_mod.TORCH  # states below it may run natively (COLD, TRIAL, NATIVE)
cdef dict _TYPES = {}
cdef object _resolve_type = None
cdef object _resolve_sequential = None
SITE_ATTR = "_tb_site_compiled"


def set_resolvers(resolve_type, resolve_sequential):
    """Install the (shared, pure-Python) resolvers and forget what they resolved before."""
    global _resolve_type, _resolve_sequential
    _resolve_type = resolve_type
    _resolve_sequential = resolve_sequential
    _TYPES.clear()


cdef inline bint _same_children(tuple children, tuple types, object modules):
    """The container still holds exactly these children, of these types (no tuples built)."""
    cdef Py_ssize_t i = 0
    cdef object c
    if len(modules) != len(children):
        return False
    for c in modules.values():
        if c is not children[i] or type(c) is not types[i]:
            return False
        i += 1
    return True


cpdef object module_call(object module, tuple args, dict kwargs):
    """``module(*args, **kwargs)``, skipping ``nn.Module.__call__`` when nothing observes the call."""
    cdef tuple handler
    cdef int kind
    cdef object x, site, entry, children
    if not (CACHE.enabled and _globals_free() and not _is_tracing() and hooks_free(module)):
        return _generic_call(module, *args, **kwargs)
    cls = type(module)
    handler = _TYPES.get(cls)
    if handler is None:
        handler = _resolve_type(cls)
        _TYPES[cls] = handler
    kind = handler[0]
    if kind == T_FORWARD or kwargs or len(args) != 1:
        return module.forward(*args, **kwargs)
    x = args[0]
    if kind == T_LINEAR:
        params = module._parameters
        w = params.get("weight")
        if w is None or "weight" in module.__dict__ or "bias" in module.__dict__:
            return module.forward(x)
        return _linear(x, w, params.get("bias"))
    if type(x) is not _Tensor:  # a subclass may override __torch_function__: keep its forward
        return module.forward(x)
    if kind == T_UNARY:
        return handler[1](x)
    if kind == T_UNARY_ATTR:
        return handler[1](x, module.__dict__[handler[2]])
    # T_SEQUENTIAL
    key = call_key(x)
    if key is None:
        return module.forward(x)
    site = module.__dict__.get(SITE_ATTR)
    if site is None:
        site = Site("nn.Sequential", _resolve_sequential)
        module.__dict__[SITE_ATTR] = site
    entry = (<Site>site).lookup(module, key)
    if not _same_children(<tuple>entry[0], <tuple>entry[1], module._modules):
        # The container changed since this plan was made: resolve against what it holds now.
        (<Site>site).invalidate()
        entry = (<Site>site).lookup(module, key)
    nat = entry[3]
    if nat is not None and _NAT["enabled"]:
        fast = nat.fast
        if fast is not None:
            y = native_fast(<tuple>fast, x)
            if y is _STALE:
                nat.stale()
            elif y is not None:
                return y
        elif nat.state < _NAT_DECIDED_TORCH:
            return nat.call(x, entry[2], run_steps, hooks_free, native_fast)
    return run_steps(entry[2], x)


# -- the native decision of a Sequential entry (tb_cython_dispatch.native) ----------------------
cdef object _f32 = torch.float32
cdef object _fn_mode = torch._C._is_torch_function_mode_enabled
cdef object _dispatch_depth = torch._C._len_torch_dispatch_stack
cdef object _profiling = torch._C._autograd._profiler_enabled
cdef object _STALE = _native_mod.STALE


cpdef object native_fast(tuple parts, object x):
    """One native call of a prepared Sequential entry; None when PyTorch would observe or record
    something (then the caller runs the ATen steps), STALE when the parameters no longer fit.

    The tensors go to the engine's prepared program (``program.run``, tb-core's
    ``torchburn.interop.PreparedProgram``), which checks each one's dtype, device, sizes and
    strides against what it was prepared for and refuses a mismatch with ``ValueError``."""
    cdef object run = parts[0]
    cdef object child, t
    cdef dict params, d
    cdef bint grad = parts[6]
    cdef list tensors
    if _fn_mode() or _dispatch_depth() or _profiling():
        return None
    for child in <tuple>parts[2]:
        if not hooks_free(child):
            return None
    tensors = [x]
    for child in <tuple>parts[1]:
        d = child.__dict__
        if "weight" in d or "bias" in d:
            return None
        params = d["_parameters"]
        t = params.get("weight")
        if t is None or (grad and t.requires_grad):
            return None
        tensors.append(t)
        t = params.get("bias")
        if t is not None:
            if grad and t.requires_grad:
                return None
            tensors.append(t)
    try:
        return run(tensors)[0]
    except ValueError:
        return _STALE


# -- compiled plans -----------------------------------------------------------------------------
cdef class PlanRunner:
    """A partition plan as a typed loop over pre-resolved callables and pre-bound argument slots.

    Each step is (fn, arg_kinds, arg_values, kw_names, kw_kinds, kw_values, release): kind 0 is a
    literal, 1 a slot, 2 a list of slots/literals (``spec`` tuples of (kind, value)). ``release``
    lists the slots whose last reader is this step, so intermediates are freed as early as
    eager PyTorch frees them.
    """
    cdef list _steps
    cdef int _n_slots
    cdef int _n_inputs
    cdef tuple _constants
    cdef tuple _out_kinds
    cdef tuple _out_values
    cdef bint _single

    def __init__(self, list steps, int n_slots, int n_inputs, tuple constants, tuple out_kinds,
                 tuple out_values, bint single):
        self._steps = steps
        self._n_slots = n_slots
        self._n_inputs = n_inputs
        self._constants = constants
        self._out_kinds = out_kinds
        self._out_values = out_values
        self._single = single

    def __call__(self, *inputs):
        cdef list values = [None] * self._n_slots
        cdef Py_ssize_t i, j, n
        cdef tuple step, kinds, vals, release
        cdef object fn
        cdef list args
        cdef dict kwargs
        if len(inputs) != self._n_inputs:
            raise TypeError(f"this compiled partition takes {self._n_inputs} inputs, got {len(inputs)}")
        for i in range(self._n_inputs):
            values[i] = inputs[i]
        n = self._n_inputs
        for i in range(len(self._constants)):
            values[n + i] = self._constants[i]
        n = n + len(self._constants)
        for step in self._steps:
            fn = step[0]
            kinds = step[1]
            vals = step[2]
            args = [None] * len(kinds)
            for j in range(len(kinds)):
                args[j] = _bind(<int>kinds[j], vals[j], values)
            if step[3]:
                kwargs = {}
                kinds = step[4]
                vals = step[5]
                for j in range(len(kinds)):
                    kwargs[step[3][j]] = _bind(<int>kinds[j], vals[j], values)
                values[n] = fn(*args, **kwargs)
            else:
                values[n] = fn(*args)
            release = step[6]
            for j in range(len(release)):
                values[<Py_ssize_t>release[j]] = None
            n += 1
        kinds = self._out_kinds
        vals = self._out_values
        if self._single:
            return _bind(<int>kinds[0], vals[0], values)
        return tuple([_bind(<int>kinds[j], vals[j], values) for j in range(len(kinds))])


cdef inline object _bind(int kind, object value, list values):
    if kind == 0:
        return value
    if kind == 1:
        return values[<Py_ssize_t>value]
    cdef list out = []
    cdef tuple item
    for item in value:
        out.append(_bind(<int>item[0], item[1], values))
    return out if kind == 2 else tuple(out)


# -- unary functions (turbo_torch.sin & co., tb_cython_dispatch.native_unary) -------------------
cdef object _functorch_active = torch._C._are_functorch_transforms_active
cdef object _fwd_ad = torch.autograd.forward_ad
cdef bint _NAMED = hasattr(torch.Tensor, "has_names")  # named tensors (gone in newer torch)
cdef int _NAT_NATIVE = _native_mod.NATIVE


cpdef object unary_native(object kernel, object x, object fn):
    """op(x) by the engine's eager kernel (a fresh tensor); ``fn(x)`` if the kernel refuses x."""
    try:
        return kernel(x)
    except (ValueError, TypeError):
        return fn(x)


cpdef object unary_call(Site site, object fn, object x):
    """``fn(x)`` for a torch unary function, natively when the call's entry decided so.

    The entry (by element count) is looked up first, so a signature decided for PyTorch pays
    only that lookup; the full "nothing would observe this" check runs only before native calls.
    """
    cdef object nat
    cdef int state
    if not CACHE.enabled or type(x) is not _Tensor or _is_tracing():  # traced: numel() is a tensor
        return fn(x)
    nat = (<tuple>site.lookup(None, x.numel()))[0]
    if nat is None:
        return fn(x)
    state = nat.state
    if state >= _NAT_DECIDED_TORCH or not _NAT["enabled"]:
        return fn(x)
    if (x.requires_grad and _is_grad_enabled()) or x.dtype is not _f32 or x.layout is not _strided \
            or not x.is_cpu or not x.is_contiguous() or x.is_neg() or (_NAMED and x.has_names()) \
            or _fn_mode() or _dispatch_depth() or _profiling() or _functorch_active() \
            or _fwd_ad._current_level >= 0:
        return fn(x)
    if state == _NAT_NATIVE:
        return unary_native(nat.kernel, x, fn)
    return nat.call(x, fn, unary_native)
