#!/usr/bin/env python3
"""NIXL's HIXL backend between two NIXL agents in two processes, through NIXL's own Python API
(the nixl-cu12 wheel, with libplugin_HIXL.so installed beside its plugins: hixl-nixl/install.sh).

    python hixl-nixl/tests/two_agents.py

This process drives a target and an initiator process (each a NIXL agent whose only backend is
HIXL) over their stdin/stdout, and checks, with random data compared at both ends:
- the wheel lists HIXL beside its own plugins (UCX stays available);
- metadata exchanged (getLocalMD / loadRemoteMD) carries hixl's engine name and regions;
- WRITE and READ of 64 blocks of 16 KiB in permuted order through prep_xfer_dlist / make_prepped_xfer /
  transfer / check_xfer_state, each with a notification the target receives after the data;
- a 100 kB binary notification (NULs included) and notifications both ways;
- a descriptor outside the target's registered memory: NIXL's nixlNotFoundError; a region the
  target deregistered after the initiator linked: the transfer ends ERR (NIXL_ERR_BACKEND), the
  target's bytes untouched; VRAM registered with HIXL: nixlBackendError, the backend saying why;
- a 16 MiB READ (split into two hixl requests) from a stopped target (SIGSTOP, the state seen
  by waitpid) ends ERR at the backend's deadline, and one released while in flight returns at
  once; neither writes its local buffer, checked after the target resumed and served later
  transfers;
- engine memory at the target (hixl_nixl_alloc, exported by the plugin): READ and WRITE of it
  complete while the target is stopped (hixl's same-host path, one-sided), data checked, and
  hixl_nixl_free refused while NIXL has it registered;
- a transfer to a target that was killed: nixlRemoteDisconnectError.
Exits 0 with "ok", or fails with the first difference. No fixed port: the agents' metadata goes
through this process, and hixl engines listen on ephemeral ports.
"""
import hashlib
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from peer import Peer, PeerFailed, commands, hixl_plugin, nixl_api, reply  # noqa: E402

DEADLINE_MS = 1500  # the initiator's backend parameter deadline_ms
BLOCK = 16384
NBLK = 64
KiB = 1024


def sha(buf):
    return hashlib.sha256(bytes(buf)).hexdigest()


# ------------------------------------------------------------------------------- the agents


