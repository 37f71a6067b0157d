/* The steady path of a prepared call, compiled (issue 26 item 8; docs/architecture.md "One call, end
 * to end", step 6).  An optional accelerator: every object here has a Python twin that runs where
 * this module is not built, and tests/test_steady.py checks each pair against each other.
 *
 *   Values(entries, order, nd, pointer_min)
 *       the values binder of a plan (Python twin: the source _core/fastbind.py generates): per
 *       tensor the same test (type is nd, dtype identity or membership in the accepted set, C or F
 *       contiguity, nbytes at least the span; or a device pointer int >= pointer_min), giving the
 *       values in the plan's launch order; None on the first buffer of another form or a missing
 *       tensor or scalar (the general binding then binds, and raises what it raises).
 *         entries: ((uid, mode, alt, need, storage dtype, accepted dtypes), ...) in binding order;
 *                  mode 0: tensors[uid][0] must be there; mode 1: a prior output the caller may omit,
 *                  then entry ``alt``'s pointer; mode 2: the same, then tensors[alt][0]
 *         order:   ((0, entry index) | (1, scalar uid), ...)
 *
 *   Launcher(records, slots, align, guards, cur, counter, direct, env, key, overrides, fallback,
 *            lock, launch_address, error)
 *       (cur() gives the current stream's handle, or the stream object: its .ptr)
 *       a cupy plan's launch(values, stream, workspace=None, workspace_size=0) -> bool (Python twin:
 *       cupy_engine/records.py FastPath.launcher), for the record path: pick the record of (stream,
 *       alignment), refuse overlapping guarded pairs, patch the variable slots, cuLaunchKernel each
 *       launch.  With the graph table in use (CUDNN_COMPAT_CUPY_GRAPHS set) or the plan's lock held
 *       by another thread it calls ``fallback`` (the Python launcher) with the same arguments.
 *         records: the FastPath's dict (stream, alignment outcome) -> (buffer, launches, n, fires)
 *         slots:   ((values index, 'Q' | 'f' | 'd'), ...): the record's variable slots, 8 bytes each
 *
 *   Replay(state, cur, capturing, stats, fallback, graph_launch_address, error, given)
 *       a cudnn plan's launch(values, stream, workspace=None, workspace_size=0) -> bool (Python twin:
 *       cudnn_engine/plan.py CudnnPlan.launch_py, its fallback): a call whose CUDA graph was captured
 *       is one lookup in the plan's replay table and one cuGraphLaunch, or the graph's launches
 *       (a Kernels in the table).
 *
 *   Kernels(records_address, count, keep, addresses, error)
 *       a captured graph replayed as its kernel launches (engines/graphs.py kernels_of); no twin.
 *
 *   Run, Site: _core.call.run's prepared part and a legacy function's recipe replay (below); a
 *   Site's replay keeps per key a Settled (no constructor from Python; ``bump()`` makes them stale).
 *
 * Nothing here releases the GIL, so a record found in ``records`` stays alive (and its buffers with
 * it) for the whole call.  The launch function is given as an address (cuLaunchKernel's, or the
 * recording stubs below in tests; cuGraphLaunch's for Replay), so this file links against nothing but Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030B0000
#define PyFloat_Pack4 _PyFloat_Pack4
#endif

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shm, void *stream, void **params, void **extra);

static PyObject *S_dtype, *S_c, *S_f, *S_nbytes, *S_data, *S_ptr;
static PyObject *S_ws, *S_wss, *S_warg, *S_switch, *S_place, *S_owner, *S_device, *S_plan, *S_retired, *S_stream, *S_bind, *S_via, *S_launch,
                *S_calls, *S_key, *S_wsize;

static PyObject *ZERO, *ONE;  /* the ints 0 and 1 */

/* PyLong_AsUnsignedLongLong of an int (the same value, or -1 with its error), without its byte-array
 * path for the common case, an int in [0, 2**63) (a device pointer) */
static unsigned long long as_u64(PyObject *v) {
    if (!PyLong_Check(v)) return PyLong_AsUnsignedLongLong(v);  /* its TypeError */
    int overflow;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (!overflow && n >= 0) return (unsigned long long)n;
    if (n == -1 && PyErr_Occurred()) return (unsigned long long)-1;
    return PyLong_AsUnsignedLongLong(v);
}

/* a NULL buffer argument, as the legacy layer reads one: None or the int 0 */
static int is_null(PyObject *v) { return v == Py_None || (PyLong_CheckExact(v) && PyObject_Not(v) == 1); }

/* Every object here is a vectorcall object of a struct T with a ``vc`` slot and T_vcall, T_dealloc,
 * T_traverse, T_clear, T_init: STEADY_NEW(T) is its tp_new, STEADY_TYPE(T, flags, doc, ...) its type
 * (the ... adds slots: getset and the like). */
static PyObject *vc_call(PyObject *self, PyObject *args, PyObject *kw) { return PyVectorcall_Call(self, args, kw); }

#define STEADY_NEW(T) \
    static PyObject *T##_vcall(T *self, PyObject *const *args, size_t nargsf, PyObject *kwnames); \
    static PyObject *T##_new(PyTypeObject *type, PyObject *args, PyObject *kw) { \
        T *self = (T *)type->tp_alloc(type, 0); \
        if (self) self->vc = (vectorcallfunc)T##_vcall; \
        return (PyObject *)self; \
    }

#define STEADY_TYPE(T, flags, doc, ...) \
    static PyTypeObject T##Type = { \
        PyVarObject_HEAD_INIT(NULL, 0) \
        .tp_name = "cudnn_compat._backend._steady." #T, \
        .tp_basicsize = sizeof(T), \
        .tp_dealloc = (destructor)T##_dealloc, \
        .tp_vectorcall_offset = offsetof(T, vc), \
        .tp_call = vc_call, \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC | (flags), \
        .tp_traverse = (traverseproc)T##_traverse, \
        .tp_clear = (inquiry)T##_clear, \
        .tp_doc = doc, \
        .tp_init = (initproc)T##_init, \
        .tp_new = T##_new, \
        __VA_ARGS__ \
    };

/* STEADY_GC(T, FIELDS): T_traverse, T_clear and T_dealloc of a type whose references are the fields
 * FIELDS(X) lists (X(field) for each) */
#define STEADY_VISIT(f) Py_VISIT(self->f);
#define STEADY_CLEAR(f) Py_CLEAR(self->f);
#define STEADY_GC(T, FIELDS) \
    static int T##_traverse(T *self, visitproc visit, void *arg) { FIELDS(STEADY_VISIT) return 0; } \
    static int T##_clear(T *self) { FIELDS(STEADY_CLEAR) return 0; } \
    static void T##_dealloc(T *self) { \
        PyObject_GC_UnTrack(self); \
        T##_clear(self); \
        Py_TYPE(self)->tp_free((PyObject *)self); \
    }

/* ---------------------------------------------------------------------------------------------- */
/* Values                                                                                         */

typedef struct {
    PyObject *uid;      /* the tensors dict key */
    int mode;
    Py_ssize_t alt_index; /* mode 1 */
    PyObject *alt_uid;  /* mode 2 */
    Py_ssize_t need;
    PyObject *storage;
    PyObject *accepted;
    PyObject *memo;     /* id(array) -> (weakref to it, its pointer): the arrays this entry took (MEMO_MAX) */
} Entry;

/* The memo of a values binder: a C-contiguous array of the nd type that passed an entry's test passes
 * it for as long as it lives, since what the test reads of it cannot change: CuPy's ndarray has no
 * setter for dtype, data or strides, its size is fixed, and its one setter, shape, keeps a
 * C-contiguous array C-contiguous (a no-copy reshape).  The weakref tells a live array from a new
 * one at a freed one's address; nothing keeps an array alive. */
#define MEMO_MAX 64

typedef struct {
    PyObject_HEAD
    Py_ssize_t n, norder;
    Entry *e;
    int *okind;          /* 0: entry, 1: scalar */
    Py_ssize_t *oidx;
    PyObject **ouid;
    PyObject *nd;
    long long pointer_min;
    PyObject *spec;      /* (entries, order): kept for repr and the tests */
    vectorcallfunc vc;
} Values;

static int Values_traverse(Values *self, visitproc visit, void *arg) {
    Py_VISIT(self->nd); Py_VISIT(self->spec);
    for (Py_ssize_t i = 0; i < self->n; i++) {
        Py_VISIT(self->e[i].uid); Py_VISIT(self->e[i].alt_uid); Py_VISIT(self->e[i].storage); Py_VISIT(self->e[i].accepted);
        Py_VISIT(self->e[i].memo);
    }
    for (Py_ssize_t i = 0; i < self->norder; i++) Py_VISIT(self->ouid[i]);
    return 0;
}

static int Values_clear(Values *self) {
    Py_CLEAR(self->nd); Py_CLEAR(self->spec);
    for (Py_ssize_t i = 0; i < self->n; i++) {
        Py_CLEAR(self->e[i].uid); Py_CLEAR(self->e[i].alt_uid); Py_CLEAR(self->e[i].storage); Py_CLEAR(self->e[i].accepted);
        Py_CLEAR(self->e[i].memo);
    }
    for (Py_ssize_t i = 0; i < self->norder; i++) Py_CLEAR(self->ouid[i]);
    self->n = self->norder = 0;
    return 0;
}

static void Values_dealloc(Values *self) {
    PyObject_GC_UnTrack(self);
    Values_clear(self);
    PyMem_Free(self->e); PyMem_Free(self->okind); PyMem_Free(self->oidx); PyMem_Free(self->ouid);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

STEADY_NEW(Values)

static int Values_init(Values *self, PyObject *args, PyObject *kw) {
    PyObject *entries, *order, *nd;
    long long pmin;
    if (!PyArg_ParseTuple(args, "O!O!OL", &PyTuple_Type, &entries, &PyTuple_Type, &order, &nd, &pmin)) return -1;
    if (self->e) { PyErr_SetString(PyExc_TypeError, "Values is initialized once"); return -1; }
    Py_ssize_t n = PyTuple_GET_SIZE(entries), no = PyTuple_GET_SIZE(order);
    self->e = PyMem_Calloc(n ? n : 1, sizeof(Entry));
    self->okind = PyMem_Calloc(no ? no : 1, sizeof(int));
    self->oidx = PyMem_Calloc(no ? no : 1, sizeof(Py_ssize_t));
    self->ouid = PyMem_Calloc(no ? no : 1, sizeof(PyObject *));
    if (!self->e || !self->okind || !self->oidx || !self->ouid) { PyErr_NoMemory(); return -1; }
    self->n = n; self->norder = no;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(entries, i), *uid, *alt, *storage, *acc;
        int mode;
        Py_ssize_t need;
        if (!PyArg_ParseTuple(t, "OiOnOO", &uid, &mode, &alt, &need, &storage, &acc)) return -1;
        if (mode < 0 || mode > 2) { PyErr_SetString(PyExc_ValueError, "entry mode must be 0, 1 or 2"); return -1; }
        Entry *e = &self->e[i];
        e->mode = mode; e->need = need;
        if (mode == 1) {
            e->alt_index = PyLong_AsSsize_t(alt);
            if (e->alt_index == -1 && PyErr_Occurred()) return -1;
            if (e->alt_index < 0 || e->alt_index >= i) {
                PyErr_SetString(PyExc_ValueError, "a mode-1 entry names an earlier entry"); return -1;
            }
        } else if (mode == 2) {
            Py_INCREF(alt); e->alt_uid = alt;
        }
        Py_INCREF(uid); e->uid = uid;
        Py_INCREF(storage); e->storage = storage;
        Py_INCREF(acc); e->accepted = acc;
        if (!(e->memo = PyDict_New())) return -1;
    }
    for (Py_ssize_t k = 0; k < no; k++) {
        PyObject *t = PyTuple_GET_ITEM(order, k), *x;
        int kind;
        if (!PyArg_ParseTuple(t, "iO", &kind, &x)) return -1;
        self->okind[k] = kind;
        if (kind == 0) {
            self->oidx[k] = PyLong_AsSsize_t(x);
            if (self->oidx[k] < 0 || self->oidx[k] >= n) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "order names no entry");
                return -1;
            }
        } else if (kind == 1) {
            Py_INCREF(x); self->ouid[k] = x;
        } else {
            PyErr_SetString(PyExc_ValueError, "order kind must be 0 or 1"); return -1;
        }
    }
    Py_INCREF(nd); self->nd = nd;
    self->pointer_min = pmin;
    self->spec = PyTuple_Pack(2, entries, order);
    return self->spec ? 0 : -1;
}

/* tensors[key][0] (a borrowed reference); NULL without an error when the key is missing, Py_None when the
 * item is no tuple (the general binding decides) */
static PyObject *given(PyObject *tensors, PyObject *key) {
    PyObject *t = PyDict_GetItemWithError(tensors, key);
    if (t == NULL) return NULL;
    if (PyTuple_Check(t) && PyTuple_GET_SIZE(t) > 0) return PyTuple_GET_ITEM(t, 0);
    return Py_None;
}

static PyObject *array_pointer(Entry *e, PyObject *b, int *c_order);

/* whether weak reference ``ref`` refers to ``b`` (b alive: it cannot be a dead reference's) */
static int weak_is(PyObject *ref, PyObject *b) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *o = NULL;
    if (PyWeakref_GetRef(ref, &o) < 0) { PyErr_Clear(); return 0; }
    Py_XDECREF(o);
    return o == b;
#else
    return PyWeakref_GetObject(ref) == b;
#endif
}

static int memo_put(Entry *e, PyObject *id, PyObject *b, PyObject *p, PyObject **item);

/* the pointer of buffer ``b`` for entry ``e`` (a new reference), Py_None (borrowed, not counted) when it
 * is of another form, NULL with an error set; *item (when not NULL): the memo's (weakref, pointer)
 * item for ``b`` (borrowed) when it has one, else NULL */
static PyObject *pointer_memo(Values *self, Entry *e, PyObject *b, PyObject **item) {
    if (item) *item = NULL;
    if (self->nd != NULL && Py_TYPE(b) == (PyTypeObject *)self->nd) {
        PyObject *id = PyLong_FromVoidPtr(b);
        if (id == NULL) return NULL;
        PyObject *m = PyDict_GetItemWithError(e->memo, id);
        if (m != NULL && weak_is(PyTuple_GET_ITEM(m, 0), b)) {
            Py_DECREF(id);
            if (item) *item = m;
            PyObject *p = PyTuple_GET_ITEM(m, 1);
            Py_INCREF(p);
            return p;
        }
        if (m == NULL && PyErr_Occurred()) { Py_DECREF(id); return NULL; }
        int c_order = 0;
        PyObject *p = array_pointer(e, b, &c_order);
        if (p != NULL && p != Py_None && c_order && memo_put(e, id, b, p, item) < 0) Py_CLEAR(p);
        Py_DECREF(id);
        return p;
    }
    if (PyLong_CheckExact(b)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(b, &overflow);
        if (v == -1 && PyErr_Occurred()) return NULL;
        if (overflow > 0 || (!overflow && v >= self->pointer_min)) { Py_INCREF(b); return b; }
    }
    return Py_None;
}

static PyObject *pointer_of(Values *self, Entry *e, PyObject *b) { return pointer_memo(self, e, b, NULL); }

/* the entry's test of an array of the nd type: its pointer (a new reference), Py_None (borrowed) when
 * it does not pass, NULL with an error set; *c_order: whether it is C-contiguous */
static PyObject *array_pointer(Entry *e, PyObject *b, int *c_order) {
    PyObject *dt = PyObject_GetAttr(b, S_dtype);
    if (dt == NULL) return NULL;
    int ok = dt == e->storage;
    if (!ok) {
        ok = PySequence_Contains(e->accepted, dt);
        if (ok < 0) { Py_DECREF(dt); return NULL; }
    }
    Py_DECREF(dt);
    if (!ok) return Py_None;
    PyObject *c = PyObject_GetAttr(b, S_c);
    if (c == NULL) return NULL;
    int contig = PyObject_IsTrue(c);
    Py_DECREF(c);
    if (contig < 0) return NULL;
    *c_order = contig;
    if (!contig) {
        PyObject *f = PyObject_GetAttr(b, S_f);
        if (f == NULL) return NULL;
        contig = PyObject_IsTrue(f);
        Py_DECREF(f);
        if (contig < 0) return NULL;
        if (!contig) return Py_None;
    }
    PyObject *nb = PyObject_GetAttr(b, S_nbytes);
    if (nb == NULL) return NULL;
    Py_ssize_t have = PyLong_AsSsize_t(nb);
    Py_DECREF(nb);
    if (have == -1 && PyErr_Occurred()) return NULL;
    if (have < e->need) return Py_None;
    PyObject *mem = PyObject_GetAttr(b, S_data);
    if (mem == NULL) return NULL;
    PyObject *p = PyObject_GetAttr(mem, S_ptr);
    Py_DECREF(mem);
    return p;
}

