# Two-process NIXL READ/WRITE benchmark on loopback (anchor for hixl's benchmark).
# usage: python bench-anchors-nixl.py ROLE OP BLOCK NBLK ITERS PORT   (ROLE target|initiator, OP WRITE|READ)
# Run by tools/bench-anchors.sh (`nixl OP SIZE TLS`). Provenance: `nixl_pair.py` of the anchors
# set up for hixl outside the repository, brought in unchanged but for its name and this comment
# (see the header of bench-anchors.sh).
import sys, time
import numpy as np
try:
    from nixl import nixl_agent, nixl_agent_config
except ImportError:
    from nixl_cu12 import nixl_agent, nixl_agent_config
role, op = sys.argv[1], sys.argv[2]
blk, nblk, iters, port = map(int, sys.argv[3:7])
buf = np.random.randint(0, 255, blk * nblk, dtype=np.uint8)
ag = nixl_agent(role, nixl_agent_config(True, True, port if role == "target" else 0, backends=["UCX"]))
ag.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
descs = ag.get_xfer_descs(np.array([[buf.ctypes.data + i * blk, blk, 0] for i in range(nblk)], dtype=np.uint64), "DRAM")
if role == "target":
    while not ag.check_remote_metadata("initiator"):
        time.sleep(0.001)
    ag.send_notif("initiator", ag.get_serialized_descs(descs))
    while b"done" not in ag.get_new_notifs().get("initiator", []):
        time.sleep(0.001)
else:
    ag.fetch_remote_metadata("target", "127.0.0.1", port)
    ag.send_local_metadata("127.0.0.1", port)
    n = {}
    while "target" not in n:
        n = ag.get_new_notifs()
    remote = ag.deserialize_descs(n["target"][0])
    h = ag.initialize_xfer(op, descs, remote, "target")
    lat = []
    for _ in range(iters):
        t = time.perf_counter()
        s = ag.transfer(h)
        while s == "PROC":
            s = ag.check_xfer_state(h)
        assert s == "DONE", s
        lat.append(time.perf_counter() - t)
    lat.sort()
    print(f"{op} block={blk} batch={nblk} GB/s={blk*nblk*iters/sum(lat)/1e9:.3f} p50_us={lat[len(lat)//2]*1e6:.1f}")
    ag.send_notif("target", b"done")
    ag.release_xfer_handle(h)
    ag.remove_remote_agent("target")
