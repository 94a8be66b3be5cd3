/* One pass over a block of trace lines for what the reader checks before decoding it whole:
 * how many lines end in it, and whether it holds a run of 19 or more digits (an integer that
 * may lie outside 64 bits: kvdiag/trace/reader.py decodes such a block line by line).
 *
 * reader.py does the same with bytes.count and bytes.translate + find (the reference, and the
 * path without a C compiler); tests/test_trace_blockscan.py holds the two equal. Nothing here
 * reads outside the buffer it is given.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define RUN 19

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* scan(block) -> (newlines, long_digits) */
static PyObject *scan(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *s = view.buf, *end = s + view.len;
    Py_ssize_t n = view.len, lines = 0;
    for (const unsigned char *p = s; p < end;) {
        const unsigned char *q = memchr(p, '\n', (size_t)(end - p));
        if (!q) break;
        lines++;
        p = q + 1;
    }
    /* a window of RUN digits: where its last byte is not a digit, no window holding that byte
     * is one, so the search skips past it; else it looks back for the nearest non-digit */
    int found = 0;
    for (Py_ssize_t i = 0; i + RUN <= n;) {
        if (!is_digit(s[i + RUN - 1])) {
            i += RUN;
            continue;
        }
        Py_ssize_t j = i + RUN - 2;
        while (j >= i && is_digit(s[j])) j--;
        if (j < i) {
            found = 1;
            break;
        }
        i = j + 1;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nO)", lines, found ? Py_True : Py_False);
}

/* holds(items, types) -> (a None among items, an item of one of types): what a decoded block
 * holds, by pointer (kvdiag/tui/judging.py asks it of every slice it decodes; ``None in
 * items`` and a set of their types cost 0.5 us per event there, measured) */
static PyObject *holds(PyObject *self, PyObject *args) {
    PyObject *items, *types;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &items, &PyTuple_Type, &types))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items), k = PyTuple_GET_SIZE(types);
    int none = 0, typed = 0;
    for (Py_ssize_t i = 0; i < n && !(none && typed); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (item == Py_None) {
            none = 1;
            continue;
        }
        PyObject *t = (PyObject *)Py_TYPE(item);
        for (Py_ssize_t j = 0; j < k; j++)
            if (PyTuple_GET_ITEM(types, j) == t) typed = 1;
    }
    return Py_BuildValue("(OO)", none ? Py_True : Py_False, typed ? Py_True : Py_False);
}

/* rising(items, last, end_type) -> the last item's seq where every item's seq is a 64-bit int
 * above the one before it (the first above ``last``) and none is an ``end_type``; False where
 * not; None where it cannot tell (a seq that is not such an int: the caller asks Python).
 * reader.py's TraceReader._fast_accept, the reference. */
static PyObject *rising(PyObject *self, PyObject *args) {
    PyObject *items, *end_type, *name = NULL;
    long long last;
    if (!PyArg_ParseTuple(args, "O!LO", &PyList_Type, &items, &last, &end_type)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if ((PyObject *)Py_TYPE(item) == end_type) Py_RETURN_FALSE;
    }
    name = PyUnicode_InternFromString("seq");
    if (!name) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyObject_GetAttr(PyList_GET_ITEM(items, i), name);
        if (!v) {
            Py_DECREF(name);
            return NULL;
        }
        int overflow = 0;
        long long seq = PyLong_Check(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : 0;
        int is_int = PyLong_Check(v) && !overflow && !(seq == -1 && PyErr_Occurred());
        Py_DECREF(v);
        if (!is_int) {
            PyErr_Clear();
            Py_DECREF(name);
            Py_RETURN_NONE;
        }
        if (seq <= last) {
            Py_DECREF(name);
            Py_RETURN_FALSE;
        }
        last = seq;
    }
    Py_DECREF(name);
    return PyLong_FromLongLong(last);
}

static PyMethodDef methods[] = {
    {"rising", rising, METH_VARARGS, "The last seq of events in rising seq order without End."},
    {"scan", scan, METH_O, "(newlines, holds a run of 19 digits) of a block of bytes."},
    {"holds", holds, METH_VARARGS, "(holds None, holds an item of one of types) of a list."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_blockscan", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__blockscan(void) { return PyModule_Create(&module); }