/* the memo item (weak reference to ``b``, ``p``) of the memos of this file (a new reference), Py_None
 * (borrowed) when ``b``'s type has no weak references (not remembered), NULL with an error set */
static PyObject *weak_item(PyObject *b, PyObject *p) {
    PyObject *ref = PyWeakref_NewRef(b, NULL);
    if (ref == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
        PyErr_Clear();
        return Py_None;
    }
    PyObject *m = PyTuple_Pack(2, ref, p);
    Py_DECREF(ref);
    return m;
}

/* remember that C-contiguous array ``b`` (at ``id``) passed with pointer ``p`` (see MEMO_MAX): 0 (*item,
 * when not NULL: the memo item, borrowed, or NULL when not remembered), or -1 with an error set */
static int memo_put(Entry *e, PyObject *id, PyObject *b, PyObject *p, PyObject **item) {
    PyObject *m = weak_item(b, p);
    if (m == NULL) return -1;
    if (m == Py_None) return 0;
    if (PyDict_GET_SIZE(e->memo) >= MEMO_MAX) PyDict_Clear(e->memo);
    int rc = PyDict_SetItem(e->memo, id, m);
    Py_DECREF(m);  /* the memo holds it */
    if (rc == 0 && item) *item = m;
    return rc;
}

static PyObject *Values_vcall(Values *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "values(tensors, scalars) takes two arguments"); return NULL;
    }
    PyObject *tensors = args[0], *scalars = args[1];
    if (self->spec == NULL) Py_RETURN_NONE;  /* cleared (a cycle the collector broke): binds nothing */
    if (!PyDict_CheckExact(tensors) || !PyDict_CheckExact(scalars)) {
        PyErr_SetString(PyExc_TypeError, "values(tensors, scalars) takes two dicts"); return NULL;
    }
    PyObject *stack[16];
    PyObject **p = self->n <= 16 ? stack : PyMem_Calloc(self->n, sizeof(PyObject *));
    if (p == NULL) return PyErr_NoMemory();
    Py_ssize_t done = 0;
    PyObject *result = NULL;
    for (; done < self->n; done++) {
        Entry *e = &self->e[done];
        PyObject *b = given(tensors, e->uid);
        if (b == NULL) {
            if (PyErr_Occurred()) goto out;
            if (e->mode == 0) goto none;
            if (e->mode == 1) { p[done] = p[e->alt_index]; Py_INCREF(p[done]); continue; }
            b = given(tensors, e->alt_uid);
            if (b == NULL) { if (PyErr_Occurred()) goto out; goto none; }
        }
        if (b == Py_None) goto none;
        PyObject *ptr = pointer_of(self, e, b);
        if (ptr == NULL) goto out;
        if (ptr == Py_None) goto none;
        p[done] = ptr;
    }
    result = PyTuple_New(self->norder);
    if (result == NULL) goto out;
    for (Py_ssize_t k = 0; k < self->norder; k++) {
        PyObject *v;
        if (self->okind[k] == 0) {
            v = p[self->oidx[k]];
        } else {
            v = PyDict_GetItemWithError(scalars, self->ouid[k]);
            if (v == NULL) {
                Py_CLEAR(result);
                if (PyErr_Occurred()) goto out;
                goto none;
            }
        }
        Py_INCREF(v);
        PyTuple_SET_ITEM(result, k, v);
    }
    goto out;
none:
    result = Py_None;
    Py_INCREF(result);
out:
    for (Py_ssize_t i = 0; i < done; i++) Py_DECREF(p[i]);
    if (p != stack) PyMem_Free(p);
    return result;
}

static PyObject *Values_spec(Values *self, void *closure) { PyObject *r = self->spec ? self->spec : Py_None; Py_INCREF(r); return r; }

static PyGetSetDef Values_getset[] = {{"spec", (getter)Values_spec, NULL, "(entries, order) as given", NULL}, {NULL}};

STEADY_TYPE(Values, 0, "Values(entries, order, nd, pointer_min): a plan's values binder (module docstring)",
            .tp_getset = Values_getset)

/* ---------------------------------------------------------------------------------------------- */
/* Launcher                                                                                       */

/* the signature of the C function a ``cur`` capsule holds (the name Cython gives the capsules of a
 * module's exported functions: ``cupy_backends.cuda.stream.__pyx_capi__["get_current_stream_ptr"]``) */
#define CUR_STREAM_SIG "intptr_t (void)"
typedef intptr_t (*cur_stream_fn)(void);

/* the stream a launch goes on (a new reference): ``stream`` when an int, else its .ptr; None: the
 * current stream, from ``cur``: a capsule of CuPy's C function giving its pointer (Python's error
 * indicator set on failure, as Cython's ``except *`` and ``except? -1`` forms report one), or a
 * callable giving its handle or the stream object (its .ptr) */
static PyObject *stream_of(PyObject *cur, PyObject *stream) {
    if (stream == Py_None) {
        if (PyCapsule_CheckExact(cur)) {
            cur_stream_fn f = (cur_stream_fn)PyCapsule_GetPointer(cur, CUR_STREAM_SIG);
            if (f == NULL) return NULL;  /* another signature: its ValueError */
            intptr_t ptr = f();
            if (PyErr_Occurred()) return NULL;
            return PyLong_FromSsize_t((Py_ssize_t)ptr);
        }
        PyObject *cs = PyObject_CallNoArgs(cur);
        if (cs == NULL || PyLong_Check(cs)) return cs;
        PyObject *p = PyObject_GetAttr(cs, S_ptr);
        Py_DECREF(cs);
        return p;
    }
    if (PyLong_CheckExact(stream)) { Py_INCREF(stream); return stream; }
    return PyObject_GetAttr(stream, S_ptr);
}

/* raise ``error(status)`` (the CUDA driver's error type) for a launch that returned ``status``; NULL */
static PyObject *launch_error(PyObject *error, int status) {
    PyObject *e = PyObject_CallFunction(error, "i", status);
    if (e) { PyErr_SetObject((PyObject *)Py_TYPE(e), e); Py_DECREF(e); }
    return NULL;
}

typedef struct {
    void *f;
    unsigned g[3], b[3], shm;
    void **params;
} Launch;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vc;
    PyObject *records, *cur, *counter, *direct, *env, *key, *overrides, *fallback, *error, *locked;
    int table_always;
    Py_ssize_t nslots, nalign, nguards, maxidx;
    Py_ssize_t *slot_idx;
    char *slot_code;
    Py_ssize_t *align;
    Py_ssize_t *guards;   /* i, j per guard */
    unsigned long long *spans; /* si, sj per guard */
    launch_fn launch;
    /* the last record used: its tuple (held), buffer address and launches */
    PyObject *last;
    char *buf;
    Launch *launches;
    Py_ssize_t nlaunch;
    PyObject *n_obj;
} Launcher;

static void Launcher_clear_last(Launcher *self) {
    Py_CLEAR(self->last);
    Py_CLEAR(self->n_obj);
    PyMem_Free(self->launches);
    self->launches = NULL; self->nlaunch = 0; self->buf = NULL;
}

static int Launcher_traverse(Launcher *self, visitproc visit, void *arg) {
    Py_VISIT(self->records); Py_VISIT(self->cur); Py_VISIT(self->counter); Py_VISIT(self->direct); Py_VISIT(self->env);
    Py_VISIT(self->key); Py_VISIT(self->overrides); Py_VISIT(self->fallback); Py_VISIT(self->error);
    Py_VISIT(self->locked); Py_VISIT(self->last); Py_VISIT(self->n_obj);
    return 0;
}

static int Launcher_clear(Launcher *self) {  /* the fallback closure refers back to its FastPath: a cycle */
    Launcher_clear_last(self);
    Py_CLEAR(self->records); Py_CLEAR(self->cur); Py_CLEAR(self->counter); Py_CLEAR(self->direct); Py_CLEAR(self->env);
    Py_CLEAR(self->key); Py_CLEAR(self->overrides); Py_CLEAR(self->fallback); Py_CLEAR(self->error);
    Py_CLEAR(self->locked);
    return 0;
}

static void Launcher_dealloc(Launcher *self) {
    PyObject_GC_UnTrack(self);
    Launcher_clear(self);
    PyMem_Free(self->slot_idx); PyMem_Free(self->slot_code); PyMem_Free(self->align);
    PyMem_Free(self->guards); PyMem_Free(self->spans);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* the largest index of ``values`` the launcher reads */
static Py_ssize_t Launcher_max_index(Launcher *self) {
    Py_ssize_t m = -1;
    for (Py_ssize_t k = 0; k < self->nslots; k++) if (self->slot_idx[k] > m) m = self->slot_idx[k];
    for (Py_ssize_t k = 0; k < self->nalign; k++) if (self->align[k] > m) m = self->align[k];
    for (Py_ssize_t k = 0; k < 2 * self->nguards; k++) if (self->guards[k] > m) m = self->guards[k];
    return m;
}

static int Launcher_init(Launcher *self, PyObject *args, PyObject *kw) {
    PyObject *records, *slots, *align, *guards, *cur, *counter, *direct, *env, *key, *ov, *fallback, *lock, *error;
    int table_always;
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OO!O!OOOpOOKO", &PyDict_Type, &records, &PyTuple_Type, &slots,
                          &PyTuple_Type, &align, &PyTuple_Type, &guards, &cur, &PyList_Type, &counter,
                          &PyList_Type, &direct, &env, &key, &ov, &table_always, &fallback, &lock, &addr, &error))
        return -1;
    if (self->records) { PyErr_SetString(PyExc_TypeError, "Launcher is initialized once"); return -1; }
    if (!addr) { PyErr_SetString(PyExc_ValueError, "no launch function"); return -1; }
    if (PyList_GET_SIZE(counter) < 1 || PyList_GET_SIZE(direct) < 1) {
        PyErr_SetString(PyExc_ValueError, "counter and direct are one-item lists"); return -1;
    }
    Py_ssize_t ns = PyTuple_GET_SIZE(slots), na = PyTuple_GET_SIZE(align), ng = PyTuple_GET_SIZE(guards);
    self->slot_idx = PyMem_Calloc(ns ? ns : 1, sizeof(Py_ssize_t));
    self->slot_code = PyMem_Calloc(ns ? ns : 1, 1);
    self->align = PyMem_Calloc(na ? na : 1, sizeof(Py_ssize_t));
    self->guards = PyMem_Calloc(ng ? 2 * ng : 1, sizeof(Py_ssize_t));
    self->spans = PyMem_Calloc(ng ? 2 * ng : 1, sizeof(unsigned long long));
    if (!self->slot_idx || !self->slot_code || !self->align || !self->guards || !self->spans) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t k = 0; k < ns; k++) {
        Py_ssize_t i;
        const char *code;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(slots, k), "ns", &i, &code)) return -1;
        if (i < 0 || strlen(code) != 1 || !strchr("Qfd", code[0])) {
            PyErr_SetString(PyExc_ValueError, "a slot is (values index >= 0, 'Q' | 'f' | 'd')"); return -1;
        }
        self->slot_idx[k] = i; self->slot_code[k] = code[0];
    }
    for (Py_ssize_t k = 0; k < na; k++) {
        self->align[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(align, k));
        if (self->align[k] < 0) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "align index < 0"); return -1; }
    }
    for (Py_ssize_t k = 0; k < ng; k++) {
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(guards, k), "nnKK", &self->guards[2 * k], &self->guards[2 * k + 1],
                              &self->spans[2 * k], &self->spans[2 * k + 1]))
            return -1;
        if (self->guards[2 * k] < 0 || self->guards[2 * k + 1] < 0) {
            PyErr_SetString(PyExc_ValueError, "guard index < 0"); return -1;
        }
    }
    self->nslots = ns; self->nalign = na; self->nguards = ng;
    self->maxidx = Launcher_max_index(self);
    self->table_always = table_always;
    self->launch = (launch_fn)(uintptr_t)addr;
#define KEEP(field, v) do { Py_INCREF(v); self->field = v; } while (0)
    KEEP(records, records); KEEP(cur, cur); KEEP(counter, counter); KEEP(direct, direct); KEEP(env, env);
    KEEP(key, key); KEEP(overrides, ov); KEEP(fallback, fallback); KEEP(error, error);
#undef KEEP
    self->locked = PyObject_GetAttrString(lock, "locked");  /* the plan lock's test: all the launcher needs of it */
    return self->locked ? 0 : -1;
}

/* make ``rec`` (records' value tuple) the launcher's last record: 0, or -1 with an error set */
static int Launcher_adopt(Launcher *self, PyObject *rec) {
    Launcher_clear_last(self);
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) < 3) { PyErr_SetString(PyExc_TypeError, "a record is (buffer, launches, n, ...)"); return -1; }
    Py_buffer view;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(rec, 0), &view, PyBUF_WRITABLE) < 0) return -1;
    char *buf = view.buf;
    Py_ssize_t len = view.len;
    PyBuffer_Release(&view);  /* the record tuple holds the buffer object, so its memory stays */
    if (len < 8 * self->nslots) { PyErr_SetString(PyExc_ValueError, "a record's buffer is shorter than its slots"); return -1; }
    PyObject *launches = PyTuple_GET_ITEM(rec, 1);
    if (!PyTuple_Check(launches)) { PyErr_SetString(PyExc_TypeError, "a record's launches are a tuple"); return -1; }
    Py_ssize_t n = PyTuple_GET_SIZE(launches);
    Launch *ls = PyMem_Calloc(n ? n : 1, sizeof(Launch));
    if (!ls) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t k = 0; k < n; k++) {
        unsigned long long f, pa;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(launches, k), "KIIIIIIIK", &f, &ls[k].g[0], &ls[k].g[1], &ls[k].g[2],
                              &ls[k].b[0], &ls[k].b[1], &ls[k].b[2], &ls[k].shm, &pa)) {
            PyMem_Free(ls); return -1;
        }
        ls[k].f = (void *)(uintptr_t)f;
        ls[k].params = (void **)(uintptr_t)pa;
    }
    Py_INCREF(rec);
    self->last = rec;
    self->n_obj = PyTuple_GET_ITEM(rec, 2);
    Py_INCREF(self->n_obj);
    self->buf = buf; self->launches = ls; self->nlaunch = n;
    return 0;
}

static PyObject *call_fallback(Launcher *self, PyObject *const *args, Py_ssize_t nargs) {
    return PyObject_Vectorcall(self->fallback, args, nargs, NULL);
}

/* 1 when the direct branch applies (no graph table), 0 when the fallback decides, -1 on error */
static int direct_branch(Launcher *self) {
    int d = PyObject_IsTrue(PyList_GET_ITEM(self->direct, 0));
    if (d) return d;
    if (self->table_always) return 0;
    int in_env = PyDict_Check(self->env) ? PyDict_Contains(self->env, self->key) : PySequence_Contains(self->env, self->key);
    if (in_env) return in_env < 0 ? -1 : 0;
    int ov = PyObject_IsTrue(self->overrides);
    return ov < 0 ? -1 : !ov;
}

