/*
 * A tiny stand-in for a CPython image, for the fuzz corpus (see
 * docs/fuzzing.md; fuzz/examples/make-corpus.rs builds it with gcc): the
 * symbols tracer resolves (Py_Version, _PyRuntime opening with
 * _Py_DebugOffsets' cookie and version, _Py_NewReference, the allocator
 * functions), a SystemTap marker, and, at -O2 with -g, DWARF that records
 * _Py_NewReference and PyObject_Malloc inlined into their callers, with
 * their parameters' locations. A few kilobytes, where a real libpython is
 * tens of megabytes.
 */
#include <stddef.h>

#ifndef PY_HEX
#define PY_HEX 0x030B07F0UL
#endif

typedef struct object {
    long ob_refcnt;
    struct object *ob_type;
    long ob_size;
} PyObject;

const unsigned long Py_Version = PY_HEX;

/* _PyRuntime starts with _Py_DebugOffsets (3.13+): the cookie, then the
 * version. The rest is data, not zeroes, so that it is in the file. */
struct runtime {
    char cookie[8];
    unsigned long version;
    long filler[32];
};
struct runtime _PyRuntime = {"xdebugpy", PY_HEX, {1}};

/* The reference tracer (3.13+ keeps it in _PyRuntime; here a variable of
 * its own, which each inlined copy reads by address). */
__attribute__((visibility("hidden"))) void (*_Py_RefTracer)(PyObject *, int, void *);
__attribute__((visibility("hidden"))) void *_Py_RefTracerData;

/* One allocator domain: the context and four functions, as
 * PyMemAllocatorEx has them. */
struct allocator {
    void *ctx;
    void *(*malloc)(void *, size_t);
    void *(*calloc)(void *, size_t, size_t);
    void *(*realloc)(void *, void *, size_t);
    void (*free)(void *, void *);
};

static char arena[1 << 12];
static size_t used;

static void *arena_malloc(void *ctx, size_t size) {
    (void)ctx;
    if (used + size > sizeof arena) return 0;
    used += size;
    return arena + used - size;
}

static void *arena_calloc(void *ctx, size_t n, size_t size) { return arena_malloc(ctx, n * size); }
static void *arena_realloc(void *ctx, void *p, size_t size) { (void)p; return arena_malloc(ctx, size); }
static void arena_free(void *ctx, void *p) { (void)ctx; (void)p; }

__attribute__((visibility("hidden"))) struct allocator _PyObject = {0, arena_malloc, arena_calloc, arena_realloc, arena_free};

PyObject PyType_Type = {1, &PyType_Type, 0};
PyObject PyUnicode_Type = {1, &PyType_Type, 0};

void *PyObject_Malloc(size_t size) { return _PyObject.malloc(_PyObject.ctx, size); }
void PyObject_Free(void *ptr) { _PyObject.free(_PyObject.ctx, ptr); }

void *PyRefTracer_GetTracer(void **data) {
    if (data) *data = _Py_RefTracerData;
    return (void *)_Py_RefTracer;
}

void _Py_NewReference(PyObject *op) {
    op->ob_refcnt = 1;
    if (_Py_RefTracer) _Py_RefTracer(op, 0, _Py_RefTracerData);
}

/* A SystemTap marker as sys/sdt.h's STAP_PROBE1 writes one: a nop at the
 * site, and a note naming it, its base and its argument. */
#define MARKER(name, arg)                                                                      \
    __asm__ __volatile__("990: nop\n"                                                          \
                         ".pushsection .note.stapsdt,\"?\",\"note\"\n"                         \
                         ".balign 4\n"                                                         \
                         ".4byte 992f-991f, 994f-993f, 3\n"                                    \
                         "991: .asciz \"stapsdt\"\n"                                           \
                         "992: .balign 4\n"                                                    \
                         "993: .8byte 990b\n"                                                  \
                         ".8byte _.stapsdt.base\n"                                             \
                         ".8byte 0\n"                                                          \
                         ".asciz \"python\"\n"                                                 \
                         ".asciz \"" name "\"\n"                                               \
                         ".asciz \"-4@%0\"\n"                                                  \
                         "994: .balign 4\n"                                                    \
                         ".popsection\n"                                                       \
                         ".ifndef _.stapsdt.base\n"                                            \
                         ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n" \
                         ".weak _.stapsdt.base\n"                                              \
                         ".hidden _.stapsdt.base\n"                                            \
                         "_.stapsdt.base: .space 1\n"                                          \
                         ".size _.stapsdt.base, 1\n"                                           \
                         ".popsection\n"                                                       \
                         ".endif\n"                                                            \
                         :                                                                     \
                         : "nor"(arg))

/* Callers into which -O2 inlines _Py_NewReference and PyObject_Malloc. */
PyObject *PyTuple_New(long size) {
    PyObject *op = PyObject_Malloc(sizeof(PyObject) + (size_t)size * sizeof(PyObject *));
    if (!op) return 0;
    op->ob_type = &PyType_Type;
    op->ob_size = size;
    _Py_NewReference(op);
    return op;
}

PyObject *PyUnicode_New(long size, int kind) {
    PyObject *op = PyObject_Malloc(sizeof(PyObject) + (size_t)(size + 1) * (size_t)kind);
    if (!op) return 0;
    op->ob_type = &PyUnicode_Type;
    op->ob_size = size;
    _Py_NewReference(op);
    return op;
}

long _PyGC_Collect(int generation) {
    MARKER("gc__start", generation);
    long collected = (long)used / 16 + generation;
    MARKER("gc__done", collected);
    return collected;
}

int Py_Initialize(void) { return PyTuple_New(1) != 0; }
