/* The conformance table's HIXL-CS cases through its C ABI (include/cs/hixl_cs.h), for
 * conformance.c (hixl_cs.h and hixl_c.h do not go in one file). One line a case:
 *
 *   cs STATE server_create DESC CONFIG OUT PORT IP ENDPOINTS CONFIG_JSON
 *   cs STATE server_listen | server_destroy
 *   cs STATE server_reg_mem SERVER MEM OUT LEN TYPE OFFSET
 *   cs STATE server_unreg_mem unknown|twice
 *   cs STATE client_create DESC PORT
 *   cs STATE client_connect | client_get
 *
 * DESC, CONFIG, OUT, MEM: 1 a valid pointer, 0 null; IP: `null` for a null pointer, else
 * %-escaped; ENDPOINTS: a count, or `null` for a null list; CONFIG_JSON: `~` for none; SERVER:
 * ok|unknown. States: fresh, server (created on port 0 with one 8192-byte host buffer, its
 * first 4096 bytes registered), destroyed (server, then destroyed). */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cs/hixl_cs.h"

enum { BUF = 8192 };

/* conformance.c's: %XX escapes decoded in place, `~` the empty string */
char *unescape(char *s);

/* a string argument: `~` for none (a null pointer), else %-escaped */
static const char *text(char *s) { return strcmp(s, "~") == 0 ? NULL : unescape(s); }

static EndpointDesc endpoint(void) {
  EndpointDesc e;
  (void)EndpointDescInit(&e, 1);
  e.protocol = COMM_PROTOCOL_ROCE;
  e.commAddr.type = COMM_ADDR_TYPE_IP_V4;
  (void)inet_pton(AF_INET, "127.0.0.1", &e.commAddr.addr);
  e.loc.locType = ENDPOINT_LOC_TYPE_HOST;
  e.loc.host.id = 0;
  return e;
}

/* a server on port 0 (nothing to listen on) with buf[0..4096) registered under "t" */
static HixlStatus server(EndpointDesc *ep, unsigned char *buf, HixlServerHandle *s, MemHandle *h) {
  HixlServerDesc d;
  memset(&d, 0, sizeof d);
  d.endpoint_list = ep;
  d.endpoint_list_num = 1;
  d.server_ip = "127.0.0.1";
  HixlServerConfig c;
  memset(&c, 0, sizeof c);
  HixlStatus st = HixlCSServerCreate(&d, &c, s);
  if (st != HIXL_SUCCESS) return st;
  CommMem m = {COMM_MEM_TYPE_HOST, buf, 4096};
  return HixlCSServerRegMem(*s, "t", &m, h);
}

unsigned cs_case(char **tok, int n) {
  (void)n;
  static unsigned char buf[BUF];
  const char *state = tok[1], *call = tok[2];
  EndpointDesc ep = endpoint();
  HixlServerHandle s = NULL;
  MemHandle h = NULL;
  if (strcmp(state, "fresh") != 0 && server(&ep, buf, &s, &h) != HIXL_SUCCESS) return 1;
  if (strcmp(state, "destroyed") == 0 && HixlCSServerDestroy(s) != HIXL_SUCCESS) return 1;
  HixlStatus st = 1;
  if (strcmp(call, "server_create") == 0) {
    HixlServerDesc d;
    memset(&d, 0, sizeof d);
    d.server_port = (uint32_t)strtoul(tok[6], NULL, 10);
    d.server_ip = strcmp(tok[7], "null") == 0 ? NULL : unescape(tok[7]);
    d.endpoint_list = strcmp(tok[8], "null") == 0 ? NULL : &ep;
    d.endpoint_list_num = strcmp(tok[8], "null") == 0 ? 1 : (uint32_t)strtoul(tok[8], NULL, 10);
    HixlServerConfig c;
    memset(&c, 0, sizeof c);
    c.global_resource_config = text(tok[9]);
    HixlServerHandle made = NULL;
    st = HixlCSServerCreate(tok[3][0] == '1' ? &d : NULL, tok[4][0] == '1' ? &c : NULL,
                            tok[5][0] == '1' ? &made : NULL);
    if (made != NULL) (void)HixlCSServerDestroy(made);
  } else if (strcmp(call, "server_listen") == 0) {
    st = HixlCSServerListen(s, 1);
  } else if (strcmp(call, "server_destroy") == 0) {
    st = HixlCSServerDestroy(s);
    if (st == HIXL_SUCCESS) s = NULL;
  } else if (strcmp(call, "server_reg_mem") == 0) {
    HixlServerHandle target = strcmp(tok[3], "unknown") == 0 ? (HixlServerHandle)0x42 : s;
    CommMem m = {(CommMemType)strtol(tok[7], NULL, 10), buf + strtoul(tok[8], NULL, 10),
                 strtoull(tok[6], NULL, 10)};
    MemHandle out = NULL;
    st = HixlCSServerRegMem(target, "u", tok[4][0] == '1' ? &m : NULL, tok[5][0] == '1' ? &out : NULL);
  } else if (strcmp(call, "server_unreg_mem") == 0) {
    if (strcmp(tok[3], "twice") == 0) {
      if (HixlCSServerUnregMem(s, h) != HIXL_SUCCESS) st = 1;
      else st = HixlCSServerUnregMem(s, h);
    } else {
      st = HixlCSServerUnregMem(s, (MemHandle)0x42);
    }
  } else if (strcmp(call, "client_create") == 0) {
    HixlClientDesc d;
    memset(&d, 0, sizeof d);
    d.local_endpoint = &ep;
    d.remote_endpoint = &ep;
    d.server_ip = "127.0.0.1";
    d.server_port = (uint32_t)strtoul(tok[4], NULL, 10);
    HixlClientConfig c;
    memset(&c, 0, sizeof c);
    HixlClientHandle made = NULL;
    st = HixlCSClientCreate(tok[3][0] == '1' ? &d : NULL, &c, &made);
    if (made != NULL) (void)HixlCSClientDestroy(made);
  } else if (strcmp(call, "client_connect") == 0) {
    st = HixlCSClientConnect((HixlClientHandle)0x42, 1000);
  } else if (strcmp(call, "client_get") == 0) {
    HixlOneSideOpDesc op = {buf, buf + 4096, 16};
    st = HixlCSClientBatchGetSync((HixlClientHandle)0x42, 1, &op, 1000);
  }
  if (s != NULL && strcmp(state, "destroyed") != 0) (void)HixlCSServerDestroy(s);
  return st;
}