static PyObject *Launcher_vcall(Launcher *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) && self->fallback) return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
    if (nargs < 2 || nargs > 4) { PyErr_SetString(PyExc_TypeError, "launch(values, stream, workspace=None, workspace_size=0)"); return NULL; }
    PyObject *values = args[0], *stream = args[1];
    if (self->records == NULL) { PyErr_SetString(PyExc_RuntimeError, "a cleared launcher"); return NULL; }
    if (!PyTuple_Check(values) || PyTuple_GET_SIZE(values) <= self->maxidx) return call_fallback(self, args, nargs);
    int d = direct_branch(self);
    if (d < 0) return NULL;
    if (!d) return call_fallback(self, args, nargs);
    /* the stream */
    unsigned long long sptr;
    PyObject *sobj = stream_of(self->cur, stream);
    if (sobj == NULL) return NULL;
    sptr = as_u64(sobj);
    if (sptr == (unsigned long long)-1 && PyErr_Occurred()) { Py_DECREF(sobj); return NULL; }
    /* the record of (stream, alignment outcome) */
    PyObject *akey = NULL;
    if (self->nalign) {
        unsigned long long low = 0;
        for (Py_ssize_t k = 0; k < self->nalign; k++) {
            unsigned long long v = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(values, self->align[k]));
            if (v == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); Py_DECREF(sobj); return call_fallback(self, args, nargs); }
            low |= v;
        }
        if (low & 15) {
            akey = PyTuple_New(self->nalign);
            if (!akey) { Py_DECREF(sobj); return NULL; }
            for (Py_ssize_t k = 0; k < self->nalign; k++) {
                unsigned long long v = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(values, self->align[k]));
                PyObject *b = (v & 15) == 0 ? Py_True : Py_False;
                Py_INCREF(b);
                PyTuple_SET_ITEM(akey, k, b);
            }
        }
    }
    if (akey == NULL) { akey = Py_True; Py_INCREF(akey); }
    PyObject *rkey = PyTuple_Pack(2, sobj, akey);
    Py_DECREF(akey);
    if (rkey == NULL) { Py_DECREF(sobj); return NULL; }
    PyObject *rec = PyDict_GetItemWithError(self->records, rkey);
    Py_DECREF(rkey);
    if (rec == NULL) {
        Py_DECREF(sobj);
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_FALSE;
    }
    /* a guarded input overlapping an output: the execute (it copies) */
    for (Py_ssize_t k = 0; k < self->nguards; k++) {
        unsigned long long vi = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(values, self->guards[2 * k]));
        unsigned long long vj = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(values, self->guards[2 * k + 1]));
        if (PyErr_Occurred()) { PyErr_Clear(); Py_DECREF(sobj); return call_fallback(self, args, nargs); }
        if (vi < vj + self->spans[2 * k + 1] && vj < vi + self->spans[2 * k]) { Py_DECREF(sobj); Py_RETURN_FALSE; }
    }
    if (rec != self->last && Launcher_adopt(self, rec) < 0) { Py_DECREF(sobj); return NULL; }
    /* the plan's lock: held by a thread in the Python launcher (between its pack and its launches): that
     * launcher waits for it.  Not held: no Python code can take it before this call returns, since nothing
     * here releases the GIL, so the pack and the launches below need not take it */
    PyObject *got = PyObject_CallNoArgs(self->locked);
    if (got == NULL) { Py_DECREF(sobj); return NULL; }
    int held = PyObject_IsTrue(got);
    Py_DECREF(got);
    if (held) { Py_DECREF(sobj); if (held < 0) return NULL; return call_fallback(self, args, nargs); }
    PyObject *result = Py_False;
    char *buf = self->buf;
    for (Py_ssize_t k = 0; k < self->nslots; k++) {
        PyObject *v = PyTuple_GET_ITEM(values, self->slot_idx[k]);
        char *at = buf + 8 * k;
        if (self->slot_code[k] == 'Q') {
            PyObject *iv = PyLong_CheckExact(v) ? (Py_INCREF(v), v) : PyNumber_Index(v);  /* what struct's 'Q' takes */
            if (iv == NULL) { PyErr_Clear(); goto release; }
            unsigned long long u = as_u64(iv);
            Py_DECREF(iv);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); goto release; }
            memcpy(at, &u, 8);
        } else {
            double x = PyFloat_AsDouble(v);
            if (x == -1.0 && PyErr_Occurred()) { PyErr_Clear(); goto release; }
            if (self->slot_code[k] == 'f') {
                if (PyFloat_Pack4(x, at, 1) < 0) { PyErr_Clear(); goto release; }  /* out of float range */
                memset(at + 4, 0, 4);
            } else {
                memcpy(at, &x, 8);
            }
        }
    }
    for (Py_ssize_t k = 0; k < self->nlaunch; k++) {
        Launch *l = &self->launches[k];
        int st = self->launch(l->f, l->g[0], l->g[1], l->g[2], l->b[0], l->b[1], l->b[2], l->shm,
                              (void *)(uintptr_t)sptr, l->params, NULL);
        if (st) { result = launch_error(self->error, st); goto release; }
    }
    result = Py_True;
release:
    Py_DECREF(sobj);
    if (result == NULL) return NULL;
    if (result == Py_True) {
        PyObject *old = PyList_GET_ITEM(self->counter, 0);
        PyObject *nw = PyNumber_Add(old, self->n_obj);
        if (nw == NULL) return NULL;
        PyList_SetItem(self->counter, 0, nw);  /* steals nw */
    }
    Py_INCREF(result);
    return result;
}

STEADY_NEW(Launcher)

STEADY_TYPE(Launcher, 0, "a cupy plan's record launcher (module docstring)")

/* ---------------------------------------------------------------------------------------------- */
/* Kernels                                                                                        */
/* A captured CUDA graph replayed as its launches (engines/graphs.py ``kernels_of``; no Python twin:
 * where this module is not built, graphs replay as graphs): kernels(stream) launches each record,
 * in order, on ``stream``: cuLaunchKernelEx with the captured configuration, attributes and
 * parameters, or cuMemsetD2D{8,16,32}Async.  Replay launches one found in its table directly.
 *
 *   Kernels(records_address, count, keep, addresses, error)
 *     records    ``count`` kernel_record structs (graphs.py KernelRecord) at records_address, their
 *                parameter buffers and attribute arrays kept alive by ``keep``
 *     addresses  (cuLaunchKernelEx, cuMemsetD2D8Async, cuMemsetD2D16Async, cuMemsetD2D32Async) */

typedef struct {
    unsigned gx, gy, gz, bx, by, bz, shm;
    void *stream;
    void *attrs;
    unsigned nattrs;
} launch_config;  /* CUlaunchConfig */

typedef struct {
    int kind;  /* 0: a kernel; 1, 2, 4: a memset of that element size */
    launch_config config;
    void *f;
    void **params;
    unsigned long long dst;
    size_t pitch, width, height;
    unsigned value;
} kernel_record;

typedef int (*launch_ex_fn)(const launch_config *config, void *f, void **params, void **extra);
typedef int (*memset8_fn)(unsigned long long dst, size_t pitch, unsigned char v, size_t w, size_t h, void *stream);
typedef int (*memset16_fn)(unsigned long long dst, size_t pitch, unsigned short v, size_t w, size_t h, void *stream);
typedef int (*memset32_fn)(unsigned long long dst, size_t pitch, unsigned int v, size_t w, size_t h, void *stream);

typedef struct {
    PyObject_HEAD
    vectorcallfunc vc;
    PyObject *keep, *error;
    const kernel_record *rec;
    Py_ssize_t n;
    launch_ex_fn launch;
    memset8_fn m8;
    memset16_fn m16;
    memset32_fn m32;
} Kernels;

#define KERNELS_FIELDS(X) X(keep) X(error)

STEADY_GC(Kernels, KERNELS_FIELDS)

STEADY_NEW(Kernels)

static int Kernels_init(Kernels *self, PyObject *args, PyObject *kw) {
    unsigned long long at, a0, a1, a2, a3;
    Py_ssize_t n;
    PyObject *keep, *error;
    if (!PyArg_ParseTuple(args, "KnO(KKKK)O", &at, &n, &keep, &a0, &a1, &a2, &a3, &error)) return -1;
    if (self->keep) { PyErr_SetString(PyExc_TypeError, "Kernels is initialized once"); return -1; }
    if (!at || n < 1 || !a0 || !a1 || !a2 || !a3) { PyErr_SetString(PyExc_ValueError, "no records or no launch functions"); return -1; }
    const kernel_record *rec = (const kernel_record *)(uintptr_t)at;
    for (Py_ssize_t i = 0; i < n; i++) {
        int k = rec[i].kind;
        if (k != 0 && k != 1 && k != 2 && k != 4) { PyErr_Format(PyExc_ValueError, "record %zd: kind %d", i, k); return -1; }
        if (k == 0 && !rec[i].f) { PyErr_Format(PyExc_ValueError, "record %zd: no function", i); return -1; }
    }
    Py_INCREF(keep); self->keep = keep;
    Py_INCREF(error); self->error = error;
    self->rec = rec; self->n = n;
    self->launch = (launch_ex_fn)(uintptr_t)a0;
    self->m8 = (memset8_fn)(uintptr_t)a1;
    self->m16 = (memset16_fn)(uintptr_t)a2;
    self->m32 = (memset32_fn)(uintptr_t)a3;
    return 0;
}

/* launch every record on ``stream``: 0, or the first failed call's status */
static int kernels_launch(Kernels *k, void *stream) {
    for (Py_ssize_t i = 0; i < k->n; i++) {
        const kernel_record *r = &k->rec[i];
        int st;
        if (r->kind == 0) {
            launch_config c = r->config;
            c.stream = stream;
            st = k->launch(&c, r->f, r->params, NULL);
        } else if (r->kind == 1) {
            st = k->m8(r->dst, r->pitch, (unsigned char)r->value, r->width, r->height, stream);
        } else if (r->kind == 2) {
            st = k->m16(r->dst, r->pitch, (unsigned short)r->value, r->width, r->height, stream);
        } else {
            st = k->m32(r->dst, r->pitch, r->value, r->width, r->height, stream);
        }
        if (st) return st;
    }
    return 0;
}

static PyObject *Kernels_vcall(Kernels *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (self->keep == NULL) { PyErr_SetString(PyExc_RuntimeError, "cleared kernels"); return NULL; }
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames)) || PyVectorcall_NARGS(nargsf) != 1 || !PyLong_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "kernels(stream: int)");
        return NULL;
    }
    void *st = PyLong_AsVoidPtr(args[0]);
    if (st == NULL && PyErr_Occurred()) return NULL;
    int status = kernels_launch(self, st);
    if (status) return launch_error(self->error, status);
    Py_RETURN_NONE;
}

static PyObject *Kernels_len(Kernels *self, void *closure) { return PyLong_FromSsize_t(self->n); }

static PyGetSetDef Kernels_getset[] = {{"count", (getter)Kernels_len, NULL, "the number of launches", NULL}, {NULL}};

STEADY_TYPE(Kernels, 0, "a captured CUDA graph replayed as its launches (see _steady.c)", .tp_getset = Kernels_getset)

/* ---------------------------------------------------------------------------------------------- */
/* Replay                                                                                         */
/* A cudnn plan's launch(values, stream, workspace=None, workspace_size=0) -> bool for a call whose
 * CUDA graph was captured (Python twin: cudnn_engine/plan.py CudnnPlan.launch_py, which it calls for
 * everything else): one look in the plan's replay table, the workspace the graph was captured with,
 * one cuGraphLaunch.
 *
 *   Replay(state, cur, capturing, stats, fallback, graph_launch_address, error, given)
 *     state      the plan's [replay table, unseen]: table (values, stream) -> (graphExec or a Kernels, workspace
 *                need, the caller's workspace pointer the graph uses or 0), replaced by a new dict
 *                before any graph in it is destroyed; unseen set to 0 on a replay
 *     capturing  capturing(stream) -> whether the caller is capturing that stream (not asked for 0)
 *     stats      the engine's STATS (its "graph_launches" counted)
 *     given      _given_workspace(workspace, size, need), for a workspace given_c does not read
 * A table entry is never a destroyed graph while that table is the plan's (the plan replaces the
 * table first), and nothing runs between the last look at the table and the launch, so the graph
 * found is launched unlocked (``replay_hit``). */

typedef int (*graph_launch_fn)(void *exe, void *stream);

typedef struct {
    PyObject_HEAD
    vectorcallfunc vc;
    PyObject *state, *cur, *capturing, *stats, *fallback, *error, *given, *counted;
    graph_launch_fn glaunch;
} Replay;

#define REPLAY_FIELDS(X) X(state) X(cur) X(capturing) X(stats) X(fallback) X(error) X(given) X(counted)

STEADY_GC(Replay, REPLAY_FIELDS)  /* the fallback is the plan's bound method: a cycle */

STEADY_NEW(Replay)

static int Replay_init(Replay *self, PyObject *args, PyObject *kw) {
    PyObject *state, *cur, *capturing, *stats, *fallback, *error, *given;
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "O!OOO!OKOO", &PyList_Type, &state, &cur, &capturing, &PyDict_Type, &stats, &fallback,
                          &addr, &error, &given))
        return -1;
    if (self->state) { PyErr_SetString(PyExc_TypeError, "Replay is initialized once"); return -1; }
    if (!addr) { PyErr_SetString(PyExc_ValueError, "no graph launch function"); return -1; }
    if (PyList_GET_SIZE(state) != 2) { PyErr_SetString(PyExc_ValueError, "state is [replay table, unseen]"); return -1; }
    if (!(self->counted = PyUnicode_InternFromString("graph_launches"))) return -1;
#define KEEP(field) do { Py_INCREF(field); self->field = field; } while (0)
    KEEP(state); KEEP(cur); KEEP(capturing); KEEP(stats); KEEP(fallback); KEEP(error); KEEP(given);
#undef KEEP
    self->glaunch = (graph_launch_fn)(uintptr_t)addr;
    return 0;
}

/* ``given`` (plan.py _given_workspace) without calling Python for the forms a call passes: NULL (None or
 * 0), an int pointer, or an object whose .data.ptr is an int (a CuPy array), with an int size or None.
 * 1 with *out (a new reference), 0 when the Python function decides (any other form), -1 with an error */
static int given_c(PyObject *ws, PyObject *wss, PyObject *need, PyObject **out) {
    if (!PyLong_CheckExact(need) || !(wss == Py_None || PyLong_CheckExact(wss))) return 0;
    if (is_null(ws)) { Py_INCREF(ZERO); *out = ZERO; return 1; }
    int enough = wss == Py_None ? PyObject_RichCompareBool(ZERO, need, Py_GE) : PyObject_RichCompareBool(wss, need, Py_GE);
    if (enough < 0) return -1;
    if (!enough) { Py_INCREF(ZERO); *out = ZERO; return 1; }
    if (PyLong_CheckExact(ws)) { Py_INCREF(ws); *out = ws; return 1; }
    PyObject *mem = PyObject_GetAttr(ws, S_data);
    if (mem == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    PyObject *p = PyObject_GetAttr(mem, S_ptr);
    Py_DECREF(mem);
    if (p == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    if (!PyLong_CheckExact(p)) { Py_DECREF(p); return 0; }
    *out = p;
    return 1;
}

/* the graph to replay for (values, stream, workspace) as a new reference: NULL with no error when the
 * fallback decides (no entry, another workspace, a stream being captured, a form not read here, or the
 * plan's table replaced meanwhile: the workspace and capture tests call Python, where another thread
 * may run and replace it before it destroys a graph, so the entry and the table are held across them
 * and the table is checked again after them; nothing runs between that check and the launch) */
static PyObject *replay_hit(Replay *self, PyObject *const *args, Py_ssize_t nargs, PyObject *sobj) {
    PyObject *table = PyList_GET_ITEM(self->state, 0), *exe = NULL;
    if (!PyDict_Check(table) || PyDict_GET_SIZE(table) == 0) return NULL;
    Py_INCREF(table);
    PyObject *key = PyTuple_Pack(2, args[0], sobj);
    if (key == NULL) { Py_DECREF(table); return NULL; }
    PyObject *hit = PyDict_GetItemWithError(table, key);
    Py_DECREF(key);
    if (hit == NULL) {
        if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_TypeError)) PyErr_Clear();  /* unhashable */
        Py_DECREF(table);
        return NULL;
    }
    Py_INCREF(hit);
    if (!PyTuple_CheckExact(hit) || PyTuple_GET_SIZE(hit) != 3) goto done;
    int need = PyObject_IsTrue(PyTuple_GET_ITEM(hit, 1));
    if (need < 0) goto done;
    if (need) {  /* the graph uses the caller's workspace of then (or the plan's scratch: 0): the same now */
        PyObject *ws = nargs > 2 ? args[2] : Py_None, *wss = nargs > 3 ? args[3] : ZERO, *g = NULL;
        int known = given_c(ws, wss, PyTuple_GET_ITEM(hit, 1), &g);
        if (known < 0) goto done;
        if (!known) g = PyObject_CallFunctionObjArgs(self->given, ws, wss, PyTuple_GET_ITEM(hit, 1), NULL);
        if (g == NULL) goto done;
        int same = PyObject_RichCompareBool(g, PyTuple_GET_ITEM(hit, 2), Py_EQ);
        Py_DECREF(g);
        if (same <= 0) goto done;
    }
    int nz = PyObject_IsTrue(sobj);
    if (nz < 0) goto done;
    if (nz) {
        PyObject *c = PyObject_CallOneArg(self->capturing, sobj);
        if (c == NULL) goto done;
        int t = PyObject_IsTrue(c);
        Py_DECREF(c);
        if (t) goto done;
    }
    if (PyList_GET_ITEM(self->state, 0) == table) {  /* still the plan's table: its graphs are alive */
        exe = PyTuple_GET_ITEM(hit, 0);
        Py_INCREF(exe);
    }
done:
    Py_DECREF(hit);
    Py_DECREF(table);
    return exe;
}

