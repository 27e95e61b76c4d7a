/* A failed C call's message reaches ACL's error channel (aclGetRecentErrMsg) when ACL was
 * loaded only after earlier failures (issue 35: a failed call no longer searches the disk for
 * CANN's libraries each time, but searches again once something was loaded). argv[1]: the ACL
 * test double (libacl_rt.so), loaded with dlopen after three failures. Prints PASS; exits 1
 * naming the failed line otherwise. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "hixl_c.h"

#define CHECK(c)                                                      \
  do {                                                                \
    if (!(c)) {                                                       \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); \
      return 1;                                                       \
    }                                                                 \
  } while (0)

typedef const char *(*recent_fn)(void);

int main(int argc, char **argv) {
  hixl_engine *e = NULL;
  hixl_transfer_op_desc d = {0, 0, 0};
  void *acl;
  recent_fn recent;
  const char *msg;
  char mine[512];
  int i;
  CHECK(argc == 2);
  CHECK(hixl_create(&e) == HIXL_SUCCESS);
  CHECK(hixl_initialize(e, "127.0.0.1", NULL, NULL, 0) == HIXL_SUCCESS);
  /* failures before ACL is in the process: only hixl_last_error_message has them */
  for (i = 0; i < 3; i++) {
    CHECK(hixl_transfer_sync(e, "127.0.0.1:1", HIXL_READ, &d, 0, 100) != HIXL_SUCCESS);
    CHECK(hixl_last_error_message()[0] != '\0');
  }
  CHECK(dlopen("libacl_rt.so", RTLD_NOW | RTLD_NOLOAD) == NULL);
  acl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  CHECK(acl != NULL);
  recent = (recent_fn)dlsym(acl, "aclGetRecentErrMsg");
  CHECK(recent != NULL);
  CHECK(recent() == NULL);
  /* the next failure is found there too, as upstream reports it (E19999) */
  CHECK(hixl_transfer_sync(e, "127.0.0.1:1", HIXL_READ, &d, 0, 100) != HIXL_SUCCESS);
  snprintf(mine, sizeof mine, "%s", hixl_last_error_message());
  CHECK(mine[0] != '\0');
  msg = recent();
  CHECK(msg != NULL);
  CHECK(strncmp(msg, "E19999", 6) == 0);
  CHECK(strstr(msg, mine) != NULL);
  hixl_destroy(e);
  printf("PASS\n");
  return 0;
}
