/* Comparisons of log bytes shared by kvdiag perf's C helpers (perfbytes.c, perfpairs.c): every
 * read is bounded by the end it is given. */
#ifndef KVDIAG_LOGBYTES_H
#define KVDIAG_LOGBYTES_H

#include <Python.h>
#include <string.h>

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static inline int has(const unsigned char *b, Py_ssize_t q, Py_ssize_t end, const char *lit,
                      Py_ssize_t n) {
    return end - q >= n && memcmp(b + q, lit, (size_t)n) == 0;
}

#endif