static PyObject *Replay_vcall(Replay *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->state == NULL) { PyErr_SetString(PyExc_RuntimeError, "a cleared replay"); return NULL; }
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames)) || nargs < 2 || nargs > 4)
        return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
    PyObject *sobj = stream_of(self->cur, args[1]);
    if (sobj == NULL) return NULL;
    if (!PyLong_CheckExact(sobj)) { Py_DECREF(sobj); return PyObject_Vectorcall(self->fallback, args, nargsf, NULL); }
    PyObject *exe = replay_hit(self, args, nargs, sobj);
    if (exe == NULL) {
        Py_DECREF(sobj);
        if (PyErr_Occurred()) return NULL;
        return PyObject_Vectorcall(self->fallback, args, nargsf, NULL);
    }
    int status;
    void *st = PyLong_AsVoidPtr(sobj);
    Py_DECREF(sobj);
    if (Py_TYPE(exe) == &KernelsType) {  /* the graph as its launches (engines/graphs.py kernels_of) */
        status = PyErr_Occurred() ? -1 : kernels_launch((Kernels *)exe, st);
    } else {
        void *e = PyLong_AsVoidPtr(exe);
        status = PyErr_Occurred() ? -1 : self->glaunch(e, st);
    }
    Py_DECREF(exe);
    if (status < 0) return NULL;
    if (status) return launch_error(self->error, status);
    PyObject *n = PyDict_GetItemWithError(self->stats, self->counted);
    if (n == NULL) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "graph_launches"); return NULL; }
    PyObject *n1 = PyNumber_Add(n, ONE);
    if (n1 == NULL || PyDict_SetItem(self->stats, self->counted, n1) < 0) { Py_XDECREF(n1); return NULL; }
    Py_DECREF(n1);
    if (PyList_GET_ITEM(self->state, 1) != ZERO) { Py_INCREF(ZERO); PyList_SetItem(self->state, 1, ZERO); }
    Py_RETURN_TRUE;
}

STEADY_TYPE(Replay, 0, "a cudnn plan's replay launcher (see _steady.c)")

/* ---------------------------------------------------------------------------------------------- */
/* ThreadLast                                                                                     */
/* ``_core.call._LAST`` where this module is built (twin: a threading.local): its one attribute,
 * ``plan``, is per thread (the plan the thread's last legacy call ran), kept in the thread state's
 * dict under the object itself, so the prepared call's ``last.plan = plan`` is one dict store. */

typedef struct {
    PyObject_HEAD
} ThreadLast;

static int is_plan(PyObject *name) {
    return name == S_plan || (PyUnicode_Check(name) && PyUnicode_Compare(name, S_plan) == 0);
}

static PyObject *ThreadLast_getattro(PyObject *self, PyObject *name) {
    if (!is_plan(name)) return PyObject_GenericGetAttr(self, name);
    PyObject *d = PyThreadState_GetDict();
    PyObject *v = d ? PyDict_GetItemWithError(d, self) : NULL;
    if (v == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "plan");
        return NULL;
    }
    Py_INCREF(v);
    return v;
}

static int ThreadLast_setattro(PyObject *self, PyObject *name, PyObject *v) {
    if (!is_plan(name)) return PyObject_GenericSetAttr(self, name, v);
    PyObject *d = PyThreadState_GetDict();
    if (d == NULL) { PyErr_SetString(PyExc_RuntimeError, "no thread state dict"); return -1; }
    if (v != NULL) return PyDict_SetItem(d, self, v);
    if (PyDict_DelItem(d, self) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
        PyErr_SetString(PyExc_AttributeError, "plan");
        return -1;
    }
    return 0;
}

static PyTypeObject ThreadLastType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudnn_compat._backend._steady.ThreadLast",
    .tp_basicsize = sizeof(ThreadLast),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_getattro = ThreadLast_getattro,
    .tp_setattro = ThreadLast_setattro,
    .tp_new = PyType_GenericNew,
    .tp_doc = "ThreadLast(): an object whose attribute ``plan`` is per thread (see _steady.c)",
};

/* ---------------------------------------------------------------------------------------------- */
/* Run                                                                                            */
/* The legacy layer's ``run`` for a call with a prepared call (_core/call.py run's steady path and
 * _backend/prepared.py Prepared.__call__, in one C call): anything else, and anything the prepared
 * call does not take, is ``general(*args, **kw)`` (the Python run, from its first line: nothing
 * here has written or launched anything then). */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vc;
    PyObject *general, *hooks, *prepared, *by_value, *overrides, *environ, *keys, *last, *hit, *touch, *failed, *nd,
             *gpu;
    long touch_every;
} Run;


#define RUN_FIELDS(X) X(general) X(hooks) X(prepared) X(by_value) X(overrides) X(environ) X(keys) X(last) X(hit) \
    X(touch) X(failed) X(nd) X(gpu)

STEADY_GC(Run, RUN_FIELDS)

STEADY_NEW(Run)

static int Run_init(Run *self, PyObject *args, PyObject *kw) {
    PyObject *general, *hooks, *prepared, *by_value, *ov, *environ, *keys, *last, *hit, *touch, *failed, *nd;
    long every;
    if (!PyArg_ParseTuple(args, "OO!O!O!OOO!OOOlOO", &general, &PyList_Type, &hooks, &PyDict_Type, &prepared,
                          &PyDict_Type, &by_value, &ov, &environ, &PyTuple_Type, &keys, &last, &hit, &touch, &every,
                          &failed, &nd))
        return -1;
    if (self->general) { PyErr_SetString(PyExc_TypeError, "Run is initialized once"); return -1; }
#define KEEP(field, v) do { Py_INCREF(v); self->field = v; } while (0)
    KEEP(general, general); KEEP(hooks, hooks); KEEP(prepared, prepared); KEEP(by_value, by_value);
    KEEP(overrides, ov); KEEP(environ, environ); KEEP(keys, keys); KEEP(last, last); KEEP(hit, hit);
    KEEP(touch, touch); KEEP(failed, failed); KEEP(nd, nd);
#undef KEEP
    self->touch_every = every;
    self->gpu = PyUnicode_InternFromString("gpu");
    return self->gpu ? 0 : -1;
}

/* 1: attribute ``name`` of ``o`` is true, 0: false, -1: error */
static int attr_true(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* the prepared call of ``key`` on ``place`` (a new reference), NULL without an error when none */
static PyObject *prepared_of(Run *self, PyObject *place, PyObject *key) {
    PyObject *table = PyDict_GetItemWithError(self->prepared, place);
    if (table == NULL) return NULL;
    PyObject *id = PyLong_FromVoidPtr(key);
    if (id == NULL) return NULL;
    PyObject *prep = PyDict_Check(table) ? PyDict_GetItemWithError(table, id) : NULL;
    Py_DECREF(id);
    if (prep != NULL) {
        PyObject *owner = PyObject_GetAttr(prep, S_owner);
        if (owner == NULL) return NULL;
        Py_DECREF(owner);
        if (owner == key) { Py_INCREF(prep); return prep; }
    } else if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *byv = PyDict_GetItemWithError(self->by_value, place);
    if (byv == NULL || !PyDict_Check(byv)) return NULL;
    prep = PyDict_GetItemWithError(byv, key);
    if (prep == NULL) { if (PyErr_ExceptionMatches(PyExc_TypeError)) PyErr_Clear(); return NULL; }  /* unhashable */
    Py_INCREF(prep);
    return prep;
}

/* The per-call tests of run_prepared that do not depend on the prepared call: no hook of _core.call,
 * the handle needs no device switch, a workspace of a form the prepared call takes, an int size.  1
 * with *place (handle.place, a new reference), 0 when the general path must run the call, -1 error. */
static int steady_ok(Run *self, PyObject *handle, PyObject *ws, PyObject *wss, PyObject **place) {
    if (self->general == NULL) { PyErr_SetString(PyExc_RuntimeError, "a cleared run"); return -1; }
    if (PyList_GET_SIZE(self->hooks)) return 0;
    int t = attr_true(handle, S_switch);
    if (t) return t < 0 ? -1 : 0;
    PyObject *pl = PyObject_GetAttr(handle, S_place);
    if (pl == NULL) return -1;
    if (ws != Py_None) {  /* on the GPU place a CuPy array or a pointer int is taken as it is (_workspace) */
        int gpu = pl == self->gpu || (PyUnicode_Check(pl) && PyUnicode_Compare(pl, self->gpu) == 0);
        int nd = PyList_Check(self->nd) && PyList_GET_SIZE(self->nd) && Py_TYPE(ws) == (PyTypeObject *)PyList_GET_ITEM(self->nd, 0);
        if (!gpu || !(PyLong_CheckExact(ws) || nd)) { Py_DECREF(pl); return 0; }
    }
    if (wss != NULL && !PyLong_CheckExact(wss)) { Py_DECREF(pl); return 0; }
    *place = pl;
    return 1;
}

/* the defaults apply: no override, no forced engine or fallback setting in the environment (1), or
 * not (0), -1 error */
static int defaults_ok(Run *self) {
    int t = PyObject_IsTrue(self->overrides);
    if (t) return t < 0 ? -1 : 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(self->keys); k++) {
        t = PySequence_Contains(self->environ, PyTuple_GET_ITEM(self->keys, k));
        if (t) return t < 0 ? -1 : 0;
    }
    return 1;
}

/* whether a workspace of ``wss`` bytes (0 when ``ws`` is NULL or wss is not given) is at least ``need``:
 * 1, 0, or -1 with an error */
static int workspace_enough(PyObject *ws, PyObject *wss, long long need) {
    long long given = 0;
    if (!is_null(ws)) {
        given = wss ? PyLong_AsLongLong(wss) : 0;
        if (given == -1 && PyErr_Occurred()) return -1;
    }
    return given >= need;
}

/* plan.launch(values, stream, ws[, wss]) for prepared call ``prep``, and what a call that ran counts
 * (Prepared.__call__'s launcher branch): 1 ran (*out: the plan, a new reference), 0 not taken (the
 * launcher did nothing), -1 error */
static int launch_prepared(Run *self, PyObject *prep, PyObject *plan, PyObject *values, PyObject *stream, PyObject *ws,
                           PyObject *wss, PyObject **out) {
    PyObject *launch = PyObject_GetAttr(plan, S_launch);
    if (launch == NULL) return -1;
    PyObject *largs[4] = {values, stream, ws, wss};
    PyObject *r = PyObject_Vectorcall(launch, largs, wss ? 4 : 3, NULL);
    Py_DECREF(launch);
    if (r == NULL) {  /* a launcher that raised: logged (planner.launch_failed), the general path decides */
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyErr_NormalizeException(&et, &ev, &etb);
        PyObject *f = PyObject_CallFunctionObjArgs(self->failed, plan, ev ? ev : Py_None, NULL);
        Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
        if (f == NULL) return -1;
        Py_DECREF(f);
        return 0;
    }
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (t <= 0) return t;
    PyObject *h = PyObject_CallNoArgs(self->hit);
    if (h == NULL) return -1;
    Py_DECREF(h);
    PyObject *calls = PyObject_GetAttr(prep, S_calls);
    if (calls == NULL) return -1;
    long c = PyLong_AsLong(calls) + 1;
    Py_DECREF(calls);
    if (c == 0 && PyErr_Occurred()) return -1;
    PyObject *nc = PyLong_FromLong(c);
    if (nc == NULL || PyObject_SetAttr(prep, S_calls, nc) < 0) { Py_XDECREF(nc); return -1; }
    Py_DECREF(nc);
    if (!(c & self->touch_every)) {
        PyObject *k = PyObject_GetAttr(prep, S_key);
        if (k == NULL) return -1;
        PyObject *tr = PyObject_CallOneArg(self->touch, k);
        Py_DECREF(k);
        if (tr == NULL) {  /* KeyError: evicted since (PlanCache.touch_or_raise) */
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
            PyErr_Clear();
        }
        Py_XDECREF(tr);
    }
    if (PyObject_SetAttr(self->last, S_plan, plan) < 0) return -1;  /* last_plan() */
    Py_INCREF(plan);
    *out = plan;
    return 1;
}

/* The prepared call of (handle, key) run with (tensors, scalars, ws, wss, warg): 1 when it ran (*out:
 * the plan, a new reference), 0 when it was not taken (nothing ran or launched: the caller goes the
 * general way), -1 on an error.  ``wss`` may be NULL (not given).  *used (when not NULL): the prepared
 * call, a new reference, when it ran through its binder and launcher (what ``Settled`` keeps), and
 * then *bound (when not NULL) the values its binder gave, a new reference. */
static int run_prepared(Run *self, PyObject *handle, PyObject *key, PyObject *tensors, PyObject *scalars, PyObject *ws,
                        PyObject *wss, PyObject *warg, PyObject **out, PyObject **used, PyObject **bound) {
    PyObject *prep = NULL, *place = NULL, *plan = NULL, *values = NULL, *stream = NULL, *r = NULL;
    int rc = steady_ok(self, handle, ws, wss, &place), t;
    if (rc <= 0) return rc;
    rc = 0;
    prep = prepared_of(self, place, key);
    if (prep == NULL) { if (PyErr_Occurred()) goto error; goto done; }
    t = defaults_ok(self);
    if (t <= 0) { if (t < 0) goto error; goto done; }
    PyObject *pd = PyObject_GetAttr(prep, S_device), *hd = PyObject_GetAttr(handle, S_device);
    t = pd && hd ? PyObject_RichCompareBool(pd, hd, Py_EQ) : -1;
    Py_XDECREF(pd); Py_XDECREF(hd);
    if (t <= 0) { if (t < 0) goto error; goto done; }
    plan = PyObject_GetAttr(prep, S_plan);
    if (plan == NULL) goto error;
    t = attr_true(plan, S_retired);
    if (t) { if (t < 0) goto error; goto done; }
    if (warg != Py_None) {  /* a workspace smaller than the plan's: the general path fits one */
        PyObject *need = PyObject_GetAttr(plan, S_wsize);
        if (need == NULL) goto error;
        long long n = PyLong_AsLongLong(need);
        Py_DECREF(need);
        if (n == -1 && PyErr_Occurred()) goto error;
        t = workspace_enough(ws, wss, n);
        if (t <= 0) { if (t < 0) goto error; goto done; }
    }
    stream = PyObject_GetAttr(handle, S_stream);
    if (stream == NULL) goto error;
    t = attr_true(prep, S_via);
    if (t < 0) goto error;
    if (t) {  /* no launcher: Prepared.__call__ (the variant pack's dict to planner.execute) */
        PyObject *cargs[5] = {tensors, scalars, stream, ws, wss};
        r = PyObject_Vectorcall(prep, cargs, wss ? 5 : 4, NULL);
        if (r == NULL) goto error;
        if (r == Py_None) { Py_CLEAR(r); goto done; }
        if (PyObject_SetAttr(self->last, S_plan, r) < 0) { Py_CLEAR(r); goto error; }  /* last_plan() */
        *out = r;
        rc = 1;
        goto done;
    }
    PyObject *bind = PyObject_GetAttr(prep, S_bind);
    if (bind == NULL) goto error;
    PyObject *bargs[2] = {tensors, scalars};
    values = PyObject_Vectorcall(bind, bargs, 2, NULL);
    Py_DECREF(bind);
    if (values == NULL) goto error;
    if (values == Py_None) goto done;
    rc = launch_prepared(self, prep, plan, values, stream, ws, wss, out);
    if (rc > 0 && used) {
        Py_INCREF(prep);
        *used = prep;
        if (bound) { Py_INCREF(values); *bound = values; }
    }
    goto done;
error:
    rc = -1;
done:
    Py_XDECREF(values); Py_XDECREF(stream); Py_XDECREF(plan); Py_XDECREF(prep); Py_XDECREF(place);
    return rc;
}

