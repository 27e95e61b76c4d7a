/* A failure's message reaches ACL's error channel even when ACL loads after an earlier failure
 * found no error manager (hixl then skips the search until another library loads; this checks
 * that a load ends the skip). Linked with libhixl only; loads the ACL double's libacl_rt.so with
 * dlopen half way. Prints PASS on success; exits 1 naming the failed line otherwise. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "hixl_c.h"

#define CHECK(c)                                           \
  do {                                                     \
    if (!(c)) {                                            \
      printf("FAILED line %d: %s\n", __LINE__, #c);        \
      return 1;                                            \
    }                                                      \
  } while (0)

int main(void) {
  hixl_engine *e = NULL;
  CHECK(hixl_create(&e) == HIXL_SUCCESS);
  /* fails before initialize; no ACL in the process: nothing to report to, twice */
  CHECK(hixl_connect(e, "127.0.0.1:1", 1000) != HIXL_SUCCESS);
  CHECK(hixl_connect(e, "127.0.0.1:1", 1000) != HIXL_SUCCESS);
  CHECK(dlsym(RTLD_DEFAULT, "aclGetRecentErrMsg") == NULL);

  void *acl = dlopen("libacl_rt.so", RTLD_NOW | RTLD_LOCAL);
  CHECK(acl != NULL);
  const char *(*recent)(void) = (const char *(*)(void))dlsym(acl, "aclGetRecentErrMsg");
  CHECK(recent != NULL);
  CHECK(recent() == NULL);

  /* the same failure with ACL loaded: its message is in ACL's channel too */
  CHECK(hixl_connect(e, "127.0.0.1:1", 1000) != HIXL_SUCCESS);
  const char *msg = recent();
  CHECK(msg != NULL);
  const char *ours = hixl_last_error_message();
  CHECK(ours != NULL && ours[0] != '\0');
  CHECK(strncmp(msg, "E19999", 6) == 0);
  char head[41];
  snprintf(head, sizeof head, "%s", ours);
  CHECK(strstr(msg, head) != NULL);
  CHECK(recent() == NULL);
  hixl_destroy(e);
  printf("PASS\n");
  return 0;
}
