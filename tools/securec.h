/*
 * A minimal stand-in for securec.h (Huawei's bounds-checked C library, libboundscheck, which a
 * CANN install puts on the include path), so that CANN's sample programs compile against
 * tools/ascend-double.sh DIR with -IDIR/include. Only the calls those samples use, inline, with
 * the library's contract where it matters to them: EOK (0) on success, and a non-zero error
 * (with the destination cleared where the real library clears it) when the destination is too
 * small or a pointer is NULL. Not Huawei's implementation and not a complete one: a program
 * built against a real CANN uses CANN's.
 */
#ifndef HIXL_SECUREC_STANDIN_H
#define HIXL_SECUREC_STANDIN_H

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <stdarg.h>

#ifndef EOK
#define EOK 0
#endif
typedef int errno_t;

#define HIXL_SECUREC_EINVAL 22
#define HIXL_SECUREC_ERANGE 34

static inline errno_t memset_s(void *dest, size_t destMax, int c, size_t count) {
    if (dest == NULL) return HIXL_SECUREC_EINVAL;
    if (count > destMax) {
        memset(dest, c, destMax);
        return HIXL_SECUREC_ERANGE;
    }
    memset(dest, c, count);
    return EOK;
}

static inline errno_t memcpy_s(void *dest, size_t destMax, const void *src, size_t count) {
    if (dest == NULL || src == NULL) return HIXL_SECUREC_EINVAL;
    if (count > destMax) {
        memset(dest, 0, destMax);
        return HIXL_SECUREC_ERANGE;
    }
    memmove(dest, src, count);
    return EOK;
}

static inline errno_t strcpy_s(char *dest, size_t destMax, const char *src) {
    size_t n;
    if (dest == NULL || src == NULL || destMax == 0) return HIXL_SECUREC_EINVAL;
    n = strlen(src);
    if (n >= destMax) {
        dest[0] = 0;
        return HIXL_SECUREC_ERANGE;
    }
    memcpy(dest, src, n + 1);
    return EOK;
}

static inline errno_t strncpy_s(char *dest, size_t destMax, const char *src, size_t count) {
    size_t n;
    if (dest == NULL || src == NULL || destMax == 0) return HIXL_SECUREC_EINVAL;
    n = strnlen(src, count);
    if (n >= destMax) {
        dest[0] = 0;
        return HIXL_SECUREC_ERANGE;
    }
    memcpy(dest, src, n);
    dest[n] = 0;
    return EOK;
}

static inline int sprintf_s(char *dest, size_t destMax, const char *fmt, ...) {
    va_list ap;
    int n;
    if (dest == NULL || fmt == NULL || destMax == 0) return -1;
    va_start(ap, fmt);
    n = vsnprintf(dest, destMax, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= destMax) {
        dest[0] = 0;
        return -1;
    }
    return n;
}

#endif