static PyObject *Run_vcall(Run *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->general == NULL) { PyErr_SetString(PyExc_RuntimeError, "a cleared run"); return NULL; }
    if (nargs < 5 || nargs > 8) goto general;
    PyObject *opt[3] = {Py_None, NULL, Py_None};  /* workspace, workspace_size, workspace_arg */
    for (Py_ssize_t i = 5; i < nargs; i++) opt[i - 5] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {  /* those three by name; anything else (_hooked) is the general path */
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int slot = PyUnicode_Compare(name, S_ws) == 0 ? 0 : PyUnicode_Compare(name, S_wss) == 0 ? 1
                 : PyUnicode_Compare(name, S_warg) == 0 ? 2 : -1;
        if (slot < 0 || slot + 5 < nargs) goto general;
        opt[slot] = args[nargs + k];
    }
    PyObject *plan = NULL;
    int t = run_prepared(self, args[0], args[1], args[3], args[4], opt[0], opt[1], opt[2], &plan, NULL, NULL);
    if (t < 0) return NULL;
    if (t > 0) return plan;
general:
    return PyObject_Vectorcall(self->general, args, nargsf, kwnames);
}

static PyObject *Run_get_general(Run *self, void *closure) { Py_INCREF(self->general); return self->general; }

static PyGetSetDef Run_getset[] = {{"general", (getter)Run_get_general, NULL, "the Python run", NULL}, {NULL}};

STEADY_TYPE(Run, 0, "the legacy layer's run with its steady path compiled (see _steady.c)", .tp_getset = Run_getset)

/* ---------------------------------------------------------------------------------------------- */
/* Settled                                                                                        */
/* What a recipe's replay resolved for one key (one pattern of zero betas) the last time its prepared
 * call ran through a values binder and a launcher: the prepared call, its plan and binder, the place
 * and device it was found for, and where each of the binder's values comes from in the call's
 * arguments (the recipe's tensors and scalars, which the dict path passes by uid).  A later replay
 * with it skips the tensors and scalars dicts, the prepared-call lookup and the binder's lookups by
 * uid; every other test of run_prepared runs per call as it does there.  Valid while VERSION is the
 * value it was made at: ``bump()`` (call.py, whenever the prepared-call tables change) makes every
 * Settled stale, and the replay then takes the dict path, which makes a new one. */

static unsigned long long VERSION = 1;

typedef struct {
    PyObject_HEAD
    PyObject *prep, *plan, *values, *place, *device, *consts;
    PyObject *fixed;       /* a bound stage's: the values tuple its buffers bound to, passed as it is (else NULL) */
    unsigned long long version;
    long long wsize;       /* plan.workspace_size */
    Py_ssize_t n, norder;
    Py_ssize_t *epos;      /* entry i: its buffer's argument position, or -1 - j: entry j's pointer (mode 1) */
    PyObject **last;       /* entry i: the binder memo's (weakref, pointer) item of the array it took last, or NULL */
    int *okind;            /* order k: 0 an entry (oidx), 1 a scalar of the recipe (oidx: its index), 2 consts[k] */
    Py_ssize_t *oidx;
} Settled;

static int Settled_traverse(Settled *self, visitproc visit, void *arg) {
    Py_VISIT(self->prep); Py_VISIT(self->plan); Py_VISIT(self->values); Py_VISIT(self->place); Py_VISIT(self->device);
    Py_VISIT(self->consts); Py_VISIT(self->fixed);
    for (Py_ssize_t i = 0; self->last && i < self->n; i++) Py_VISIT(self->last[i]);
    return 0;
}

static int Settled_clear(Settled *self) {
    Py_CLEAR(self->prep); Py_CLEAR(self->plan); Py_CLEAR(self->values); Py_CLEAR(self->place); Py_CLEAR(self->device);
    Py_CLEAR(self->consts); Py_CLEAR(self->fixed);
    for (Py_ssize_t i = 0; self->last && i < self->n; i++) Py_CLEAR(self->last[i]);
    return 0;
}

static void Settled_dealloc(Settled *self) {
    PyObject_GC_UnTrack(self);
    Settled_clear(self);
    PyMem_Free(self->epos); PyMem_Free(self->last); PyMem_Free(self->okind); PyMem_Free(self->oidx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject SettledType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudnn_compat._backend._steady.Settled",
    .tp_basicsize = sizeof(Settled),
    .tp_dealloc = (destructor)Settled_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Settled_traverse,
    .tp_clear = (inquiry)Settled_clear,
    .tp_doc = "a recipe's resolved prepared call for one key (see _steady.c Settled)",
};

/* the index of the last entry of ``spec`` (a tuple of tuples) whose item ``at`` equals ``uid``: -1 none,
 * -2 error */
static Py_ssize_t find_uid(PyObject *spec, Py_ssize_t at, PyObject *uid) {
    Py_ssize_t found = -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(spec); i++) {
        PyObject *e = PyTuple_GET_ITEM(spec, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) <= at) return -2;
        int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(e, at), uid, Py_EQ);
        if (eq < 0) return -2;
        if (eq) found = i;
    }
    return found;
}

/* A new Settled of ``n`` entries and ``norder`` values for prepared call ``prep`` (plan ``plan``, binder
 * ``values``) on ``place``/``device``, its arrays zeroed and ``consts`` a tuple of ``norder``; NULL
 * without an error when it cannot be made (the replay then keeps the dict path) */
static Settled *settled_new(PyObject *prep, PyObject *plan, PyObject *values, PyObject *place, PyObject *device,
                            Py_ssize_t n, Py_ssize_t norder) {
    PyObject *need = PyObject_GetAttr(plan, S_wsize);
    if (need == NULL) { PyErr_Clear(); return NULL; }
    long long wsize = PyLong_AsLongLong(need);
    Py_DECREF(need);
    if (wsize == -1 && PyErr_Occurred()) { PyErr_Clear(); return NULL; }
    Settled *s = PyObject_GC_New(Settled, &SettledType);
    if (s == NULL) { PyErr_Clear(); return NULL; }
    s->consts = s->fixed = NULL;
    s->epos = NULL; s->last = NULL; s->okind = NULL; s->oidx = NULL;
    s->n = n; s->norder = norder; s->wsize = wsize; s->version = VERSION;
#define KEEP(field, x) do { Py_INCREF(x); s->field = x; } while (0)
    KEEP(prep, prep); KEEP(plan, plan); KEEP(values, values); KEEP(place, place); KEEP(device, device);
#undef KEEP
    s->epos = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    s->last = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    s->okind = PyMem_Calloc(norder ? norder : 1, sizeof(int));
    s->oidx = PyMem_Calloc(norder ? norder : 1, sizeof(Py_ssize_t));
    s->consts = PyTuple_New(norder);
    PyObject_GC_Track(s);
    if (!s->epos || !s->last || !s->okind || !s->oidx || !s->consts) { PyErr_Clear(); Py_DECREF(s); return NULL; }
    return s;
}

/* A Settled for a replay whose prepared call ``prep`` (plan ``plan``, binder ``values``) just ran on
 * ``place``/``device`` with the recipe's tensors ``tspec``, scalars ``sspec`` and constants ``consts``:
 * a new reference, or NULL without an error when the binder's entries do not all map onto them as the
 * dict path passes them (tensors by uid, the last of equal uids; constants over scalars) */
static PyObject *settle(PyObject *prep, PyObject *plan, PyObject *values, PyObject *place, PyObject *device,
                        PyObject *tspec, PyObject *sspec, PyObject *consts) {
    if (Py_TYPE(values) != &ValuesType || ((Values *)values)->spec == NULL) return NULL;
    Values *v = (Values *)values;
    Settled *s = settled_new(prep, plan, values, place, device, v->n, v->norder);
    if (s == NULL) return NULL;
    for (Py_ssize_t i = 0; i < v->n; i++) {
        Entry *e = &v->e[i];
        Py_ssize_t t = find_uid(tspec, 1, e->uid);
        if (t == -2) goto fail;
        if (t < 0 && e->mode == 1) { s->epos[i] = -1 - e->alt_index; continue; }
        if (t < 0 && e->mode == 2) t = find_uid(tspec, 1, e->alt_uid);
        if (t < 0) goto fail;
        s->epos[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(PyTuple_GET_ITEM(tspec, t), 0));
        if (s->epos[i] < 0) goto fail;
    }
    for (Py_ssize_t k = 0; k < v->norder; k++) {
        PyObject *c = Py_None;
        if (v->okind[k] == 0) {
            s->okind[k] = 0;
            s->oidx[k] = v->oidx[k];
        } else {
            Py_ssize_t t = find_uid(consts, 0, v->ouid[k]);
            if (t == -2) goto fail;
            if (t >= 0) {
                s->okind[k] = 2;
                c = PyTuple_GET_ITEM(PyTuple_GET_ITEM(consts, t), 1);
            } else {
                t = find_uid(sspec, 1, v->ouid[k]);
                if (t < 0) goto fail;
                s->okind[k] = 1;
                s->oidx[k] = t;
            }
        }
        Py_INCREF(c);
        PyTuple_SET_ITEM(s->consts, k, c);
    }
    return (PyObject *)s;
fail:
    PyErr_Clear();
    Py_DECREF(s);
    return NULL;
}

/* A Settled for a bound stage (``replay_bound``) whose prepared call ``prep`` (plan ``plan``, binder
 * ``values``) just bound the stage's buffers to ``fixed`` (its values tuple) on ``place``/``device``:
 * a later call with the same buffers passes ``fixed`` as it is.  NULL without an error when none. */
static PyObject *settle_fixed(PyObject *prep, PyObject *plan, PyObject *values, PyObject *place, PyObject *device,
                              PyObject *fixed) {
    if (!PyTuple_CheckExact(fixed)) return NULL;
    Settled *s = settled_new(prep, plan, values, place, device, 0, 0);
    if (s == NULL) return NULL;
    Py_INCREF(fixed);
    s->fixed = fixed;
    return (PyObject *)s;
}

/* ``run_prepared`` for a replay with Settled ``s``: the recipe's arguments ``args``, its scalars
 * ``fobj`` (as the dict path passes them), the workspace as there.  1 ran (*out: the plan), 0 not taken
 * (nothing ran: the dict path decides), -1 error */
static int run_settled(Run *self, Settled *s, PyObject *handle, PyObject *const *args, PyObject **fobj, PyObject *ws,
                       PyObject *wss, PyObject *warg, PyObject **out) {
    PyObject *place = NULL, *stream = NULL, *values = NULL;
    if (s->version != VERSION || (Py_TYPE(s->values) == &ValuesType && ((Values *)s->values)->spec == NULL))
        return 0;  /* stale, or a cleared binder */
    int rc = steady_ok(self, handle, ws, wss, &place), t;
    if (rc <= 0) return rc;
    rc = 0;
    if (place != s->place) {
        t = PyObject_RichCompareBool(place, s->place, Py_EQ);
        if (t <= 0) goto end;
    }
    t = defaults_ok(self);
    if (t <= 0) goto end;
    PyObject *hd = PyObject_GetAttr(handle, S_device);
    if (hd == NULL) { t = -1; goto end; }
    t = hd == s->device ? 1 : PyObject_RichCompareBool(s->device, hd, Py_EQ);
    Py_DECREF(hd);
    if (t <= 0) goto end;
    t = attr_true(s->plan, S_retired);
    if (t) { t = t < 0 ? -1 : 0; goto end; }
    if (warg != Py_None) {
        t = workspace_enough(ws, wss, s->wsize);
        if (t <= 0) goto end;
    }
    stream = PyObject_GetAttr(handle, S_stream);
    if (stream == NULL) { t = -1; goto end; }
    if (s->fixed != NULL) {  /* a bound stage's buffers as they were bound last time */
        t = launch_prepared(self, s->prep, s->plan, s->fixed, stream, ws, wss, out);
        goto end;
    }
    /* the binder's values from the arguments (Values_vcall's, with the buffers found by position) */
    Values *v = (Values *)s->values;
    PyObject *stack[16];
    PyObject **p = s->n <= 16 ? stack : PyMem_Calloc(s->n, sizeof(PyObject *));
    if (p == NULL) { PyErr_NoMemory(); t = -1; goto end; }
    Py_ssize_t done = 0;
    t = -1;
    for (; done < s->n; done++) {
        Py_ssize_t at = s->epos[done];
        if (at < 0) { p[done] = p[-1 - at]; Py_INCREF(p[done]); continue; }
        PyObject *b = args[at], *m = s->last[done];
        if (m != NULL && weak_is(PyTuple_GET_ITEM(m, 0), b)) {  /* the array of this call's last replay */
            p[done] = PyTuple_GET_ITEM(m, 1);
            Py_INCREF(p[done]);
            continue;
        }
        if (b == Py_None) { t = 0; goto unbind; }
        PyObject *ptr = pointer_memo(v, &v->e[done], b, &m);
        if (ptr == NULL) goto unbind;
        if (ptr == Py_None) { t = 0; goto unbind; }
        p[done] = ptr;
        Py_XINCREF(m);
        Py_XSETREF(s->last[done], m);
    }
    values = PyTuple_New(s->norder);
    if (values == NULL) goto unbind;
    for (Py_ssize_t k = 0; k < s->norder; k++) {
        PyObject *x = s->okind[k] == 0 ? p[s->oidx[k]] : s->okind[k] == 1 ? fobj[s->oidx[k]] : PyTuple_GET_ITEM(s->consts, k);
        Py_INCREF(x);
        PyTuple_SET_ITEM(values, k, x);
    }
    t = 1;
unbind:
    for (Py_ssize_t i = 0; i < done; i++) Py_DECREF(p[i]);
    if (p != stack) PyMem_Free(p);
    if (t <= 0) goto end;
    t = launch_prepared(self, s->prep, s->plan, values, stream, ws, wss, out);
end:
    Py_XDECREF(values); Py_XDECREF(stream); Py_XDECREF(place);
    return t;
}

static PyObject *bump(PyObject *mod, PyObject *unused) { VERSION++; Py_RETURN_NONE; }

/* ---------------------------------------------------------------------------------------------- */
/* Site                                                                                           */
/* A legacy function's call made again from a steady recipe (_core/recipes.py): the function's
 * Python path resolves, checks and keys a call; once its call site has settled, ``arm(*args)``
 * writes down what that path will do for these descriptor arguments while no descriptor or handle
 * changes (EPOCH[0] the same), and later calls with the same arguments do it from here: the
 * scalars read as ``data.scalar`` reads a float or a small int, the key chosen by which betas are
 * zero, then that key's Settled (``run_settled``) or else the tensors and scalars dicts and the
 * prepared call (``run_prepared``, after which a Settled is made).  Anything else
 * (keywords, another argument count, a legacy hook, an argument the wrapper would convert, a
 * scalar of another form, an unread buffer of another type, a prepared call not taken) calls
 * ``general`` (the Python wrapper) with the same arguments: nothing here has run or written then.
 *
 * A recipe (arm's answer, a tuple): (stamp, handle, keys, tensors, scalars, betas, unread,
 * unread_types, workspace, constants, distinct, bound) with
 *   keys      2**len(betas) plan-cache key objects, index sum((beta_j == 0) << j)
 *   tensors   ((position, uid, argname), ...)
 *   scalars   ((position, uid, lower bound or None), ...): None takes a float or an int of
 *             magnitude < 2**31 (alpha, beta); a bound takes a float >= it (epsilon)
 *   betas     indices into ``scalars``
 *   unread    positions of buffers the call does not read: None, 0 or an exact ``unread_types``
 *   workspace None or (workspace position, size position, the size argument's name, whether a NULL
 *             workspace passes size 0)
 *   constants ((uid, value), ...): scalars the family passes as constants
 *   distinct  ((p, q, r), ...): args[p] and args[q] must not be one buffer unless args[r] is it too
 *             (data.same_buffer; a form it cannot compare takes the Python path)
 *   bound     None, or a bound recipe (``replay_bound``: graphs at byte offsets in the buffers,
 *             one or more stages), which replaces keys to workspace
 * or (stamp, None): this call site has no recipe while EPOCH[0] is ``stamp``.  None: not yet. */

