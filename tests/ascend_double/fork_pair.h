/*
 * Two processes for the double's C test programs (cann_program.c, remote_ranges.c,
 * acl_extra.c): fork_pair(child, parent, child_ok) forks; the child runs child(in, out) and
 * prints child_ok, this process runs parent(in, out); each side's `in` reads what the other's
 * `out` writes. A side that dies closes its ends, so the other's read returns 0 and never
 * blocks. Returns when the child has exited with status 0 (else exits 1), printing "OK".
 */
#ifndef HIXL_TEST_FORK_PAIR_H
#define HIXL_TEST_FORK_PAIR_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void fork_pair(void (*child)(int in, int out), void (*parent)(int in, int out), const char *child_ok) {
    int to_child[2], to_parent[2], status = 0;
    pid_t pid;
    if (pipe(to_child) != 0 || pipe(to_parent) != 0) {
        printf("FAIL: pipe\n");
        exit(1);
    }
    fflush(stdout);
    pid = fork();
    if (pid < 0) {
        printf("FAIL: fork\n");
        exit(1);
    }
    if (pid == 0) {
        close(to_child[1]);
        close(to_parent[0]);
        child(to_child[0], to_parent[1]);
        printf("%s\n", child_ok);
        exit(0);
    }
    close(to_child[0]);
    close(to_parent[1]);
    parent(to_parent[0], to_child[1]);
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("FAIL: the child did not succeed\n");
        exit(1);
    }
    printf("OK\n");
}

#endif