def child(role):
    import numpy as np

    nixl_agent, nixl_agent_config = nixl_api()
    rng = np.random.default_rng(46 if role == "target" else 64)
    bufs = {}
    regs = {}
    ag = None
    handles = {}
    state = {}

    def addr(name, off=0):
        return bufs[name].ctypes.data + off

    for cmd in commands():
        op = cmd["op"]
        try:
            if op == "init":
                if cmd.get("params") is None:
                    # the way vLLM and SGLang create it: the backend named in the config
                    ag = nixl_agent(role, nixl_agent_config(backends=["HIXL"]))
                else:
                    ag = nixl_agent(role, nixl_agent_config(backends=[]))
                    ag.create_backend("HIXL", cmd["params"])
                reply(md=ag.get_agent_metadata().hex(), plugins=ag.get_plugin_list(),
                      mems=ag.get_backend_mem_types("HIXL"))
            elif op == "md":
                reply(md=ag.get_agent_metadata().hex())
            elif op == "load":
                name = ag.add_remote_agent(bytes.fromhex(cmd["md"]))
                reply(name=name.decode() if isinstance(name, bytes) else name)
            elif op == "alloc":
                for name, size in cmd["bufs"].items():
                    bufs[name] = rng.integers(0, 256, size, dtype=np.uint8)
                    regs[name] = ag.register_memory(
                        [(addr(name), size, 0, "")], "DRAM", backends=["HIXL"])
                reply(addrs={n: addr(n) for n in cmd["bufs"]})
            elif op == "alloc_engine":
                # engine memory (hixl_nixl_alloc): a peer on this host reaches it one-sidedly
                import ctypes
                lib = hixl_plugin()
                p = ctypes.c_void_p()
                st = lib.hixl_nixl_alloc(role.encode(), cmd["len"], ctypes.byref(p))
                if st != 0:
                    reply(failed=f"hixl_nixl_alloc: {st}")
                    continue
                mem = (ctypes.c_uint8 * cmd["len"]).from_address(p.value)
                bufs[cmd["buf"]] = np.ctypeslib.as_array(mem)
                bufs[cmd["buf"]][:] = rng.integers(0, 256, cmd["len"], dtype=np.uint8)
                regs[cmd["buf"]] = ag.register_memory(
                    [(p.value, cmd["len"], 0, "")], "DRAM", backends=["HIXL"])
                reply(addr=p.value, unknown=lib.hixl_nixl_alloc(b"nobody", 4096, ctypes.byref(p)))
            elif op == "free_engine":
                lib = hixl_plugin()
                a = bufs[cmd["buf"]].ctypes.data
                early = lib.hixl_nixl_free(role.encode(), a)  # still registered with NIXL
                ag.deregister_memory(regs.pop(cmd["buf"]), backends=["HIXL"])
                freed = lib.hixl_nixl_free(role.encode(), a)
                del bufs[cmd["buf"]]
                reply(early=early, freed=freed)
            elif op == "sha":
                b = bufs[cmd["buf"]]
                reply(sha=sha(b[cmd["off"]:cmd["off"] + cmd["len"]]))
            elif op == "shas":
                # the blocks (off, len) of a buffer, in the order given, as one digest
                b = bufs[cmd["buf"]]
                h = hashlib.sha256()
                for off, n in cmd["blocks"]:
                    h.update(bytes(b[off:off + n]))
                reply(sha=h.hexdigest())
            elif op == "dereg":
                ag.deregister_memory(regs.pop(cmd["buf"]), backends=["HIXL"])
                reply()
            elif op == "vram":
                # an unsupported memory kind, refused at registration with NIXL's error
                try:
                    ag.register_memory([(addr("B"), 4096, 0, "")], "VRAM", backends=["HIXL"])
                    reply(error=None)
                except Exception as e:  # the exception's class is NIXL's status
                    reply(error=type(e).__name__)
            elif op == "prep":
                # a handle over blocks: local (off, len) of buffer `buf`, remote addresses
                local = [(addr(cmd["buf"], off), n, 0) for off, n in cmd["local"]]
                remote = [(a, n, 0) for a, n in cmd["remote"]]
                lh = ag.prep_xfer_dlist("", local, "DRAM")
                rh = ag.prep_xfer_dlist(cmd["peer"], remote, "DRAM")
                idx = list(range(len(local)))
                h = ag.make_prepped_xfer(cmd["xop"], lh, idx, rh, idx,
                                         cmd.get("notif", "").encode())
                handles[cmd["id"]] = (h, lh, rh)
                reply()
            elif op == "initialize_xfer":
                local = [(addr(cmd["buf"], off), n, 0) for off, n in cmd["local"]]
                remote = [(a, n, 0) for a, n in cmd["remote"]]
                try:
                    h = ag.initialize_xfer(cmd["xop"], ag.get_xfer_descs(local, "DRAM"),
                                           ag.get_xfer_descs(remote, "DRAM"), cmd["peer"])
                    handles[cmd["id"]] = (h, None, None)
                    reply(error=None)
                except Exception as e:
                    reply(error=type(e).__name__)
            elif op == "post":
                h = handles[cmd["id"]][0]
                t0 = time.monotonic()
                try:
                    s = ag.transfer(h)
                except Exception as e:
                    s = "ERR:" + type(e).__name__
                state[cmd["id"]] = (t0, s)
                reply(state=state[cmd["id"]][1])
            elif op == "wait":
                # polls check_xfer_state until the handle is no longer in progress; an error
                # status comes as the binding's exception for it (nixlBackendError, ...)
                h = handles[cmd["id"]][0]
                t0, s = state[cmd["id"]]
                code = "NIXL_SUCCESS"
                until = time.monotonic() + 120
                try:
                    while s == "PROC" and time.monotonic() < until:
                        s = ag.check_xfer_state(h)
                except Exception as e:
                    s, code = "ERR", type(e).__name__
                reply(state=s, took=time.monotonic() - t0, code=code)
            elif op == "release":
                t0 = time.monotonic()
                h, lh, rh = handles.pop(cmd["id"])
                ag.release_xfer_handle(h)
                for d in (lh, rh):
                    if d is not None:
                        ag.release_dlist_handle(d)
                reply(took=time.monotonic() - t0)
            elif op == "notif":
                blob = rng.integers(0, 256, cmd["len"], dtype=np.uint8).tobytes()
                if cmd["len"] > 0:
                    blob = b"\0" + blob[1:]
                ag.send_notif(cmd["peer"], blob)
                reply(sha=sha(blob))
            elif op == "take_notif":
                # waits for `count` notifications from `peer`
                got = []
                until = time.monotonic() + 60
                while len(got) < cmd["count"] and time.monotonic() < until:
                    got += ag.get_new_notifs().get(cmd["peer"], [])
                reply(shas=[sha(m) for m in got], msgs=[m[:40].hex() for m in got])
            elif op == "bye":
                for h, lh, rh in handles.values():
                    ag.release_xfer_handle(h)
                for name in list(regs):
                    ag.deregister_memory(regs.pop(name), backends=["HIXL"])
                reply()
                break
            else:
                reply(failed=f"unknown op {op}")
        except Exception as e:
            reply(failed=f"{type(e).__name__}: {e}")
            raise