typedef struct {
    Py_ssize_t pos;
    int kind;             /* 0: an int in [lo, hi], 1: a float in [flo, fhi], 2: never fast */
    long long lo, hi_ll;
    int hi_big;           /* hi exceeds long long: compared as an object */
    PyObject *hi;         /* the int bound */
    double flo, fhi;
} Fast;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vc;
    PyObject *general, *hooks, *epoch, *recipes, *arm, *run, *dict, *weaklist;
    Py_ssize_t nargs, nkey, nfast, maxsize;
    Py_ssize_t *key;
    Fast *fast;
} Site;

static int Site_traverse(Site *self, visitproc visit, void *arg) {
    Py_VISIT(self->general); Py_VISIT(self->hooks); Py_VISIT(self->epoch); Py_VISIT(self->recipes);
    Py_VISIT(self->arm); Py_VISIT(self->run); Py_VISIT(self->dict);
    for (Py_ssize_t i = 0; i < self->nfast; i++) Py_VISIT(self->fast[i].hi);
    return 0;
}

static int Site_clear(Site *self) {
    Py_CLEAR(self->general); Py_CLEAR(self->hooks); Py_CLEAR(self->epoch); Py_CLEAR(self->recipes);
    Py_CLEAR(self->arm); Py_CLEAR(self->run); Py_CLEAR(self->dict);
    for (Py_ssize_t i = 0; i < self->nfast; i++) Py_CLEAR(self->fast[i].hi);
    return 0;
}

static void Site_dealloc(Site *self) {
    PyObject_GC_UnTrack(self);
    if (self->weaklist) PyObject_ClearWeakRefs((PyObject *)self);
    Site_clear(self);
    PyMem_Free(self->key); PyMem_Free(self->fast);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

STEADY_NEW(Site)

/* Site(general, hooks, epoch, nargs, key positions, fast tests ((pos, kind, lo, hi), ...), arm, run, maxsize) */
static int Site_init(Site *self, PyObject *args, PyObject *kw) {
    PyObject *general, *hooks, *epoch, *key, *fast, *arm, *run;
    Py_ssize_t nargs, maxsize;
    if (!PyArg_ParseTuple(args, "OO!O!nO!O!OO!n", &general, &PyList_Type, &hooks, &PyList_Type, &epoch, &nargs,
                          &PyTuple_Type, &key, &PyTuple_Type, &fast, &arm, &RunType, &run, &maxsize))
        return -1;
    if (self->general) { PyErr_SetString(PyExc_TypeError, "Site is initialized once"); return -1; }
    if (PyList_GET_SIZE(epoch) != 1 || nargs < 1) { PyErr_SetString(PyExc_ValueError, "epoch: a list of one item; nargs >= 1"); return -1; }
    Py_ssize_t nk = PyTuple_GET_SIZE(key), nf = PyTuple_GET_SIZE(fast);
    self->key = PyMem_Calloc(nk ? nk : 1, sizeof(Py_ssize_t));
    self->fast = PyMem_Calloc(nf ? nf : 1, sizeof(Fast));
    if (!self->key || !self->fast) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < nk; i++) {
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(key, i));
        if (p == -1 && PyErr_Occurred()) return -1;
        if (p < 0 || p >= nargs) { PyErr_SetString(PyExc_ValueError, "a key position out of range"); return -1; }
        self->key[i] = p;
    }
    self->nkey = nk;
    for (Py_ssize_t i = 0; i < nf; i++) {
        PyObject *f = PyTuple_GET_ITEM(fast, i), *lo, *hi;
        Fast *x = &self->fast[i];
        if (!PyArg_ParseTuple(f, "niOO", &x->pos, &x->kind, &lo, &hi)) return -1;
        if (x->pos < 0 || x->pos >= nargs || x->kind < 0 || x->kind > 2) { PyErr_SetString(PyExc_ValueError, "a bad fast test"); return -1; }
        if (x->kind == 0) {
            x->lo = PyLong_AsLongLong(lo);
            if (x->lo == -1 && PyErr_Occurred()) return -1;
            if (!PyLong_Check(hi)) { PyErr_SetString(PyExc_TypeError, "an int bound"); return -1; }
            Py_INCREF(hi);
            x->hi = hi;
            int overflow;
            x->hi_ll = PyLong_AsLongLongAndOverflow(hi, &overflow);
            if (overflow < 0) { PyErr_SetString(PyExc_ValueError, "an int bound below every int"); return -1; }
            x->hi_big = overflow > 0;
        } else if (x->kind == 1) {
            x->flo = PyFloat_AsDouble(lo);
            x->fhi = PyFloat_AsDouble(hi);
            if (PyErr_Occurred()) return -1;
        }
        self->nfast = i + 1;
    }
    self->recipes = PyDict_New();
    if (self->recipes == NULL) return -1;
    Py_INCREF(general); self->general = general;
    Py_INCREF(hooks); self->hooks = hooks;
    Py_INCREF(epoch); self->epoch = epoch;
    Py_INCREF(arm); self->arm = arm;
    Py_INCREF(run); self->run = run;
    self->nargs = nargs;
    self->maxsize = maxsize;
    return 0;
}

/* 1: the argument passes the wrapper's test for an argument it need not convert, 0: it does not, -1: error */
static int fast_ok(Fast *x, PyObject *v) {
    if (x->kind == 0) {
        if (!PyLong_CheckExact(v)) return 0;
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow < 0 || (!overflow && n < x->lo)) return 0;
        if (!overflow && n == -1 && PyErr_Occurred()) return -1;
        if (!overflow) return x->hi_big || n <= x->hi_ll;
        return x->hi_big ? PyObject_RichCompareBool(v, x->hi, Py_LE) : 0;
    }
    if (x->kind == 1) {
        if (!PyFloat_CheckExact(v)) return 0;
        double d = PyFloat_AS_DOUBLE(v);
        return (isinf(x->fhi) && x->fhi > 0) || (x->flo <= d && d <= x->fhi);  /* no bounds: no test (the wrapper's) */
    }
    return 0;
}

#define POINTER_MIN 4096LL  /* data.POINTER_MIN: the smallest device pointer int */
#define HOST_ADDRESS_MIN 2147483648LL  /* data.HOST_ADDRESS_MIN: an int of this magnitude is an address */


/* data.same_buffer for the forms a replay takes: 1 one buffer, 0 not, -2 a form it cannot tell (the
 * Python path decides), -1 an error.  ``types``: the array types of the place (the recipe's). */
static int same_buffer(PyObject *a, PyObject *b, PyObject *types) {
    if (a == b) return a != Py_None;
    if (a == Py_None || b == Py_None) return 0;
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) return PyObject_RichCompareBool(a, b, Py_EQ);
    if (Py_TYPE(a) != Py_TYPE(b) || PyTuple_GET_SIZE(types) < 2 || (PyObject *)Py_TYPE(a) != PyTuple_GET_ITEM(types, 1))
        return -2;  /* a device array (types[1]) of each: their pointers; anything else the Python path compares */
    PyObject *pa = NULL, *pb = NULL, *da = PyObject_GetAttr(a, S_data), *db = PyObject_GetAttr(b, S_data);
    int r = -1;
    if (da && db && (pa = PyObject_GetAttr(da, S_ptr)) && (pb = PyObject_GetAttr(db, S_ptr)))
        r = PyObject_RichCompareBool(pa, pb, Py_EQ);
    Py_XDECREF(da); Py_XDECREF(db); Py_XDECREF(pa); Py_XDECREF(pb);
    return r;
}

/* d[k] = v for every (k, v) of ``pairs`` (a recipe's constant scalars): 0, or -1 with an error set */
static int put_pairs(PyObject *d, PyObject *pairs) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pairs); i++) {
        PyObject *e = PyTuple_GET_ITEM(pairs, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) { PyErr_SetString(PyExc_TypeError, "a (uid, value) entry"); return -1; }
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(e, 0), PyTuple_GET_ITEM(e, 1)) < 0) return -1;
    }
    return 0;
}

/* A buffer of a bound recipe as ``data._pointers`` takes it: its device address in *out and 1, or 0
 * (another form: the Python path checks it), -1 an error.  *as_is: the buffer itself (borrowed) when
 * bytes needed < 0 (bound as it is), else NULL.  ``e``: (position or -1, the constant buffer when -1,
 * bytes needed, accepted dtypes or None, the place's device array type), ``p`` its position (checked). */
static int bound_pointer(Site *self, PyObject *e, Py_ssize_t p, PyObject *const *args, unsigned long long *out,
                         PyObject **as_is, int *c_order) {
    *as_is = NULL;
    *c_order = 0;
    PyObject *v = p >= 0 ? args[p] : PyTuple_GET_ITEM(e, 1), *accept = PyTuple_GET_ITEM(e, 3);
    long long need = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 2));
    if (need == -1 && PyErr_Occurred()) return -1;
    if (need < 0) { *as_is = v; *out = 0; return 1; }  /* bound as it is (the prepared call's binder checks it) */
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || n < POINTER_MIN) return 0;
        *out = (unsigned long long)n;
        return 1;
    }
    if ((PyObject *)Py_TYPE(v) != PyTuple_GET_ITEM(e, 4)) return 0;
    int t = attr_true(v, S_c);
    *c_order = t > 0;
    if (t == 0) t = attr_true(v, S_f);
    if (t <= 0) return t;
    PyObject *nb = PyObject_GetAttr(v, S_nbytes);
    if (nb == NULL) return -1;
    long long have = PyLong_AsLongLong(nb);
    Py_DECREF(nb);
    if (have == -1 && PyErr_Occurred()) return -1;
    if (have < need) return 0;
    if (accept != Py_None) {
        PyObject *dt = PyObject_GetAttr(v, S_dtype);
        if (dt == NULL) return -1;
        t = PySequence_Contains(accept, dt);
        Py_DECREF(dt);
        if (t <= 0) return t;
    }
    PyObject *data = PyObject_GetAttr(v, S_data), *ptr = data ? PyObject_GetAttr(data, S_ptr) : NULL;
    Py_XDECREF(data);
    if (ptr == NULL) return -1;
    *out = PyLong_AsUnsignedLongLong(ptr);
    Py_DECREF(ptr);
    return (*out == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 1;
}

#define BOUND_MAX 32

/* whether the buffers a bound call binds as they are (``obj``, NULL for the others) are those ``refs``
 * remembers (``as_is_refs``): 1, 0, -1 with an error set */
static int same_as_is(PyObject *refs, PyObject *const *obj, Py_ssize_t n, int as_is) {
    if (refs == Py_None) return !as_is;
    if (!PyTuple_Check(refs) || PyTuple_GET_SIZE(refs) != n) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyTuple_GET_ITEM(refs, i), *o = obj[i];
        if (o == NULL || r == Py_None) {
            if (o != NULL || r != Py_None) return 0;
        } else if (PyWeakref_CheckRef(r)) {
            if (!weak_is(r, o)) return 0;
        } else if (PyLong_CheckExact(r) && PyLong_CheckExact(o)) {
            int eq = PyObject_RichCompareBool(r, o, Py_EQ);
            if (eq <= 0) return eq;
        } else {
            return 0;
        }
    }
    return 1;
}

/* What a bound call's buffers bound as they are (``obj``) were, for ``same_as_is``: *refs (a new
 * reference) None when there are none, else a tuple with, per buffer, None (not bound as it is), a
 * weak reference to the C-contiguous array of the place's type it is (the binder memo's rule: what
 * its binder reads of it is fixed while it lives), or the pointer int it is.  1, 0 when one cannot be
 * remembered (another form), -1 with an error set. */
static int as_is_refs(PyObject *bufs, PyObject *const *obj, Py_ssize_t n, int as_is, PyObject **refs) {
    if (!as_is) { Py_INCREF(Py_None); *refs = Py_None; return 1; }
    PyObject *r = PyTuple_New(n);
    if (r == NULL) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = obj[i], *item = Py_None;
        if (o != NULL && PyLong_CheckExact(o)) {
            item = o;
        } else if (o != NULL) {
            int t = (PyObject *)Py_TYPE(o) == PyTuple_GET_ITEM(PyTuple_GET_ITEM(bufs, i), 4) ? attr_true(o, S_c) : 0;
            if (t <= 0) { Py_DECREF(r); return t; }
            item = PyWeakref_NewRef(o, NULL);
            if (item == NULL) {
                Py_DECREF(r);
                if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
                PyErr_Clear();
                return 0;
            }
            PyTuple_SET_ITEM(r, i, item);
            continue;
        }
        Py_INCREF(item);
        PyTuple_SET_ITEM(r, i, item);
    }
    *refs = r;
    return 1;
}

/* Replay a bound recipe's part (``recipe[11]``: graphs whose tensors sit at byte offsets inside the
 * caller's buffers, ``_core.bound_graph``): (buffers, nulls, minimum, stages, last) with
 *   buffers  ((position or -1, constant or None, bytes needed, dtypes or None, device array type), ...):
 *            each a contiguous device array of an accepted dtype holding the bytes needed, or a
 *            pointer int >= POINTER_MIN (``data.preflight(..., pointers=True)``'s common forms),
 *            bound as its address; bytes needed < 0: bound as it is (offset 0)
 *   nulls    positions that must be NULL (None or 0): the buffers the call site was not given
 *   minimum  ((position, n), ...): an int >= n (the size arguments)
 *   stages   ((key, build, ((uid, buffer index, byte offset, argname), ...), ((uid, value), ...), memo), ...):
 *            the graphs in order, each bound as ``bound_graph.execute`` binds it; memo a list of the
 *            stage's last call with other buffers: [the buffer addresses as bytes (None: not
 *            remembered), its tensors dict and scalars dict (None where a buffer was bound as it
 *            is), a Settled (the prepared call that ran it and the values its binder gave), what the
 *            buffers bound as they are were (``as_is_refs``)].  A call with the same buffers runs
 *            that Settled (the values as they are: ``run_settled``'s per-call tests, then the launch)
 *            or else passes the same dicts (nothing downstream writes them); a call with others
 *            remakes them
 *   last     a list with one slot per buffer: None, or (weak reference, address) of the C-contiguous
 *            array that passed that buffer's checks in an earlier call (the binder memo's rule: an
 *            array's dtype, size, order and address are fixed while it lives), so the same array
 *            again is bound without reading its attributes
 * After the checks every stage goes through its prepared call (``run_prepared``) or else the general
 * path, as the Python path's stages do; a stage that raises sends the call to the Python path, which
 * runs it again from the first stage (they write nothing their own inputs depend on) and raises. */
