"""The engine protocol (000 "Engines and engine configurations"; 002 ch. 9
CUDNN_BACKEND_ENGINE_DESCRIPTOR, ENGINECFG, EXECUTION_PLAN, VARIANT_PACK).

An engine answers ``check_support(graph, place)`` with None or a plain-language
reason, and ``build(graph, config)`` with an ExecutionPlan.  A plan knows its
workspace size and runs on a VariantPack: a dict uid -> buffer (a strided NumPy
view on the CPU place, a strided CuPy array on the GPU place; by-value tensors
are Python or NumPy scalars).
"""
from __future__ import annotations

from dataclasses import dataclass, field


class EngineDeclined(Exception):
    """An engine cannot run a graph (or failed while running it); ``reason`` says why."""

    def __init__(self, engine: str, reason: str):
        super().__init__(f"{engine}: {reason}")
        self.engine = engine
        self.reason = reason


@dataclass(frozen=True)
class EngineConfig:
    """CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: an engine plus knob choices and behaviour notes."""

    engine: str
    knobs: tuple = ()  # ((name, value), ...)
    notes: frozenset = frozenset()  # e.g. {'DETERMINISTIC', 'TENSOR_CORE', 'RUNTIME_COMPILATION'}
    index: int = 0  # the engine's global index

    def knob(self, name, default=None):
        return dict(self.knobs).get(name, default)

    def __str__(self):
        k = ",".join(f"{n}={v}" for n, v in self.knobs)
        return f"{self.engine}#{self.index}" + (f"[{k}]" if k else "")


def device_views(graph, data: dict) -> None:
    """Replace the raw device-pointer ints in ``data`` (what plans with ``raw_pointers`` are
    bound with) by strided CuPy views of ``graph``'s tensors, as the legacy layer's ``bind``
    makes them: what an engine that takes arrays needs when it runs after such a plan failed."""
    import cupy
    from .. import dtypes
    tensors = {t.uid: t for t in graph.external_inputs() + graph.external_outputs()}
    for uid, buf in list(data.items()):
        t = tensors.get(uid)
        if type(buf) is int and t is not None and not t.is_by_value:
            storage = dtypes.storage_dtype(t.dtype)
            span = (1 + sum((d - 1) * s for d, s in zip(t.dims, t.strides))) * storage.itemsize
            mem = cupy.cuda.UnownedMemory(buf, span, None)
            data[uid] = cupy.ndarray(t.dims, dtype=storage, memptr=cupy.cuda.MemoryPointer(mem, 0),
                                     strides=tuple(s * storage.itemsize for s in t.strides))


# -- the stream of a call whose handle has none ----------------------------------------------------
# STREAM_PTR[0]() -> the current CuPy stream's handle (made on first use; the CPU tests' stand-ins
# put their own function here)
STREAM_PTR: list = [None]


def current_stream_function():
    """The function giving the stream a call runs on when its handle has none (cudnnSetStream
    never called, or given 0/None): CuPy's current stream (the legacy default stream unless the
    program made another current), for every engine, so that one handle's calls stay in order
    whichever engine runs each (docs/conventions.md "Handles and descriptors")."""
    f = STREAM_PTR[0]
    if f is None:
        import cupy
        get = cupy.cuda.get_current_stream
        f = STREAM_PTR[0] = lambda: get().ptr
        # what compiled callers take (``_steady.c`` stream_of): CuPy's C function for the pointer, or
        # the stream object itself (its .ptr read)
        f.stream = current_stream_capsule() or get
    return f


def current_stream_capsule():
    """CuPy's own C function giving the current stream's pointer (``cupy_backends.cuda.stream``'s
    exported ``get_current_stream_ptr``: the per-thread, per-device slot that
    ``cupy.cuda.Stream.use`` and ``with stream:`` set, and CuPy's kernels launch on), as the
    capsule Cython exports it; None where this CuPy has none of that signature.  The compiled
    launchers call it instead of ``get_current_stream()`` and ``.ptr`` (no Python call)."""
    import ctypes
    try:
        from cupy_backends.cuda import stream as backend
        cap = backend.__pyx_capi__["get_current_stream_ptr"]
        # a private prototype (not ctypes.pythonapi.PyCapsule_GetName's restype/argtypes, which are
        # the whole process's); PYFUNCTYPE: called with the GIL held, a set exception raised
        name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
        return cap if name(cap) == b"intptr_t (void)" else None
    except (ImportError, AttributeError, KeyError, TypeError, ValueError):
        return None


def current_stream() -> int:
    """``current_stream_function()()``."""
    return current_stream_function()()


class VariantPack:
    """CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: uid -> data buffer, plus workspace.  A plain
    slotted class (made once per legacy call; a frozen dataclass's __init__ costs 3x more)."""

    __slots__ = ("data", "workspace", "workspace_size")

    def __init__(self, data: dict, workspace: object = None, workspace_size: int = 0):
        self.data = data
        self.workspace = workspace
        self.workspace_size = workspace_size

    def __repr__(self):
        return f"VariantPack(data={self.data!r}, workspace={self.workspace!r}, workspace_size={self.workspace_size!r})"