# ------------------------------------------------------------------------------- the checks


def agent(role):
    return Peer(__file__, [role], role)


def check(cond, why):
    if not cond:
        raise SystemExit("FAILED: " + why)


def stop(agent):
    """SIGSTOP, then wait until the kernel reports the process stopped."""
    os.kill(agent.p.pid, signal.SIGSTOP)
    _, status = os.waitpid(agent.p.pid, os.WUNTRACED)
    check(os.WIFSTOPPED(status), "the target did not stop")


def resume(agent):
    os.kill(agent.p.pid, signal.SIGCONT)


def main():
    t = agent("target")
    i = agent("initiator")
    try:
        run(t, i)
    except PeerFailed as e:
        raise SystemExit(f"FAILED: {e}")
    finally:
        for a in (t, i):
            a.close()


def run(t, i):
    rt = t("init", params=None)
    ri = i("init", params={"deadline_ms": str(DEADLINE_MS), "ip": "127.0.0.1"})
    check("HIXL" in rt["plugins"] and "UCX" in rt["plugins"],
          f"plugins {rt['plugins']}: HIXL installed beside the wheel's, UCX kept")
    check(rt["mems"] == ["DRAM_SEG"], f"HIXL's memory types {rt['mems']}")
    check(b"hixl/1 " in bytes.fromhex(rt["md"]), "the metadata carries hixl's engine name")
    check(i("load", md=rt["md"])["name"] == "target", "loaded the target's metadata")
    check(t("load", md=ri["md"])["name"] == "initiator", "loaded the initiator's metadata")

    # memory: the target serves A (32 MiB) and C (1 MiB, deregistered later); registered
    # before the metadata goes out again so the initiator knows both
    A = 32 << 20
    ta = t("alloc", bufs={"A": A, "C": 1 << 20})["addrs"]
    ia = i("alloc", bufs={"B": A})["addrs"]
    # the metadata again, now with the regions (getLocalMD: hixl's public data per region)
    check(i("load", md=t("md")["md"])["name"] == "target", "reloaded the target's metadata")
    check(t("load", md=i("md")["md"])["name"] == "initiator", "reloaded the initiator's metadata")

    # WRITE: initiator blocks i -> target blocks perm[i], with a notification after the data
    perm = list(range(NBLK))
    import random
    random.Random(46).shuffle(perm)
    local = [(k * BLOCK, BLOCK) for k in range(NBLK)]
    remote = [(ta["A"] + perm[k] * BLOCK, BLOCK) for k in range(NBLK)]
    i("prep", id="w", xop="WRITE", buf="B", local=local, remote=remote, peer="target",
      notif="write-done")
    r = i("post", id="w")
    check(r["state"] in ("PROC", "DONE"), f"WRITE posted: {r}")
    r = i("wait", id="w")
    check(r["state"] == "DONE" and r["code"] == "NIXL_SUCCESS", f"WRITE: {r}")
    n = t("take_notif", peer="initiator", count=1)
    check(n["msgs"] == [b"write-done".hex()], f"the WRITE's notification: {n}")
    sent = i("shas", buf="B", blocks=local)["sha"]
    landed = t("shas", buf="A", blocks=[(perm[k] * BLOCK, BLOCK) for k in range(NBLK)])["sha"]
    check(sent == landed, "WRITE: the target's blocks differ from the initiator's")

    # READ: target blocks perm[k] -> initiator blocks at 2 MiB + k, reposted twice
    base = 2 << 20
    rlocal = [(base + k * BLOCK, BLOCK) for k in range(NBLK)]
    rremote = [(ta["A"] + (A // 2) + perm[k] * BLOCK, BLOCK) for k in range(NBLK)]
    i("prep", id="r", xop="READ", buf="B", local=rlocal, remote=rremote, peer="target",
      notif="read-done")
    for _ in range(2):
        i("post", id="r")
        r = i("wait", id="r")
        check(r["state"] == "DONE" and r["code"] == "NIXL_SUCCESS", f"READ: {r}")
        n = t("take_notif", peer="initiator", count=1)
        check(n["msgs"] == [b"read-done".hex()], f"the READ's notification: {n}")
    got = i("shas", buf="B", blocks=rlocal)["sha"]
    src = t("shas", buf="A", blocks=[(A // 2 + perm[k] * BLOCK, BLOCK) for k in range(NBLK)])["sha"]
    check(got == src, "READ: the initiator's blocks differ from the target's")

    # notifications both ways, one of 100 kB with NULs (sent in parts)
    s1 = t("notif", peer="initiator", len=100_000)["sha"]
    s2 = t("notif", peer="initiator", len=0)["sha"]
    n = i("take_notif", peer="target", count=2)
    check(n["shas"] == [s1, s2], f"the target's notifications: {n}")
    s3 = i("notif", peer="target", len=5000)["sha"]
    check(t("take_notif", peer="initiator", count=1)["shas"] == [s3], "a notification back")

    # a descriptor outside the target's registered memory: refused by NIXL before the backend
    r = i("initialize_xfer", id="bad", xop="WRITE", buf="B", local=[(0, 4096)],
          remote=[(ta["A"] + A - 2048, 4096)], peer="target")
    check(r["error"] == "nixlNotFoundError", f"a descriptor outside the peer's memory: {r}")
    # VRAM with the HIXL backend: refused at registration, the backend saying why
    r = i("vram")
    check(r["error"] == "nixlBackendError", f"VRAM registration: {r}")

    # a region the target no longer serves: the initiator's link still lists it, the target's
    # serving side refuses, and nothing is written there
    i("prep", id="c", xop="WRITE", buf="B", local=[(0, 65536)], remote=[(ta["C"], 65536)],
      peer="target")
    before = t("sha", buf="C", off=0, len=1 << 20)["sha"]
    t("dereg", buf="C")
    i("post", id="c")
    r = i("wait", id="c")
    check(r["state"] == "ERR" and r["code"] == "nixlBackendError", f"a WRITE to a deregistered region: {r}")
    check(t("sha", buf="C", off=0, len=1 << 20)["sha"] == before,
          "a refused WRITE changed the target's deregistered memory")
    i("release", id="c")

    # the deadline: a READ from a stopped target ends ERR at deadline_ms and writes nothing
    # (16 MiB: the backend splits it into two hixl requests, both of which must end)
    D = 16 << 20
    dl = [(8 << 20, D)]
    dr = [(ta["A"], D)]
    i("prep", id="d", xop="READ", buf="B", local=dl, remote=dr, peer="target")
    untouched = i("sha", buf="B", off=8 << 20, len=D)["sha"]
    stop(t)
    i("post", id="d")
    r = i("wait", id="d")
    check(r["state"] == "ERR" and r["code"] == "nixlBackendError", f"a READ past its deadline: {r}")
    check(DEADLINE_MS / 1000 * 0.95 <= r["took"] < DEADLINE_MS / 1000 + 20,
          f"it ended after {r['took']:.3f} s, the deadline is {DEADLINE_MS} ms")
    # released while in flight: returns once the transfer stopped, well before the deadline
    i("prep", id="x", xop="READ", buf="B", local=dl, remote=dr, peer="target")
    i("post", id="x")
    r = i("release", id="x")
    check(r["took"] < DEADLINE_MS / 1000, f"releasing an in-flight READ took {r['took']:.3f} s")
    resume(t)
    # the target serves again (its late answers to the two READs go nowhere): a READ and a
    # WRITE complete, and the two READs' destination is as it was
    i("post", id="r")
    check(i("wait", id="r")["state"] == "DONE", "a READ after the target resumed")
    t("take_notif", peer="initiator", count=1)
    i("post", id="w")
    check(i("wait", id="w")["state"] == "DONE", "a WRITE after the target resumed")
    t("take_notif", peer="initiator", count=1)
    check(i("sha", buf="B", off=8 << 20, len=D)["sha"] == untouched,
          "a READ that ended ERR (deadline, or released) wrote its local buffer afterwards")
    i("release", id="d")

    # engine memory (hixl_nixl_alloc) at the target: a new region, so the initiator's link is
    # made again with the target's new table; then READ and WRITE complete while the target is
    # stopped: hixl's same-host path, one-sided (over TCP they would wait for the target)
    E = 8 << 20
    r = t("alloc_engine", buf="E", len=E)
    check(r["unknown"] == -4, f"hixl_nixl_alloc for an agent without HIXL: {r['unknown']}")
    ea = r["addr"]
    check(i("load", md=t("md")["md"])["name"] == "target", "the target's metadata with E")
    el = [(24 << 20, E)]
    i("prep", id="er", xop="READ", buf="B", local=el, remote=[(ea, E)], peer="target")
    i("prep", id="ew", xop="WRITE", buf="B", local=[(0, 1 << 20)], remote=[(ea + (1 << 20), 1 << 20)],
      peer="target")
    stop(t)
    i("post", id="er")
    r = i("wait", id="er")
    check(r["state"] == "DONE", f"a READ of engine memory while the target is stopped: {r}")
    i("post", id="ew")
    r = i("wait", id="ew")
    check(r["state"] == "DONE", f"a WRITE into engine memory while the target is stopped: {r}")
    resume(t)
    # (the WRITE, after the READ, changed E's second MiB: the READ's copy of it is older)
    for off, n in ((0, 1 << 20), (2 << 20, E - (2 << 20))):
        check(i("sha", buf="B", off=(24 << 20) + off, len=n)["sha"]
              == t("sha", buf="E", off=off, len=n)["sha"],
              "READ of engine memory: the initiator's bytes differ from the target's")
    check(i("sha", buf="B", off=0, len=1 << 20)["sha"]
          == t("sha", buf="E", off=1 << 20, len=1 << 20)["sha"],
          "WRITE into engine memory: the target's bytes differ from the initiator's")
    i("release", id="er")
    i("release", id="ew")
    r = t("free_engine", buf="E")
    check((r["early"], r["freed"]) == (-6, 0),
          f"hixl_nixl_free while registered, then after: {r}")

    # a peer that died: the next transfer to it ends NIXL_ERR_REMOTE_DISCONNECT, at the post
    # or at its check (whichever finds the link broken first)
    t.p.kill()
    t.p.wait()
    r = i("post", id="r")
    if r["state"] == "PROC":
        r = i("wait", id="r")
        dead = r["code"]
    else:
        dead = r["state"].removeprefix("ERR:")
    check(dead == "nixlRemoteDisconnectError", f"a transfer to a peer that died: {r}")
    i.close()
    err = i.stderr()
    check("VRAM_SEG memory is not supported by the HIXL backend" in err,
          "the backend says why VRAM is refused")
    check("passed its deadline" in err, "the backend says a transfer passed its deadline")
    print("ok")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