static int replay_bound(Site *self, PyObject *handle, PyObject *spec, PyObject *const *args) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) { PyErr_SetString(PyExc_TypeError, "a bound recipe"); return -1; }
    PyObject *bufs = PyTuple_GET_ITEM(spec, 0), *nulls = PyTuple_GET_ITEM(spec, 1), *mins = PyTuple_GET_ITEM(spec, 2),
             *stages = PyTuple_GET_ITEM(spec, 3), *last = PyTuple_GET_ITEM(spec, 4);
    if (!PyTuple_Check(bufs) || !PyTuple_Check(nulls) || !PyTuple_Check(mins) || !PyTuple_Check(stages)
            || PyTuple_GET_SIZE(bufs) > BOUND_MAX || PyTuple_GET_SIZE(stages) < 1
            || !PyList_Check(last) || PyList_GET_SIZE(last) != PyTuple_GET_SIZE(bufs)) {
        PyErr_SetString(PyExc_TypeError, "a malformed bound recipe");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nulls); i++) {
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(nulls, i));
        if (p < 0 || p >= self->nargs) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a null position"); return -1; }
        PyObject *v = args[p];
        if (!is_null(v)) return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mins); i++) {
        PyObject *e = PyTuple_GET_ITEM(mins, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) { PyErr_SetString(PyExc_TypeError, "a minimum entry"); return -1; }
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 0));
        if (p < 0 || p >= self->nargs) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a minimum position"); return -1; }
        if (!PyLong_CheckExact(args[p])) return 0;
        int t = PyObject_RichCompareBool(args[p], PyTuple_GET_ITEM(e, 1), Py_GE);
        if (t <= 0) return t;
    }
    unsigned long long ptr[BOUND_MAX];
    PyObject *obj[BOUND_MAX];  /* borrowed: the buffers bound as they are */
    int as_is = 0;
    Py_ssize_t nbufs = PyTuple_GET_SIZE(bufs);
    for (Py_ssize_t i = 0; i < nbufs; i++) {
        PyObject *e = PyTuple_GET_ITEM(bufs, i), *m = PyList_GET_ITEM(last, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 5) { PyErr_SetString(PyExc_TypeError, "a buffer entry"); return -1; }
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 0));
        if (p < -1 || p >= self->nargs) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a buffer position"); return -1; }
        if (p >= 0 && m != Py_None && PyTuple_Check(m) && PyTuple_GET_SIZE(m) == 2 && weak_is(PyTuple_GET_ITEM(m, 0), args[p])) {
            ptr[i] = as_u64(PyTuple_GET_ITEM(m, 1));  /* that array again */
            if (ptr[i] == (unsigned long long)-1 && PyErr_Occurred()) return -1;
            obj[i] = NULL;
            continue;
        }
        int c_order;
        int t = bound_pointer(self, e, p, args, &ptr[i], &obj[i], &c_order);
        if (t <= 0) return t;
        as_is |= obj[i] != NULL;
        if (c_order && obj[i] == NULL && p >= 0) {  /* a caller's array that passed: remembered for its next call */
            PyObject *a = PyLong_FromUnsignedLongLong(ptr[i]), *item = a ? weak_item(args[p], a) : NULL;
            Py_XDECREF(a);
            if (item == NULL) return -1;
            if (item != Py_None) PyList_SetItem(last, i, item);  /* steals item */
        }
    }
    Run *run = (Run *)self->run;
    for (Py_ssize_t s = 0; s < PyTuple_GET_SIZE(stages); s++) {
        PyObject *st = PyTuple_GET_ITEM(stages, s);
        if (!PyTuple_Check(st) || PyTuple_GET_SIZE(st) != 5 || !PyTuple_Check(PyTuple_GET_ITEM(st, 2))
                || !PyTuple_Check(PyTuple_GET_ITEM(st, 3)) || !PyList_Check(PyTuple_GET_ITEM(st, 4))
                || PyList_GET_SIZE(PyTuple_GET_ITEM(st, 4)) != 5) {
            PyErr_SetString(PyExc_TypeError, "a stage entry");
            return -1;
        }
        PyObject *tb = PyTuple_GET_ITEM(st, 2), *sb = PyTuple_GET_ITEM(st, 3), *memo = PyTuple_GET_ITEM(st, 4);
        PyObject *tensors = NULL, *scalars = NULL, *plan = NULL, *sig = PyList_GET_ITEM(memo, 0);
        int rc = -1;
        int same = PyBytes_Check(sig) && PyBytes_GET_SIZE(sig) == (Py_ssize_t)(nbufs * sizeof(ptr[0]))
                   && memcmp(PyBytes_AS_STRING(sig), ptr, nbufs * sizeof(ptr[0])) == 0;
        if (same && (same = same_as_is(PyList_GET_ITEM(memo, 4), obj, nbufs, as_is)) < 0) return -1;
        if (same) {  /* the buffers of the stage's last call */
            PyObject *settled = PyList_GET_ITEM(memo, 3);
            if (Py_TYPE(settled) == &SettledType) {
                Py_INCREF(settled);
                int t = run_settled(run, (Settled *)settled, handle, NULL, NULL, Py_None, NULL, Py_None, &plan);
                Py_DECREF(settled);
                if (t != 0) { rc = t; goto stage_done; }
            }
            if (PyDict_CheckExact(PyList_GET_ITEM(memo, 1)) && PyDict_CheckExact(PyList_GET_ITEM(memo, 2))) {
                tensors = PyList_GET_ITEM(memo, 1);
                scalars = PyList_GET_ITEM(memo, 2);
                Py_INCREF(tensors);
                Py_INCREF(scalars);
                goto run_stage;
            }
        }
        tensors = PyDict_New();
        scalars = PyDict_New();
        if (tensors == NULL || scalars == NULL) goto stage_done;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tb); i++) {
            PyObject *e = PyTuple_GET_ITEM(tb, i);
            if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4) { PyErr_SetString(PyExc_TypeError, "a binding entry"); goto stage_done; }
            Py_ssize_t b = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 1));
            long long off = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 2));
            if (PyErr_Occurred()) goto stage_done;
            if (b < 0 || b >= PyTuple_GET_SIZE(bufs)) { PyErr_SetString(PyExc_ValueError, "a buffer index"); goto stage_done; }
            if (obj[b] && off) { PyErr_SetString(PyExc_ValueError, "an offset into a buffer bound as it is"); goto stage_done; }
            PyObject *addr = obj[b] ? (Py_INCREF(obj[b]), obj[b]) : PyLong_FromUnsignedLongLong(ptr[b] + (unsigned long long)off);
            PyObject *pair = addr ? PyTuple_Pack(2, addr, PyTuple_GET_ITEM(e, 3)) : NULL;
            Py_XDECREF(addr);
            if (pair == NULL) goto stage_done;
            int r = PyDict_SetItem(tensors, PyTuple_GET_ITEM(e, 0), pair);
            Py_DECREF(pair);
            if (r < 0) goto stage_done;
        }
        if (put_pairs(scalars, sb) < 0) goto stage_done;
        if (!same) {  /* this call's buffers, for the next call with the same ones (no caller's array kept alive) */
            PyObject *refs = NULL;
            int k = as_is_refs(bufs, obj, nbufs, as_is, &refs);
            if (k < 0) goto stage_done;
            PyObject *b = k ? PyBytes_FromStringAndSize((const char *)ptr, nbufs * sizeof(ptr[0])) : (Py_INCREF(Py_None), Py_None);
            if (b == NULL) { Py_XDECREF(refs); goto stage_done; }
            PyObject *item[5] = {b, as_is ? Py_None : tensors, as_is ? Py_None : scalars, Py_None, k ? refs : Py_None};
            for (int j = 1; j < 4; j++) Py_INCREF(item[j]);
            if (!k) Py_INCREF(Py_None);
            for (int j = 0; j < 5; j++) PyList_SetItem(memo, j, item[j]);  /* steals each */
        }
    run_stage:
        {  /* every buffer was checked: the stage runs, prepared or by the general path (as bound_graph.execute) */
            PyObject *used = NULL, *vals = NULL;
            int t = run_prepared(run, handle, PyTuple_GET_ITEM(st, 0), tensors, scalars, Py_None, NULL, Py_None, &plan,
                                 &used, &vals);
            if (t == 0) {
                PyObject *rargs[5] = {handle, PyTuple_GET_ITEM(st, 0), PyTuple_GET_ITEM(st, 1), tensors, scalars};
                plan = PyObject_Vectorcall(run->general, rargs, 5, NULL);
                t = plan ? 1 : -1;
            } else if (t > 0 && used != NULL && PyBytes_Check(PyList_GET_ITEM(memo, 0))) {
                /* the memo is this call's buffers: the values they bound to, for the next call with them */
                PyObject *pl = PyObject_GetAttr(handle, S_place), *dev = pl ? PyObject_GetAttr(handle, S_device) : NULL;
                PyObject *bind = dev ? PyObject_GetAttr(used, S_bind) : NULL;
                PyObject *made = bind ? settle_fixed(used, plan, bind, pl, dev, vals) : NULL;
                if (PyErr_Occurred()) PyErr_Clear();  /* an optional cache: the stage ran */
                Py_XDECREF(pl); Py_XDECREF(dev); Py_XDECREF(bind);
                if (made != NULL) PyList_SetItem(memo, 3, made);  /* steals made */
            }
            Py_XDECREF(used); Py_XDECREF(vals);
            rc = t;
        }
    stage_done:
        Py_XDECREF(plan); Py_XDECREF(tensors); Py_XDECREF(scalars);
        if (rc < 0) return -1;  /* the Python path runs the call again and raises what it raises */
    }
    return 1;
}

/* Replay ``recipe`` (a new reference's borrowed view) for ``args``: 1 ran, 0 not taken, -1 error */
static int replay(Site *self, PyObject *recipe, PyObject *const *args) {
    PyObject *tensors = NULL, *scalars = NULL, *plan = NULL;
    int rc = -1;
    if (!PyTuple_Check(recipe) || PyTuple_GET_SIZE(recipe) != 13) { PyErr_SetString(PyExc_TypeError, "a recipe: a tuple of 13"); return -1; }
    PyObject *handle = PyTuple_GET_ITEM(recipe, 1), *keys = PyTuple_GET_ITEM(recipe, 2), *tspec = PyTuple_GET_ITEM(recipe, 3),
             *sspec = PyTuple_GET_ITEM(recipe, 4), *betas = PyTuple_GET_ITEM(recipe, 5), *unread = PyTuple_GET_ITEM(recipe, 6),
             *utypes = PyTuple_GET_ITEM(recipe, 7), *wspec = PyTuple_GET_ITEM(recipe, 8), *consts = PyTuple_GET_ITEM(recipe, 9),
             *distinct = PyTuple_GET_ITEM(recipe, 10);
    if (!PyTuple_Check(keys) || !PyTuple_Check(tspec) || !PyTuple_Check(sspec) || !PyTuple_Check(betas)
            || !PyTuple_Check(unread) || !PyTuple_Check(utypes) || PyTuple_GET_SIZE(betas) > 8
            || PyTuple_GET_SIZE(keys) != ((Py_ssize_t)1 << PyTuple_GET_SIZE(betas))
            || PyTuple_GET_SIZE(sspec) > 16 || (wspec != Py_None && !(PyTuple_Check(wspec) && PyTuple_GET_SIZE(wspec) == 4))
            || !PyTuple_Check(consts) || !PyTuple_Check(distinct)) {
        PyErr_SetString(PyExc_TypeError, "a malformed recipe");
        return -1;
    }
    /* the buffers the call does not read */
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(unread); i++) {
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(unread, i));
        if (p < 0 || p >= self->nargs) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "an unread position"); return -1; }
        PyObject *v = args[p];
        if (is_null(v)) continue;
        int ok = 0;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(utypes); k++)
            if ((PyObject *)Py_TYPE(v) == PyTuple_GET_ITEM(utypes, k)) { ok = 1; break; }
        if (!ok) return 0;
    }
    /* pairs that must not be one buffer (unless a third one is it too): the family's per-call check */
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(distinct); i++) {
        Py_ssize_t p[3];
        PyObject *e = PyTuple_GET_ITEM(distinct, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 3) { PyErr_SetString(PyExc_TypeError, "a distinct entry"); return -1; }
        for (int k = 0; k < 3; k++) {
            p[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, k));
            if (p[k] < 0 || p[k] >= self->nargs) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a distinct position"); return -1; }
        }
        int same = same_buffer(args[p[0]], args[p[1]], utypes);
        if (same < 0) return same == -2 ? 0 : -1;
        if (same) {
            same = same_buffer(args[p[2]], args[p[1]], utypes);
            if (same < 0) return same == -2 ? 0 : -1;
            if (!same) return 0;
        }
    }
    if (PyTuple_GET_ITEM(recipe, 11) != Py_None) return replay_bound(self, handle, PyTuple_GET_ITEM(recipe, 11), args);
    /* the scalars, as data.scalar reads a float or a small int */
    double val[16];
    PyObject *fobj[16];
    Py_ssize_t ns = 0, nsc = PyTuple_GET_SIZE(sspec);
    for (; ns < nsc; ns++) {
        PyObject *e = PyTuple_GET_ITEM(sspec, ns);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 3) { PyErr_SetString(PyExc_TypeError, "a scalar entry"); goto error; }
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 0));
        if (p < 0 || p >= self->nargs) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a scalar position"); goto error; }
        PyObject *v = args[p], *lo = PyTuple_GET_ITEM(e, 2);
        if (PyFloat_CheckExact(v)) {
            val[ns] = PyFloat_AS_DOUBLE(v);
            if (lo != Py_None && !(val[ns] >= PyFloat_AsDouble(lo))) { rc = 0; goto error; }
            Py_INCREF(v);
            fobj[ns] = v;
        } else if (lo == Py_None && PyLong_CheckExact(v)) {
            int overflow;
            long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow || n <= -HOST_ADDRESS_MIN || n >= HOST_ADDRESS_MIN) { rc = 0; goto error; }
            val[ns] = (double)n;
            fobj[ns] = PyFloat_FromDouble(val[ns]);
            if (fobj[ns] == NULL) goto error;
        } else {
            rc = 0;
            goto error;
        }
    }
    Py_ssize_t idx = 0;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(betas); j++) {
        Py_ssize_t b = PyLong_AsSsize_t(PyTuple_GET_ITEM(betas, j));
        if (b < 0 || b >= nsc) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a beta index"); goto error; }
        if (val[b] == 0.0) idx |= (Py_ssize_t)1 << j;
    }
    PyObject *key = PyTuple_GET_ITEM(keys, idx);
    PyObject *ws = Py_None, *wss = NULL, *warg = Py_None;
    if (wspec != Py_None) {
        Py_ssize_t wp = PyLong_AsSsize_t(PyTuple_GET_ITEM(wspec, 0)), sp = PyLong_AsSsize_t(PyTuple_GET_ITEM(wspec, 1));
        if (wp < 0 || wp >= self->nargs || sp < 0 || sp >= self->nargs) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a workspace position");
            goto error;
        }
        ws = args[wp];
        wss = args[sp];
        warg = PyTuple_GET_ITEM(wspec, 2);
        if (!PyLong_CheckExact(wss)) { rc = 0; goto error; }  /* the family's int(size or 0): an int only here */
        int null_zero = PyObject_IsTrue(PyTuple_GET_ITEM(wspec, 3));
        if (null_zero < 0) goto error;
        if (null_zero && is_null(ws)) wss = ZERO;  /* NULL: 0 bytes */
    }
    /* this key's Settled, when the last replay made one that is still valid */
    PyObject *slots = PyTuple_GET_ITEM(recipe, 12);
    PyObject *st = PyList_Check(slots) && idx < PyList_GET_SIZE(slots) ? PyList_GET_ITEM(slots, idx) : NULL;
    if (st != NULL && Py_TYPE(st) == &SettledType) {
        Py_INCREF(st);
        rc = run_settled((Run *)self->run, (Settled *)st, handle, args, fobj, ws, wss, warg, &plan);
        Py_DECREF(st);
        if (rc != 0) goto finish;
    }
    /* the dict path: the scalars, then the tensors uid -> (buffer, argname) */
    scalars = PyDict_New();
    if (scalars == NULL) goto error;
    for (Py_ssize_t i = 0; i < nsc; i++)
        if (PyDict_SetItem(scalars, PyTuple_GET_ITEM(PyTuple_GET_ITEM(sspec, i), 1), fobj[i]) < 0) goto error;
    if (put_pairs(scalars, consts) < 0) goto error;
    tensors = PyDict_New();
    if (tensors == NULL) goto error;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tspec); i++) {
        PyObject *e = PyTuple_GET_ITEM(tspec, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 3) { PyErr_SetString(PyExc_TypeError, "a tensor entry"); goto error; }
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 0));
        if (p < 0 || p >= self->nargs) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a tensor position"); goto error; }
        PyObject *pair = PyTuple_Pack(2, args[p], PyTuple_GET_ITEM(e, 2));
        if (pair == NULL) goto error;
        int r = PyDict_SetItem(tensors, PyTuple_GET_ITEM(e, 1), pair);
        Py_DECREF(pair);
        if (r < 0) goto error;
    }
    PyObject *used = NULL;
    rc = run_prepared((Run *)self->run, handle, key, tensors, scalars, ws, wss, warg, &plan, &used, NULL);
    if (rc > 0 && used != NULL && PyList_Check(slots) && idx < PyList_GET_SIZE(slots)) {
        PyObject *pl = PyObject_GetAttr(handle, S_place), *dev = pl ? PyObject_GetAttr(handle, S_device) : NULL;
        PyObject *bind = dev ? PyObject_GetAttr(used, S_bind) : NULL, *pplan = bind ? PyObject_GetAttr(used, S_plan) : NULL;
        PyObject *made = pplan == plan ? settle(used, plan, bind, pl, dev, tspec, sspec, consts) : NULL;
        if (PyErr_Occurred()) PyErr_Clear();  /* an optional cache: the call ran */
        Py_XDECREF(pl); Py_XDECREF(dev); Py_XDECREF(bind); Py_XDECREF(pplan);
        if (made != NULL) PyList_SetItem(slots, idx, made);  /* steals made */
    }
    Py_XDECREF(used);
