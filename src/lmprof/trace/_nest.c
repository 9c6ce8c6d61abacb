/*
 * lmprof.trace._nest: the parent of each host event (lmprof.trace.nesting), in one sequential pass.
 *
 * Why it exists: nesting.py finds parents by vectorised pointer jumping, about 20 numpy rounds over
 * the events (50 ms for 400k events, a fifth of the analysis). Walking each event's chain of
 * candidates in order costs a few ms.
 *
 * What it computes (the same as nesting._jump_parents; tests/test_trace_nesting_native.py compares
 * both): events sorted by (thread, start, -duration); the parent of event i is the nearest earlier
 * event c of its thread with end[c] > start[i] and end[c] + slack >= end[i], else -1. The walk
 * tries i - 1, then that candidate's parent, and so on: everything skipped fails for i (see
 * nesting._jump_parents). Nested traces take a step or two per event, but a hostile trace could
 * make walks long, so after ``budget`` steps in all it gives up and returns False; the caller then
 * runs the numpy version, whose cost has a bound.
 *
 * parents(start, end, thread, slack, budget, out) -> bool
 *   start, end  float64 buffers of n values; thread: int32 buffer (equal for events of one thread,
 *               consecutive); out: a writable int64 buffer of n values that receives the positions
 *               (-1: no parent). Returns True when done, False when the budget ran out.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static int get(PyObject *obj, Py_buffer *view, int flags, Py_ssize_t itemsize, Py_ssize_t n, const char *what) {
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return -1;
    if (view->itemsize != itemsize || view->len != n * itemsize) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items of %zd bytes", what, n, itemsize);
        return -1;
    }
    return 0;
}

static PyObject *parents(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_start, *o_end, *o_thread, *o_out;
    double slack;
    long long budget;
    if (!PyArg_ParseTuple(args, "OOOdLO", &o_start, &o_end, &o_thread, &slack, &budget, &o_out)) return NULL;
    Py_buffer b_start, b_end, b_thread, b_out;
    if (PyObject_GetBuffer(o_start, &b_start, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return NULL;
    if (b_start.itemsize != 8) {
        PyBuffer_Release(&b_start);
        PyErr_SetString(PyExc_ValueError, "start: expected float64");
        return NULL;
    }
    Py_ssize_t n = b_start.len / 8;
    if (get(o_end, &b_end, PyBUF_SIMPLE, 8, n, "end") != 0) {
        PyBuffer_Release(&b_start);
        return NULL;
    }
    if (get(o_thread, &b_thread, PyBUF_SIMPLE, 4, n, "thread") != 0) {
        PyBuffer_Release(&b_start);
        PyBuffer_Release(&b_end);
        return NULL;
    }
    if (get(o_out, &b_out, PyBUF_WRITABLE, 8, n, "out") != 0) {
        PyBuffer_Release(&b_start);
        PyBuffer_Release(&b_end);
        PyBuffer_Release(&b_thread);
        return NULL;
    }
    const double *start = (const double *)b_start.buf, *end = (const double *)b_end.buf;
    const int32_t *thread = (const int32_t *)b_thread.buf;
    int64_t *parent = (int64_t *)b_out.buf;
    int done = 1;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t lo = 0; /* the first event of i's thread */
    long long steps = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0 && thread[i] != thread[i - 1]) lo = i;
        int64_t c = (int64_t)i - 1, p = -1;
        while (c >= lo) {
            if (end[c] > start[i] && end[c] + slack >= end[i]) {
                p = c;
                break;
            }
            c = parent[c];
            if (++steps > budget) break;
        }
        if (steps > budget) {
            done = 0;
            break;
        }
        parent[i] = p;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b_start);
    PyBuffer_Release(&b_end);
    PyBuffer_Release(&b_thread);
    PyBuffer_Release(&b_out);
    return PyBool_FromLong(done);
}

static PyMethodDef methods[] = {
    {"parents", parents, METH_VARARGS, "Parents of events sorted by (thread, start, -duration) (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nest", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nest(void) { return PyModule_Create(&module); }
