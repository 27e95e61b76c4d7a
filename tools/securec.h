/*
 * securec.h: a minimal stand-in for the header of Huawei's bounds-checked C library (libc_sec,
 * whose open form is openEuler's libboundscheck), which a CANN install puts on its include path
 * and CANN's headers include. tools/ascend-double.sh copies it to DIR/include when DIR has no
 * securec.h yet, so programs written for CANN compile against the ACL/HCCL test double. Only
 * the common calls, as static inline functions over libc (nothing to link); their return codes
 * are libboundscheck's (EOK 0, EINVAL, ERANGE, and the *_AND_RESET forms when the destination
 * was cleared).
 */
#ifndef HIXL_DOUBLE_SECUREC_H
#define HIXL_DOUBLE_SECUREC_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef EOK
#define EOK 0
#endif
#ifndef ERANGE_AND_RESET
#define EINVAL_AND_RESET (22 | 128)
#define ERANGE_AND_RESET (34 | 128)
#define EOVERLAP_AND_RESET (54 | 128)
#endif
#ifndef SECUREC_STRING_MAX_LEN
#define SECUREC_STRING_MAX_LEN 0x7fffffffUL
#define SECUREC_MEM_MAX_LEN 0x7fffffffUL
#endif

#ifndef __STDC_LIB_EXT1__
typedef int errno_t;
#endif

static inline errno_t memset_s(void *dest, size_t destMax, int c, size_t count) {
  if (dest == NULL || destMax == 0 || destMax > SECUREC_MEM_MAX_LEN) {
    return 22; /* EINVAL */
  }
  if (count > destMax) {
    (void)memset(dest, c, destMax);
    return ERANGE_AND_RESET;
  }
  (void)memset(dest, c, count);
  return EOK;
}

static inline errno_t memcpy_s(void *dest, size_t destMax, const void *src, size_t count) {
  if (dest == NULL || destMax == 0 || destMax > SECUREC_MEM_MAX_LEN) {
    return 22;
  }
  if (src == NULL) {
    (void)memset(dest, 0, destMax);
    return EINVAL_AND_RESET;
  }
  if (count > destMax) {
    (void)memset(dest, 0, destMax);
    return ERANGE_AND_RESET;
  }
  const char *s = (const char *)src;
  char *d = (char *)dest;
  if (count > 0 && ((d <= s && s < d + count) || (s <= d && d < s + count))) {
    (void)memset(dest, 0, destMax);
    return EOVERLAP_AND_RESET;
  }
  (void)memcpy(dest, src, count);
  return EOK;
}

static inline errno_t memmove_s(void *dest, size_t destMax, const void *src, size_t count) {
  if (dest == NULL || destMax == 0 || destMax > SECUREC_MEM_MAX_LEN) {
    return 22;
  }
  if (src == NULL || count > destMax) {
    (void)memset(dest, 0, destMax);
    return src == NULL ? EINVAL_AND_RESET : ERANGE_AND_RESET;
  }
  (void)memmove(dest, src, count);
  return EOK;
}

/* strnlen without POSIX */
static inline size_t securec_strnlen(const char *s, size_t max) {
  size_t n = 0;
  while (n < max && s[n] != '\0') {
    ++n;
  }
  return n;
}

static inline errno_t strncpy_s(char *dest, size_t destMax, const char *src, size_t count) {
  if (dest == NULL || destMax == 0 || destMax > SECUREC_STRING_MAX_LEN) {
    return 34; /* ERANGE */
  }
  if (src == NULL) {
    dest[0] = '\0';
    return EINVAL_AND_RESET;
  }
  size_t n = securec_strnlen(src, count);
  if (n >= destMax) {
    dest[0] = '\0';
    return ERANGE_AND_RESET;
  }
  (void)memmove(dest, src, n);
  dest[n] = '\0';
  return EOK;
}

static inline errno_t strcpy_s(char *dest, size_t destMax, const char *src) {
  return strncpy_s(dest, destMax, src, src == NULL ? 0 : strlen(src));
}

static inline errno_t strncat_s(char *dest, size_t destMax, const char *src, size_t count) {
  if (dest == NULL || destMax == 0 || destMax > SECUREC_STRING_MAX_LEN) {
    return 34;
  }
  size_t have = securec_strnlen(dest, destMax);
  if (src == NULL || have == destMax) {
    dest[0] = '\0';
    return src == NULL ? EINVAL_AND_RESET : 22 | 128;
  }
  return strncpy_s(dest + have, destMax - have, src, count) == EOK ? EOK : (dest[0] = '\0', ERANGE_AND_RESET);
}

static inline errno_t strcat_s(char *dest, size_t destMax, const char *src) {
  return strncat_s(dest, destMax, src, src == NULL ? 0 : strlen(src));
}

/* -1 (and dest cleared) when the output does not fit */
static inline int vsnprintf_s(char *dest, size_t destMax, size_t count, const char *format, va_list ap) {
  if (dest == NULL || format == NULL || destMax == 0 || destMax > SECUREC_STRING_MAX_LEN) {
    return -1;
  }
  size_t limit = count < destMax ? count + 1 : destMax;
  int n = vsnprintf(dest, limit, format, ap);
  if (n < 0 || (size_t)n >= limit) {
    if (n >= 0 && count < destMax) {
      return -1; /* truncated to count: libboundscheck keeps the prefix */
    }
    dest[0] = '\0';
    return -1;
  }
  return n;
}

static inline int snprintf_s(char *dest, size_t destMax, size_t count, const char *format, ...) {
  va_list ap;
  va_start(ap, format);
  int n = vsnprintf_s(dest, destMax, count, format, ap);
  va_end(ap);
  return n;
}

static inline int vsprintf_s(char *dest, size_t destMax, const char *format, va_list ap) {
  return vsnprintf_s(dest, destMax, destMax - 1, format, ap);
}

static inline int sprintf_s(char *dest, size_t destMax, const char *format, ...) {
  va_list ap;
  va_start(ap, format);
  int n = vsprintf_s(dest, destMax, format, ap);
  va_end(ap);
  return n;
}

#ifdef __cplusplus
}
#endif

#endif /* HIXL_DOUBLE_SECUREC_H */