class ExecutionPlan:
    """CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR.

    Every field a plan carries is declared here (``__slots__``): what the engine gives it, and
    what the planner and the plan cache keep on it, each set by the one module named beside it;
    what the layers above keep per plan goes in ``annex`` (a dict keyed by the owning module's
    name: the legacy layer's binding program, tools.fuse's statics).  An engine's plan class
    declares its own fields in its own ``__slots__``; setting any other attribute raises
    AttributeError (tests/test_plan_state.py).

    The engine's side of a prepared call (``_backend.prepared``; issue 26): ``launch_order``, the
    uids whose values ``launch(values, stream, workspace, workspace_size)`` takes (device
    pointers as ints for the caller's buffers, then by-value scalars), and ``launch``, which runs
    a cached call from them and returns True, or returns False having done nothing (no record
    yet, a pointer it cannot take...) so that ``execute`` runs it.  The default has no launcher.
    ``raw_pointers``: the plan may be bound with device pointers as ints."""

    __slots__ = (
        "graph", "config", "workspace_size",  # the engine's build
        "place", "declines",  # planner.make_plan / graph_api.api: where it runs, engines passed over (explain, trace)
        "cpu_fallback",  # planner._check_cpu_fallback: the reference engine ran a GPU-place call
        "failures",  # planner._replan: [(engine, reason)] of the engines that failed at execute
        "last_time",  # planner.execute: seconds of the last general execute (trace)
        "_users", "retired", "_released",  # plan_cache.acquire/done/retire: running calls, evicted (a prepared
        # call of it is stale), freed
        "annex",  # the layers above: {owning module: what it keeps per plan}
        "__weakref__",
    )

    raw_pointers = False
    launch_order = ()

    def __init__(self, graph, config: EngineConfig, workspace_size: int = 0):
        self.graph = graph
        self.config = config
        self.workspace_size = workspace_size
        self.place = None
        self.declines = []
        self.cpu_fallback = False
        self.failures = []
        self.last_time = None
        self._users = 0
        self.retired = self._released = False
        self.annex = {}

    @property
    def engine(self) -> str:
        return self.config.engine

    def launch(self, values: tuple, stream, workspace=None, workspace_size: int = 0) -> bool:
        """Run a cached call from ``values`` (in ``launch_order``); False: not run, ``execute`` it."""
        return False

    def execute(self, pack: VariantPack, stream=None) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def release(self) -> None:
        """Free engine resources when the plan leaves the cache."""


class Engine:
    name = "?"
    places = ("cpu",)  # where its plans run: 'cpu' and/or 'gpu'

    def available(self) -> "str | None":
        """None when usable on this machine, else the reason it is not."""
        return None

    def configs(self, graph, place: str, mode: str) -> list:
        """Engine configs for ``graph`` in preference order (heuristics query)."""
        return [EngineConfig(self.name, notes=frozenset({"DETERMINISTIC"}))]

    def check_support(self, graph, place: str) -> "str | None":
        return None

    def op_kinds(self) -> "dict | None":
        """{op kind: None (it runs graphs of that kind, within its per-graph limits) | the reason it
        declines every graph with that kind}, over every kind of ``ops.OP_SPECS``; None: undeclared.
        The one statement of what an engine runs (doctor --ops, explain, docs/api.md)."""
        return None

    def build(self, graph, config: EngineConfig) -> ExecutionPlan:  # pragma: no cover
        raise NotImplementedError


@dataclass
class EngineRegistry:
    """The engines, by name, and the order heuristics tries them in per place.

    ``register(engine, priority={place: number})`` adds an engine; on each place it names, the
    engines run in descending priority (ties by name), and ``order[place]`` (``heuristics.ORDER``,
    the same dict) is rebuilt from the priorities.  An engine registered without a priority (a
    test's) is known by name (``CUDNN_COMPAT_ENGINE``, a patched ``ORDER``) but in no order.
    ``engines`` lists the engines with a priority first, as ``names()`` does (whatever order
    they were imported in), then the others as registered."""
    engines: dict = field(default_factory=dict)
    priorities: dict = field(default_factory=dict)  # engine name -> {place: priority}
    order: dict = field(default_factory=dict)  # place -> (engine name, ...) in the order tried

    def register(self, engine: Engine, priority: "dict | None" = None):
        """Add ``engine``; ``priority`` {place: number}, higher tried first, each place one of
        ``engine.places``.  Returns the engine."""
        priority = dict(priority or {})
        for place, p in priority.items():
            if place not in engine.places:
                raise ValueError(f"engine {engine.name!r}: priority for the {place!r} place, "
                                 f"but it runs on {', '.join(engine.places)} only")
            if not isinstance(p, (int, float)) or isinstance(p, bool):
                raise TypeError(f"engine {engine.name!r}: priority on {place!r} must be a number, got {p!r}")
        self.engines[engine.name] = engine
        if priority or engine.name in self.priorities:
            old = self.priorities.get(engine.name, {})
            if priority:
                self.priorities[engine.name] = priority
            else:
                self.priorities.pop(engine.name, None)
            for place in set(old) | set(priority):
                self.order[place] = self.ranked(place)
            ranked = self.names()
            items = [(n, self.engines[n]) for n in ranked if n in self.engines]
            items += [(n, e) for n, e in self.engines.items() if n not in self.priorities]
            self.engines.clear()
            self.engines.update(items)
        return engine

    def ranked(self, place: str) -> tuple:
        """The names of the engines with a priority on ``place``, highest first (ties by name)."""
        ranked = [(-pr[place], n) for n, pr in self.priorities.items() if place in pr]
        return tuple(n for _, n in sorted(ranked))

    def names(self) -> tuple:
        """Every engine with a priority somewhere, the most general first: ascending by its highest
        priority (the CPU reference engine, then the GPU engines from the last tried to the first)."""
        return tuple(n for _, n in sorted((max(pr.values()), n) for n, pr in self.priorities.items()))


REGISTRY = EngineRegistry()