finish:
    Py_XDECREF(plan);
    Py_XDECREF(tensors);
    Py_XDECREF(scalars);
    for (Py_ssize_t i = 0; i < ns; i++) Py_DECREF(fobj[i]);
    return rc;
error:
    Py_XDECREF(tensors);
    Py_XDECREF(scalars);
    for (Py_ssize_t i = 0; i < ns; i++) Py_DECREF(fobj[i]);
    return rc;
}

static PyObject *Site_vcall(Site *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *ck = NULL, *recipe = NULL, *res;
    if (self->general == NULL) { PyErr_SetString(PyExc_RuntimeError, "a cleared site"); return NULL; }
    if ((kwnames && PyTuple_GET_SIZE(kwnames)) || nargs != self->nargs || PyList_GET_SIZE(self->hooks)) goto general;
    for (Py_ssize_t i = 0; i < self->nfast; i++) {
        int t = fast_ok(&self->fast[i], args[self->fast[i].pos]);
        if (t <= 0) { if (t < 0) return NULL; goto general; }
    }
    ck = PyTuple_New(self->nkey);
    if (ck == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->nkey; i++) {
        PyObject *v = args[self->key[i]];
        Py_INCREF(v);
        PyTuple_SET_ITEM(ck, i, v);
    }
    recipe = PyDict_GetItemWithError(self->recipes, ck);
    if (recipe == NULL) {
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) goto error;
            PyErr_Clear();  /* an unhashable argument: no recipe (the general way says what it is) */
            Py_CLEAR(ck);
            goto general;
        }
        goto general_arm;
    }
    Py_INCREF(recipe);  /* another thread may replace it while the launch runs Python code */
    if (!PyTuple_Check(recipe) || PyTuple_GET_SIZE(recipe) < 2
            || PyTuple_GET_ITEM(recipe, 0) != PyList_GET_ITEM(self->epoch, 0)) {
        Py_CLEAR(recipe);
        goto general_arm;
    }
    if (PyTuple_GET_ITEM(recipe, 1) == Py_None) { Py_CLEAR(recipe); Py_CLEAR(ck); goto general; }
    int t = replay(self, recipe, args);
    Py_CLEAR(recipe);
    if (t < 0) {  /* a check that failed (a CuDNNError, before anything is written): the Python path raises it
                   * as the wrapper converts it, naming the function */
        if (!PyErr_ExceptionMatches(PyExc_Exception)) goto error;
        PyErr_Clear();
        Py_CLEAR(ck);
        goto general;
    }
    if (t > 0) { Py_DECREF(ck); Py_RETURN_NONE; }
    Py_CLEAR(ck);
    goto general;
general_arm:
    res = PyObject_Vectorcall(self->general, args, nargsf, kwnames);
    if (res == NULL) goto error;
    PyObject *a = PyObject_Vectorcall(self->arm, args, nargs, NULL);
    if (a == NULL) { Py_DECREF(res); goto error; }
    if (a != Py_None) {
        if (PyDict_GET_SIZE(self->recipes) >= self->maxsize) PyDict_Clear(self->recipes);
        if (PyDict_SetItem(self->recipes, ck, a) < 0) { Py_DECREF(a); Py_DECREF(res); goto error; }
    }
    Py_DECREF(a);
    Py_DECREF(ck);
    return res;
general:
    return PyObject_Vectorcall(self->general, args, nargsf, kwnames);
error:
    Py_XDECREF(ck);
    Py_XDECREF(recipe);
    return NULL;
}

static PyObject *Site_get_general(Site *self, void *closure) { Py_INCREF(self->general); return self->general; }
static PyObject *Site_get_recipes(Site *self, void *closure) { Py_INCREF(self->recipes); return self->recipes; }

static PyObject *Site_descr_get(PyObject *self, PyObject *obj, PyObject *type) {  /* binds like a function */
    if (obj == NULL || obj == Py_None) { Py_INCREF(self); return self; }
    return PyMethod_New(self, obj);
}

static PyGetSetDef Site_getset[] = {
    {"general", (getter)Site_get_general, NULL, "the Python wrapper", NULL},
    {"recipes", (getter)Site_get_recipes, NULL, "argument tuple -> recipe", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

STEADY_TYPE(Site, Py_TPFLAGS_METHOD_DESCRIPTOR, "a legacy function made again from its call sites' steady recipes (see _steady.c)",
            .tp_getset = Site_getset, .tp_descr_get = Site_descr_get, .tp_dictoffset = offsetof(Site, dict),
            .tp_weaklistoffset = offsetof(Site, weaklist))

/* ---------------------------------------------------------------------------------------------- */
/* the recording launch stub (tests): what a launch would have passed                             */

#define STUB_MAX 64
static struct { void *f; unsigned g[3], b[3], shm; void *stream; uint64_t args[8]; int nargs; } stub_log[STUB_MAX];
static int stub_n, stub_nargs = 0, stub_status = 0;

static int stub_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shm, void *stream, void **params, void **extra) {
    if (stub_status) return stub_status;
    if (stub_n < STUB_MAX) {
        stub_log[stub_n].f = f; stub_log[stub_n].stream = stream; stub_log[stub_n].shm = shm;
        stub_log[stub_n].g[0] = gx; stub_log[stub_n].g[1] = gy; stub_log[stub_n].g[2] = gz;
        stub_log[stub_n].b[0] = bx; stub_log[stub_n].b[1] = by; stub_log[stub_n].b[2] = bz;
        stub_log[stub_n].nargs = stub_nargs;
        for (int i = 0; i < stub_nargs && i < 8; i++) memcpy(&stub_log[stub_n].args[i], params[i], 8);
    }
    stub_n++;
    return 0;
}

static int stub_graph_launch(void *exe, void *stream) {  /* logged as a launch of f = exe, no arguments */
    if (stub_status) return stub_status;
    if (stub_n < STUB_MAX) {
        memset(&stub_log[stub_n], 0, sizeof(stub_log[stub_n]));
        stub_log[stub_n].f = exe; stub_log[stub_n].stream = stream;
    }
    stub_n++;
    return 0;
}

/* the Kernels stubs: cuLaunchKernelEx logged as stub_launch logs, with its attributes (stub_attrs);
 * a memset logged as f = dst, grid = (width, height, value), block = (element size, 0, 0), shm = pitch */
typedef struct { int id; char pad[4]; unsigned char val[64]; } launch_attribute;  /* CUlaunchAttribute */
static struct { int n; int id[4]; unsigned v[4][3]; } stub_attr_log[STUB_MAX];

static int stub_launch_ex(const launch_config *c, void *f, void **params, void **extra) {
    int at = stub_n;
    int st = stub_launch(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->shm, c->stream, params, extra);
    if (st == 0 && at < STUB_MAX) {
        const launch_attribute *a = (const launch_attribute *)c->attrs;
        stub_attr_log[at].n = (int)c->nattrs;
        for (unsigned i = 0; i < c->nattrs && i < 4; i++) {
            stub_attr_log[at].id[i] = a[i].id;
            memcpy(stub_attr_log[at].v[i], a[i].val, sizeof(stub_attr_log[at].v[i]));
        }
    }
    return st;
}

static int stub_memset(unsigned esize, unsigned long long dst, size_t pitch, unsigned v, size_t w, size_t h, void *stream) {
    if (stub_status) return stub_status;
    if (stub_n < STUB_MAX) {
        memset(&stub_log[stub_n], 0, sizeof(stub_log[stub_n]));
        stub_attr_log[stub_n].n = 0;
        stub_log[stub_n].f = (void *)(uintptr_t)dst; stub_log[stub_n].stream = stream; stub_log[stub_n].shm = (unsigned)pitch;
        stub_log[stub_n].g[0] = (unsigned)w; stub_log[stub_n].g[1] = (unsigned)h; stub_log[stub_n].g[2] = v;
        stub_log[stub_n].b[0] = esize;
    }
    stub_n++;
    return 0;
}

static int stub_m8(unsigned long long d, size_t p, unsigned char v, size_t w, size_t h, void *s) { return stub_memset(1, d, p, v, w, h, s); }
static int stub_m16(unsigned long long d, size_t p, unsigned short v, size_t w, size_t h, void *s) { return stub_memset(2, d, p, v, w, h, s); }
static int stub_m32(unsigned long long d, size_t p, unsigned int v, size_t w, size_t h, void *s) { return stub_memset(4, d, p, v, w, h, s); }

static PyObject *kernels_stub(PyObject *mod, PyObject *args) {
    int nargs, status = 0;
    if (!PyArg_ParseTuple(args, "i|i", &nargs, &status)) return NULL;
    if (nargs < 0 || nargs > 8) { PyErr_SetString(PyExc_ValueError, "0 to 8 arguments"); return NULL; }
    stub_n = 0; stub_nargs = nargs; stub_status = status;
    return Py_BuildValue("(KKKK)", (unsigned long long)(uintptr_t)stub_launch_ex, (unsigned long long)(uintptr_t)stub_m8,
                         (unsigned long long)(uintptr_t)stub_m16, (unsigned long long)(uintptr_t)stub_m32);
}

static PyObject *stub_attrs(PyObject *mod, PyObject *unused) {
    int n = stub_n < STUB_MAX ? stub_n : STUB_MAX;
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (int k = 0; k < n; k++) {
        int na = stub_attr_log[k].n < 4 ? stub_attr_log[k].n : 4;
        PyObject *t = PyTuple_New(na);
        if (!t) { Py_DECREF(out); return NULL; }
        for (int i = 0; i < na; i++) {
            PyObject *e = Py_BuildValue("(i(III))", stub_attr_log[k].id[i], stub_attr_log[k].v[i][0], stub_attr_log[k].v[i][1],
                                        stub_attr_log[k].v[i][2]);
            if (!e) { Py_DECREF(t); Py_DECREF(out); return NULL; }
            PyTuple_SET_ITEM(t, i, e);
        }
        PyList_SET_ITEM(out, k, t);
    }
    return out;
}

static PyObject *stub(PyObject *mod, PyObject *args) {
    int nargs, status = 0;
    if (!PyArg_ParseTuple(args, "i|i", &nargs, &status)) return NULL;
    if (nargs < 0 || nargs > 8) { PyErr_SetString(PyExc_ValueError, "0 to 8 arguments"); return NULL; }
    stub_n = 0; stub_nargs = nargs; stub_status = status;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)stub_launch);
}

static PyObject *graph_stub(PyObject *mod, PyObject *args) {
    int status = 0;
    if (!PyArg_ParseTuple(args, "|i", &status)) return NULL;
    stub_n = 0; stub_nargs = 0; stub_status = status;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)stub_graph_launch);
}

static PyObject *stub_calls(PyObject *mod, PyObject *unused) {
    int n = stub_n < STUB_MAX ? stub_n : STUB_MAX;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int k = 0; k < n; k++) {
        PyObject *a = PyTuple_New(stub_log[k].nargs);
        if (!a) { Py_DECREF(out); return NULL; }
        for (int i = 0; i < stub_log[k].nargs; i++) PyTuple_SET_ITEM(a, i, PyBytes_FromStringAndSize((char *)&stub_log[k].args[i], 8));
        PyObject *t = Py_BuildValue("(K(III)(III)IKN)", (unsigned long long)(uintptr_t)stub_log[k].f,
                                    stub_log[k].g[0], stub_log[k].g[1], stub_log[k].g[2],
                                    stub_log[k].b[0], stub_log[k].b[1], stub_log[k].b[2], stub_log[k].shm,
                                    (unsigned long long)(uintptr_t)stub_log[k].stream, a);
        if (!t || PyList_Append(out, t) < 0) { Py_XDECREF(t); Py_DECREF(out); return NULL; }
        Py_DECREF(t);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"stub", stub, METH_VARARGS, "stub(nargs, status=0) -> the address of a recording launch function (tests)"},
    {"graph_stub", graph_stub, METH_VARARGS, "graph_stub(status=0) -> the address of a recording graph launch "
     "function (tests): stub_calls() lists its launches as (graphExec, (0, 0, 0), (0, 0, 0), 0, stream, ())"},
    {"kernels_stub", kernels_stub, METH_VARARGS, "kernels_stub(nargs, status=0) -> recording (cuLaunchKernelEx, "
     "cuMemsetD2D8Async, cuMemsetD2D16Async, cuMemsetD2D32Async) addresses (tests; see stub_calls, stub_attrs)"},
    {"stub_attrs", stub_attrs, METH_NOARGS, "per launch since a stub: ((attribute id, its first 3 uint32), ...)"},
    {"bump", bump, METH_NOARGS, "make every Settled stale (the prepared-call tables changed)"},
    {"stub_calls", stub_calls, METH_NOARGS, "the launches the stub saw since stub(): (f, grid, block, shm, stream, args)"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_steady", "The steady path of a prepared call, compiled (see _steady.c).", -1, methods};

PyMODINIT_FUNC PyInit__steady(void) {
    if (PyType_Ready(&ValuesType) < 0 || PyType_Ready(&LauncherType) < 0 || PyType_Ready(&RunType) < 0
            || PyType_Ready(&SiteType) < 0 || PyType_Ready(&ReplayType) < 0
            || PyType_Ready(&KernelsType) < 0 || PyType_Ready(&SettledType) < 0
            || PyType_Ready(&ThreadLastType) < 0) return NULL;
#define INTERN(v, s) if (!(v = PyUnicode_InternFromString(s))) return NULL
    INTERN(S_dtype, "dtype"); INTERN(S_c, "_c_contiguous"); INTERN(S_f, "_f_contiguous"); INTERN(S_nbytes, "nbytes");
    INTERN(S_data, "data"); INTERN(S_ptr, "ptr"); INTERN(S_switch, "switch"); INTERN(S_place, "place"); INTERN(S_owner, "owner");
    INTERN(S_device, "device"); INTERN(S_plan, "plan"); INTERN(S_retired, "retired"); INTERN(S_stream, "stream");
    INTERN(S_bind, "bind"); INTERN(S_via, "via_execute"); INTERN(S_launch, "launch"); INTERN(S_calls, "calls");
    INTERN(S_key, "key"); INTERN(S_wsize, "workspace_size"); INTERN(S_ws, "workspace"); INTERN(S_wss, "workspace_size");
    INTERN(S_warg, "workspace_arg");
    if (!(ZERO = PyLong_FromLong(0)) || !(ONE = PyLong_FromLong(1))) return NULL;
#undef INTERN
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ValuesType);
    Py_INCREF(&LauncherType);
    Py_INCREF(&RunType);
    Py_INCREF(&SiteType);
    Py_INCREF(&ReplayType);
    Py_INCREF(&KernelsType);
    Py_INCREF(&ThreadLastType);
    if (PyModule_AddObject(m, "Replay", (PyObject *)&ReplayType) < 0 ||
        PyModule_AddObject(m, "Kernels", (PyObject *)&KernelsType) < 0 ||
        PyModule_AddObject(m, "Run", (PyObject *)&RunType) < 0 ||
        PyModule_AddObject(m, "ThreadLast", (PyObject *)&ThreadLastType) < 0 ||
        PyModule_AddObject(m, "Site", (PyObject *)&SiteType) < 0 ||
        PyModule_AddObject(m, "Values", (PyObject *)&ValuesType) < 0 ||
        PyModule_AddObject(m, "Launcher", (PyObject *)&LauncherType) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
