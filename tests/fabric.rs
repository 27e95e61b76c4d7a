//! Fabric memory (`EnableUseFabricMem=1`) end to end on the ACL test double: VMM memory from
//! the allocator statics (`hixl::fabric::malloc_mem`), two engines whose share handles are
//! exchanged at connect, random data written and read back (sync and async) through the
//! peer's imported mapping, and the bad inputs: an address outside every mapping, deregistering
//! while connected (refused to the side that made the link; the serving side's succeeds and
//! the peer no longer reaches the memory), the many-request status query, non-VMM memory, the
//! AICPU path.
//!
//! The statics load ACL as HIXL's do (`$HIXL_ACL_LIB`, then CANN's names), so the scenario runs
//! in a child process of this test binary with `HIXL_ACL_LIB` naming a private copy of the
//! double; the parent builds the double and checks the child's verdict. Without a system C
//! compiler the test prints why and passes without running.

use std::process::Command;

use hixl::compat::{
    GetTransferStatusArgs, Hixl, MemDesc, TransferArgs, TransferOpDesc, TransferStatus,
};
use hixl::testkit::{Rng, fnv1a};
use hixl::{MemType, Status, TransferOp, TransportKind};

const CHILD: &str = "HIXL_FABRIC_TEST_CHILD";
const MIB: usize = 1 << 20;

#[test]
fn fabric_mem_engines_move_random_data() {
    in_child(
        "fabric_mem_engines_move_random_data",
        CHILD,
        scenario,
        "FABRIC SCENARIO OK",
        "hixl-fabric-it",
    );
}

/// Runs `scenario` in a child process of this test binary (test `test`, marked by the
/// environment variable `child`) on the ACL test double, built under a temporary directory
/// named after `tag`; in the child, runs it and prints `ok`. Skips without a C compiler.
fn in_child(test: &str, child: &str, scenario: fn(), ok: &str, tag: &str) {
    if std::env::var_os(child).is_some() {
        scenario();
        println!("{ok}");
        return;
    }
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no system C compiler (`cc`) to build the ACL test double");
        return;
    }
    let base = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    let lib = hixl::testkit::build_ascend_double(&base).expect("build the test double");
    let dir = base.join("announce");
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(child, "1")
        .env("HIXL_ACL_LIB", &lib)
        .env("HIXL_ASCEND_DOUBLE_DIR", &dir)
        .output()
        .expect("run the scenario");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(ok),
        "scenario failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // the scenario's summary lines (its rates), for `--nocapture`
    for l in stderr.lines().filter(|l| l.starts_with("fabric ")) {
        eprintln!("{l}");
    }
    let _ = std::fs::remove_dir_all(&base);
}

fn fabric_engine(name: &str) -> Hixl {
    let e = Hixl::new();
    e.initialize(name, [("EnableUseFabricMem", "1")])
        .expect("initialize with EnableUseFabricMem=1");
    e
}

/// Copies `data` into VMM memory at `addr` (the double's device memory is host memory mapped
/// into this process; on hardware this would be `aclrtMemcpy`).
fn fill(addr: usize, data: &[u8]) {
    // SAFETY: `addr` is a live malloc_mem allocation of at least `data.len()` bytes, and no
    // transfer touches it meanwhile.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) }
}

fn bytes(addr: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: as in `fill`.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), len) }
    v
}

fn scenario() {
    // options: HIXL's accepted set, the buffer-pool rule and the AICPU path
    let e = Hixl::new();
    let err = e
        .initialize(
            "127.0.0.1:0",
            [("EnableUseFabricMem", "1"), ("BufferPool", "4:8")],
        )
        .unwrap_err();
    assert_eq!(err.status(), Status::PARAM_INVALID, "{err:?}");
    let e = Hixl::new();
    let err = e
        .initialize(
            "127.0.0.1:0",
            [
                ("EnableUseFabricMem", "1"),
                (
                    "GlobalResourceConfig",
                    r#"{"fabric_memory.enable_aicpu_unfold":"true"}"#,
                ),
            ],
        )
        .unwrap_err();
    assert!(
        [Status::UNSUPPORTED, Status::PARAM_INVALID].contains(&err.status()),
        "{err:?}"
    );

    let server = fabric_engine("127.0.0.1:0");
    let client = fabric_engine("127.0.0.1");
    let server_name = server.local_engine().unwrap();
    let mut rng = Rng::new(0xFAB);

    // memory from the allocator statics: device memory on the server, host and device on the
    // client
    let s_mem = hixl::fabric::malloc_mem(MemType::Device, 4 * MIB).expect("MallocMem");
    let c_dev = hixl::fabric::malloc_mem(MemType::Device, 3 * MIB).expect("MallocMem");
    let c_host = hixl::fabric::malloc_mem(MemType::Host, MIB).expect("MallocMem(host)");
    assert_eq!(s_mem % (2 * MIB), 0);
    let h1 = hixl::fabric::export_to_shareable_handle(s_mem).unwrap();
    assert_eq!(
        hixl::fabric::export_to_shareable_handle(s_mem).unwrap(),
        h1,
        "cached"
    );
    let err = hixl::fabric::export_to_shareable_handle(s_mem + 4096).unwrap_err();
    assert_eq!(err.status(), Status::PARAM_INVALID);
    let seeded = rng.bytes(4 * MIB);
    fill(s_mem, &seeded);

    // SAFETY: every range is a live malloc_mem allocation, freed after deregistration.
    let (s_h, c_h, c_hh) = unsafe {
        (
            server
                .register_mem(
                    MemDesc {
                        addr: s_mem,
                        len: 4 * MIB,
                        local_only: false,
                    },
                    MemType::Device,
                )
                .expect("register the server's VMM memory"),
            client
                .register_mem(
                    MemDesc {
                        addr: c_dev,
                        len: 3 * MIB,
                        local_only: false,
                    },
                    MemType::Device,
                )
                .expect("register the client's VMM memory"),
            client
                .register_mem(
                    MemDesc {
                        addr: c_host,
                        len: MIB,
                        local_only: false,
                    },
                    MemType::Host,
                )
                .expect("register VMM host memory"),
        )
    };
    // memory that is not VMM memory is refused by a fabric-memory engine
    let mut plain = vec![0u8; 4096];
    // SAFETY: `plain` outlives the (refused) registration.
    let err = unsafe {
        client.register_mem(
            MemDesc {
                addr: plain.as_mut_ptr() as usize,
                len: plain.len(),
                local_only: false,
            },
            MemType::Host,
        )
    }
    .unwrap_err();
    assert_eq!(err.status(), Status::UNSUPPORTED, "{err:?}");

    // an engine that is not a fabric-memory one refuses a fabric client: UNSUPPORTED
    let plain = Hixl::new();
    plain
        .initialize("127.0.0.1:0", [("hixl.ascend.enable", "0")])
        .unwrap();
    let err = client
        .connect(&plain.local_engine().unwrap(), 10_000)
        .unwrap_err();
    assert_eq!(err.status(), Status::UNSUPPORTED, "{err:?}");
    plain.finalize();

    client.connect(&server_name, 10_000).expect("connect");
    assert_eq!(
        client.transport(&server_name).unwrap(),
        TransportKind::Ascend
    );

    // sync WRITE: random data from the client's device memory into the server's second MiB
    let data = rng.bytes(MIB + 4096);
    fill(c_dev, &data);
    let w = TransferOpDesc {
        local_addr: c_dev,
        remote_addr: s_mem + MIB,
        len: MIB + 4096,
    };
    client
        .transfer_sync(&server_name, TransferOp::Write, &[w], 10_000)
        .expect("WRITE");
    assert_eq!(fnv1a(&bytes(s_mem + MIB, MIB + 4096)), fnv1a(&data));
    // the rest of the server's memory untouched
    assert_eq!(bytes(s_mem, MIB), seeded[..MIB]);
    assert_eq!(
        bytes(s_mem + 2 * MIB + 4096, MIB),
        seeded[2 * MIB + 4096..3 * MIB + 4096]
    );

    // sync READ of several descriptors into device and host memory
    let descs = [
        TransferOpDesc {
            local_addr: c_dev + 2 * MIB,
            remote_addr: s_mem + 3 * MIB,
            len: 65_536,
        },
        TransferOpDesc {
            local_addr: c_host + 100,
            remote_addr: s_mem + 7,
            len: 300_000,
        },
    ];
    client
        .transfer_sync(&server_name, TransferOp::Read, &descs, 10_000)
        .expect("READ");
    assert_eq!(
        bytes(c_dev + 2 * MIB, 65_536),
        seeded[3 * MIB..3 * MIB + 65_536]
    );
    assert_eq!(bytes(c_host + 100, 300_000), seeded[7..300_007]);

    // async WRITE, then async READ back
    let data2 = rng.bytes(MIB / 2);
    fill(c_host, &data2);
    let st = run_async(
        &client,
        &server_name,
        TransferOp::Write,
        &[TransferOpDesc {
            local_addr: c_host,
            remote_addr: s_mem + 3 * MIB,
            len: MIB / 2,
        }],
    );
    assert_eq!(st, TransferStatus::Completed);
    assert_eq!(fnv1a(&bytes(s_mem + 3 * MIB, MIB / 2)), fnv1a(&data2));
    fill(c_dev, &vec![0u8; MIB / 2]);
    let st = run_async(
        &client,
        &server_name,
        TransferOp::Read,
        &[TransferOpDesc {
            local_addr: c_dev,
            remote_addr: s_mem + 3 * MIB,
            len: MIB / 2,
        }],
    );
    assert_eq!(st, TransferStatus::Completed);
    assert_eq!(fnv1a(&bytes(c_dev, MIB / 2)), fnv1a(&data2));

    // bad inputs: an address outside every mapping, the many-request status query,
    // deregistering while connected (both sides)
    let before = bytes(s_mem, 4 * MIB);
    for remote in [
        s_mem + 4 * MIB,
        s_mem + 4 * MIB - 10,
        s_mem.wrapping_sub(4096),
    ] {
        let d = TransferOpDesc {
            local_addr: c_dev,
            remote_addr: remote,
            len: 100,
        };
        let err = client
            .transfer_sync(&server_name, TransferOp::Write, &[d], 10_000)
            .unwrap_err();
        assert_eq!(err.status(), Status::PARAM_INVALID, "{remote:#x}: {err:?}");
    }
    assert_eq!(bytes(s_mem, 4 * MIB), before, "memory untouched");
    let err = client
        .get_transfer_statuses(GetTransferStatusArgs::default())
        .unwrap_err();
    assert_eq!(err.status(), Status::UNSUPPORTED);
    // the client holds a link it made (imports of the server's memory): upstream's FAILED
    let err = client.deregister_mem(c_hh).unwrap_err();
    assert_eq!(err.status(), Status::FAILED, "{err:?}");
    // the server only serves the link: its deregistration succeeds, as upstream's does, and
    // the region is retired: the client's import no longer reaches the memory handed back
    server
        .deregister_mem(s_h)
        .expect("the server's, while it only serves the link");
    let handed_back = bytes(s_mem, 4 * MIB);
    assert_eq!(handed_back, before, "retired with its bytes");
    let late = TransferOpDesc {
        local_addr: c_dev,
        remote_addr: s_mem,
        len: MIB / 2,
    };
    // (the client's table still lists the region; its copy goes to what it imported)
    let _ = client.transfer_sync(&server_name, TransferOp::Write, &[late], 10_000);
    assert_eq!(
        fnv1a(&bytes(s_mem, 4 * MIB)),
        fnv1a(&handed_back),
        "a peer wrote memory its owner deregistered"
    );

    // disconnected: the client's deregistration succeeds, and the memory is freed
    client.disconnect(&server_name, 10_000).expect("disconnect");
    client
        .deregister_mem(c_h)
        .expect("deregister after disconnect");
    client
        .deregister_mem(c_hh)
        .expect("deregister after disconnect");
    client.finalize();
    server.finalize();
    for a in [s_mem, c_dev, c_host] {
        hixl::fabric::free_mem(a).expect("FreeMem");
    }
    let err = hixl::fabric::free_mem(s_mem).unwrap_err();
    assert_eq!(err.status(), Status::PARAM_INVALID);
}

/// The typed API: `Options::fabric_mem` and its memory kind, `FabricBuffer`, allocated with
/// the engine's own ACL (no `$HIXL_ACL_LIB` needed), registered, moved sync and async, and
/// refused on an engine that is not a fabric-memory one.
#[test]
fn typed_fabric_engines_move_random_data() {
    use hixl::fabric::FabricConfig;
    use hixl::{Hixl, Options, TransferArgs as TArgs, TransferDesc, TransferStatus as TStatus};
    use std::time::Duration;
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no system C compiler (`cc`) to build the ACL test double");
        return;
    }
    let base = std::env::temp_dir().join(format!("hixl-fabric-typed-{}", std::process::id()));
    let lib = hixl::testkit::build_ascend_double(&base).expect("build the test double");
    // a private copy: its own globals
    let so = base.join("typed.so");
    std::fs::copy(&lib, &so).unwrap();
    let opts = || {
        Options::default().fabric_mem(FabricConfig {
            acl_lib: Some(so.clone()),
            device_id: Some(0),
            task_streams: 3,
        })
    };
    let t = Duration::from_secs(10);
    let mut rng = Rng::new(0x7FAB);
    let seeded = rng.bytes(2 * MIB);

    let server = Hixl::initialize_ephemeral("127.0.0.1", opts())
        .unwrap()
        .into_registered();
    let sreg = server
        .with_context(|ctx| {
            let mut b = server.alloc_fabric(ctx, MemType::Device, 2 * MIB).unwrap();
            b.write(ctx, 0, &seeded).unwrap();
            server.register_device(ctx, b).unwrap()
        })
        .unwrap();
    let saddr = sreg.addr() as u64;
    let client = Hixl::initialize("127.0.0.1", opts())
        .unwrap()
        .into_registered();
    let mut creg = client
        .with_context(|ctx| {
            let b = client.alloc_fabric(ctx, MemType::Host, MIB).unwrap();
            assert_eq!(b.mem_type(), MemType::Host);
            client.register_device(ctx, b).unwrap()
        })
        .unwrap();
    let server = server.activate().unwrap();
    let client = client.activate().unwrap();
    let link = client.connect(server.name()).unwrap();
    assert_eq!(link.transport(), TransportKind::Ascend);

    // READ 7 descriptors of the server's seeded memory (spread over the 3 streams)
    let descs: Vec<TransferDesc<'_>> = (0..7u64)
        .map(|i| {
            TransferDesc::new(
                creg.range((i as usize) * 100_000..(i as usize) * 100_000 + 90_000)
                    .unwrap(),
                link.remote(saddr + 1000 + i * 200_000, 90_000).unwrap(),
            )
        })
        .collect();
    link.transfer_sync(TransferOp::Read, &descs, t).unwrap();
    drop(descs);
    let mut got = vec![0u8; MIB];
    client
        .with_context(|ctx| creg.read_device(ctx, 0, &mut got))
        .unwrap()
        .unwrap();
    for i in 0..7usize {
        let off = 1000 + i * 200_000;
        assert_eq!(
            got[i * 100_000..i * 100_000 + 90_000],
            seeded[off..off + 90_000],
            "desc {i}"
        );
    }

    // async WRITE of random data, checked on the server through its region
    let data = rng.bytes(MIB);
    client
        .with_context(|ctx| creg.write_device(ctx, 0, &data))
        .unwrap()
        .unwrap();
    let d = [TransferDesc::new(
        creg.full(),
        link.remote(saddr + MIB as u64, MIB as u64).unwrap(),
    )];
    let req = link
        .transfer_async(TransferOp::Write, &d, TArgs::default())
        .unwrap();
    let st = req.wait(t);
    assert!(matches!(st, TStatus::Completed), "{st:?}");
    drop(req);
    let mut sreg = sreg;
    let mut back = vec![0u8; MIB];
    server
        .with_context(|ctx| sreg.read_device(ctx, MIB, &mut back))
        .unwrap()
        .unwrap();
    assert_eq!(fnv1a(&back), fnv1a(&data));
    drop(link);

    // the server links to itself (a fabric-memory engine may): its second MiB copied onto its
    // first, then a batch whose source overlaps its destination refused, nothing moved
    let me = server.connect(server.name()).unwrap();
    assert_eq!(me.transport(), TransportKind::Ascend);
    let d = [TransferDesc::new(
        sreg.range(MIB..2 * MIB).unwrap(),
        me.remote(saddr, MIB as u64).unwrap(),
    )];
    me.transfer_sync(TransferOp::Write, &d, t).unwrap();
    let bad = [TransferDesc::new(
        sreg.range(0..1000).unwrap(),
        me.remote(saddr + 999, 1000).unwrap(),
    )];
    let err = me.transfer_sync(TransferOp::Read, &bad, t).unwrap_err();
    assert!(
        matches!(err, hixl::Error::OverlappingTransfer { src: 0, dst: 0 }),
        "{err:?}"
    );
    assert_eq!(err.status(), Status::PARAM_INVALID);
    drop(me);
    let mut both = vec![0u8; 2 * MIB];
    server
        .with_context(|ctx| sreg.read_device(ctx, 0, &mut both))
        .unwrap()
        .unwrap();
    assert_eq!(fnv1a(&both[..MIB]), fnv1a(&data), "copied onto itself");
    assert_eq!(fnv1a(&both[MIB..]), fnv1a(&data));

    // a self-link passes the engine's own admission: an allow-list without its name refuses it
    let listed = Hixl::initialize_ephemeral("127.0.0.1", opts().allow_peers(["10.9.8.7:1"]))
        .unwrap()
        .into_registered()
        .activate()
        .unwrap();
    let err = listed.connect(listed.name()).unwrap_err();
    assert_eq!(err.status(), Status::PARAM_INVALID, "{err:?}");
    assert!(err.to_string().contains("allow-list"), "{err}");
    drop(listed);

    // an engine that is not a fabric-memory one has no fabric memory
    let plain = Hixl::initialize("127.0.0.1", Options::default()).unwrap();
    let err = plain
        .with_context(|ctx| plain.alloc_fabric(ctx, MemType::Device, MIB))
        .unwrap()
        .unwrap_err();
    assert_eq!(err.status(), Status::UNSUPPORTED);
    let _ = std::fs::remove_dir_all(&base);
}

/// `free_mem` frees only what `malloc_mem` handed out: the address of a live `FabricBuffer` is
/// `PARAM_INVALID`, as an unknown one is, and the buffer keeps its memory and its data; its
/// drop still frees it (its address then unknown to the allocator).
#[test]
fn free_mem_refuses_a_fabric_buffers_memory() {
    use hixl::fabric::FabricConfig;
    use hixl::{Hixl, Options};
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no system C compiler (`cc`) to build the ACL test double");
        return;
    }
    let base = std::env::temp_dir().join(format!("hixl-fabric-owned-{}", std::process::id()));
    let lib = hixl::testkit::build_ascend_double(&base).expect("build the test double");
    // a private copy: its own globals
    let so = base.join("owned.so");
    std::fs::copy(&lib, &so).unwrap();
    let opts = Options::default().fabric_mem(FabricConfig {
        acl_lib: Some(so.clone()),
        device_id: Some(0),
        task_streams: 1,
    });
    let data = Rng::new(0xF8EE).bytes(MIB);
    let e = Hixl::initialize("127.0.0.1", opts).unwrap();
    let addr = e
        .with_context(|ctx| {
            let mut b = e.alloc_fabric(ctx, MemType::Device, MIB).unwrap();
            b.write(ctx, 0, &data).unwrap();
            let err = hixl::fabric::free_mem(b.addr()).unwrap_err();
            assert_eq!(err.status(), Status::PARAM_INVALID, "{err:?}");
            // still the buffer's: its data reads back, and it takes a write
            let mut back = vec![0u8; MIB];
            b.read(ctx, 0, &mut back).unwrap();
            assert_eq!(fnv1a(&back), fnv1a(&data));
            b.write(ctx, MIB - 3, b"end").unwrap();
            let mut end = [0u8; 3];
            b.read(ctx, MIB - 3, &mut end).unwrap();
            assert_eq!(&end, b"end");
            // the allocator still has it (its handle exports)
            hixl::fabric::export_to_shareable_handle(b.addr()).expect("still allocated");
            let addr = b.addr();
            drop(b);
            addr
        })
        .unwrap();
    // the drop freed it
    let err = hixl::fabric::export_to_shareable_handle(addr).unwrap_err();
    assert_eq!(err.status(), Status::PARAM_INVALID, "{err:?}");
    drop(e);
    let _ = std::fs::remove_dir_all(&base);
}

const SELF_CHILD: &str = "HIXL_FABRIC_SELF_CHILD";

/// A fabric-memory engine connects to itself, as upstream's FabricMem engine does (its kv
/// benchmark links each engine to itself): WRITE and READ of random data between this
/// process's own regions, sync and async; a batch whose source overlaps a destination is
/// `PARAM_INVALID` and moves nothing; deregistering while self-linked is `FAILED`; finalizing
/// a self-linked engine ends the link. Other engines still refuse a link to themselves
/// (`PARAM_INVALID`), under their own name or another address of theirs.
#[test]
fn fabric_engine_links_to_itself() {
    in_child(
        "fabric_engine_links_to_itself",
        SELF_CHILD,
        self_scenario,
        "FABRIC SELF SCENARIO OK",
        "hixl-fabric-self",
    );
}

/// One async request of `descs` to `peer`, waited for (10 s): its final status.
fn run_async(e: &Hixl, peer: &str, op: TransferOp, descs: &[TransferOpDesc]) -> TransferStatus {
    let req = e
        .transfer_async(peer, op, descs, TransferArgs::default())
        .unwrap_or_else(|err| panic!("async {op:?}: {err:?}"));
    e.wait_transfer(req, std::time::Duration::from_secs(10))
        .unwrap()
}

fn register(e: &Hixl, addr: usize, len: usize, t: MemType) -> hixl::compat::MemHandle {
    // SAFETY: `addr..addr+len` is a live malloc_mem allocation, freed after deregistration.
    unsafe {
        e.register_mem(
            MemDesc {
                addr,
                len,
                local_only: false,
            },
            t,
        )
    }
    .expect("register VMM memory")
}

fn self_scenario() {
    // engines that are not fabric-memory ones refuse a link to themselves, under their own
    // name and under another address of theirs
    let plain = Hixl::new();
    plain
        .initialize("127.0.0.1:0", [("hixl.ascend.enable", "0")])
        .unwrap();
    let err = plain
        .connect(&plain.local_engine().unwrap(), 10_000)
        .unwrap_err();
    assert_eq!(err.status(), Status::PARAM_INVALID, "{err:?}");
    plain.finalize();
    let any = Hixl::new();
    any.initialize("0.0.0.0:0", [("hixl.ascend.enable", "0")])
        .unwrap();
    let port = any
        .local_engine()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let err = any
        .connect(&format!("127.0.0.1:{port}"), 10_000)
        .unwrap_err();
    assert_eq!(err.status(), Status::PARAM_INVALID, "{err:?}");
    assert!(err.to_string().contains("itself"), "{err}");
    any.finalize();

    let e = fabric_engine("127.0.0.1:0");
    let me = e.local_engine().unwrap();
    let mut rng = Rng::new(0x5E1F);
    let dev = hixl::fabric::malloc_mem(MemType::Device, 4 * MIB).unwrap();
    let host = hixl::fabric::malloc_mem(MemType::Host, 2 * MIB).unwrap();
    let seeded = rng.bytes(4 * MIB);
    fill(dev, &seeded);
    fill(host, &vec![0u8; 2 * MIB]);
    let hd = register(&e, dev, 4 * MIB, MemType::Device);
    let hh = register(&e, host, 2 * MIB, MemType::Host);

    e.connect(&me, 10_000)
        .expect("a fabric-memory engine connects to itself");
    assert_eq!(e.transport(&me).unwrap(), TransportKind::Ascend);
    let err = e.connect(&me, 10_000).unwrap_err();
    assert_eq!(err.status(), Status::ALREADY_CONNECTED, "{err:?}");

    // WRITE device → host, READ device → host, WRITE within one region (disjoint ranges)
    let w = TransferOpDesc {
        local_addr: dev + 100,
        remote_addr: host + 7,
        len: MIB,
    };
    e.transfer_sync(&me, TransferOp::Write, &[w], 10_000)
        .expect("WRITE to itself");
    assert_eq!(bytes(host + 7, MIB), seeded[100..100 + MIB]);
    let r = TransferOpDesc {
        local_addr: host + MIB,
        remote_addr: dev + 3 * MIB,
        len: 500_000,
    };
    e.transfer_sync(&me, TransferOp::Read, &[r], 10_000)
        .expect("READ from itself");
    assert_eq!(
        bytes(host + MIB, 500_000),
        seeded[3 * MIB..3 * MIB + 500_000]
    );
    let within = TransferOpDesc {
        local_addr: dev,
        remote_addr: dev + 2 * MIB,
        len: MIB,
    };
    e.transfer_sync(&me, TransferOp::Write, &[within], 10_000)
        .expect("WRITE within one region");
    assert_eq!(bytes(dev + 2 * MIB, MIB), seeded[..MIB]);

    // async, both directions
    let data = rng.bytes(300_000);
    fill(host, &data);
    let st = run_async(
        &e,
        &me,
        TransferOp::Write,
        &[TransferOpDesc {
            local_addr: host,
            remote_addr: dev + MIB + 5,
            len: 300_000,
        }],
    );
    assert_eq!(st, TransferStatus::Completed);
    assert_eq!(fnv1a(&bytes(dev + MIB + 5, 300_000)), fnv1a(&data));
    let st = run_async(
        &e,
        &me,
        TransferOp::Read,
        &[TransferOpDesc {
            local_addr: host + 2 * MIB - 300_000,
            remote_addr: dev + MIB + 5,
            len: 300_000,
        }],
    );
    assert_eq!(st, TransferStatus::Completed);
    assert_eq!(
        fnv1a(&bytes(host + 2 * MIB - 300_000, 300_000)),
        fnv1a(&data)
    );

    // a source overlapping a destination, in one descriptor or across two: PARAM_INVALID,
    // before anything moves
    let before_dev = bytes(dev, 4 * MIB);
    let before_host = bytes(host, 2 * MIB);
    let overlapping: [(TransferOp, Vec<TransferOpDesc>); 4] = [
        (
            TransferOp::Write,
            vec![TransferOpDesc {
                local_addr: dev,
                remote_addr: dev + 4096,
                len: 8192,
            }],
        ),
        (
            TransferOp::Read,
            vec![TransferOpDesc {
                local_addr: dev + 4096,
                remote_addr: dev,
                len: 8192,
            }],
        ),
        (
            // the same range both ways
            TransferOp::Write,
            vec![TransferOpDesc {
                local_addr: host,
                remote_addr: host,
                len: 10,
            }],
        ),
        (
            // descriptor 1 writes host[0..100], descriptor 0 reads host[50..150]
            TransferOp::Write,
            vec![
                TransferOpDesc {
                    local_addr: host + 50,
                    remote_addr: dev,
                    len: 100,
                },
                TransferOpDesc {
                    local_addr: dev + MIB,
                    remote_addr: host,
                    len: 100,
                },
            ],
        ),
    ];
    for (op, descs) in &overlapping {
        let err = e.transfer_sync(&me, *op, descs, 10_000).unwrap_err();
        assert_eq!(
            err.status(),
            Status::PARAM_INVALID,
            "{op:?} {descs:?}: {err:?}"
        );
        assert!(err.to_string().contains("overlaps"), "{err}");
        // async: the batch starts, and fails on the data path, nothing moved
        let st = run_async(&e, &me, *op, descs);
        assert_eq!(st, TransferStatus::Failed, "{op:?} {descs:?}");
    }
    // adjacent (touching, not overlapping) ranges are fine
    e.transfer_sync(
        &me,
        TransferOp::Write,
        &[TransferOpDesc {
            local_addr: host,
            remote_addr: host + 10,
            len: 10,
        }],
        10_000,
    )
    .expect("adjacent ranges");
    let mut expect_host = before_host.clone();
    expect_host.copy_within(0..10, 10);
    assert_eq!(bytes(host, 2 * MIB), expect_host);
    assert_eq!(bytes(dev, 4 * MIB), before_dev, "device memory untouched");

    // deregistering while the engine is linked to itself: upstream's rule
    let err = e.deregister_mem(hh).unwrap_err();
    assert_eq!(err.status(), Status::FAILED, "{err:?}");

    // finalize with the self-link up ends it; the memory is the caller's again
    e.finalize();
    let _ = hd;

    // a second engine: disconnecting its self-link lets it deregister
    let e = fabric_engine("127.0.0.1:0");
    let me = e.local_engine().unwrap();
    let hd = register(&e, dev, 4 * MIB, MemType::Device);
    e.connect(&me, 10_000).unwrap();
    e.disconnect(&me, 10_000).expect("disconnect from itself");
    e.deregister_mem(hd)
        .expect("deregister once the self-link is gone");
    e.finalize();
    for a in [dev, host] {
        hixl::fabric::free_mem(a).expect("FreeMem");
    }
}

const FINALIZE_CHILD: &str = "HIXL_FABRIC_FINALIZE_CHILD";

#[test]
fn fabric_memory_is_not_reached_after_finalize() {
    in_child(
        "fabric_memory_is_not_reached_after_finalize",
        FINALIZE_CHILD,
        finalize_scenario,
        "FABRIC FINALIZE SCENARIO OK",
        "hixl-fabric-fin",
    );
}

/// A client keeps WRITEing the server's 4 MiB region (two patterns in turn, a batch each) while
/// the server finalizes. Once `finalize` returns, the memory its owner got back never changes
/// again, and every batch the client starts from then on fails. A client on this host copies
/// inside the server's fence, so the memory holds exactly the last batch that returned `Ok`;
/// without same-host access (`hixl.SameHost=off`, as a client on another host) the client
/// learns of the end on its control connection.
fn finalize_scenario() {
    const LEN: usize = 4 * MIB;
    let mut rng = Rng::new(0xF1A);
    let patterns = [rng.bytes(LEN), rng.bytes(LEN)];
    let (mut changed, mut late_ok, mut torn) = (0, 0, 0);
    let rounds = 6;
    for round in 0..rounds {
        let same_host = if round % 2 == 0 { "auto" } else { "off" };
        let server = fabric_engine("127.0.0.1:0");
        let client = Hixl::new();
        client
            .initialize(
                "127.0.0.1",
                [("EnableUseFabricMem", "1"), ("hixl.SameHost", same_host)],
            )
            .unwrap();
        let name = server.local_engine().unwrap();
        let s_mem = hixl::fabric::malloc_mem(MemType::Device, LEN).unwrap();
        let c_mem = hixl::fabric::malloc_mem(MemType::Device, 2 * LEN).unwrap();
        fill(s_mem, &vec![0u8; LEN]);
        fill(c_mem, &patterns[0]);
        fill(c_mem + LEN, &patterns[1]);
        let _sh = register(&server, s_mem, LEN, MemType::Device);
        let ch = register(&client, c_mem, 2 * LEN, MemType::Device);
        client.connect(&name, 10_000).unwrap();
        let client = std::sync::Arc::new(client);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // the writer: (when the batch started, which pattern, whether it returned Ok)
        let writer = {
            let (client, stop, name) = (client.clone(), stop.clone(), name.clone());
            std::thread::spawn(move || {
                let mut log = Vec::new();
                let mut i = 0usize;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let d = TransferOpDesc {
                        local_addr: c_mem + (i % 2) * LEN,
                        remote_addr: s_mem,
                        len: LEN,
                    };
                    let at = std::time::Instant::now();
                    let ok = client
                        .transfer_sync(&name, TransferOp::Write, &[d], 10_000)
                        .is_ok();
                    log.push((at, i % 2, ok));
                    i += 1;
                }
                log
            })
        };
        // a few batches land, then the server ends while the writer goes on
        while bytes(s_mem, 16) == vec![0u8; 16] {
            std::thread::yield_now();
        }
        server.finalize();
        let ended = std::time::Instant::now();
        let kept = bytes(s_mem, LEN);
        // the writer goes on until it has started at least 20 batches since
        let log = loop {
            std::thread::sleep(std::time::Duration::from_millis(20));
            if writer.is_finished() {
                break Vec::new();
            }
            let after = bytes(s_mem, LEN);
            if after != kept {
                changed += 1;
                eprintln!(
                    "round {round} ({same_host}): the memory changed after finalize returned"
                );
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
                break writer.join().unwrap();
            }
            if ended.elapsed() > std::time::Duration::from_millis(300) {
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
                break writer.join().unwrap();
            }
        };
        let late = log.iter().filter(|(at, _, ok)| *at > ended && *ok).count();
        let started_after = log.iter().filter(|(at, _, _)| *at > ended).count();
        late_ok += usize::from(late > 0);
        if late > 0 {
            eprintln!(
                "round {round} ({same_host}): {late} of {started_after} batches started after \
                 finalize returned reported Ok"
            );
        }
        if same_host == "auto" {
            // inside the fence: the memory holds the last batch that returned Ok, whole
            let last_ok = log.iter().rev().find(|(_, _, ok)| *ok).map(|&(_, p, _)| p);
            if last_ok.is_none_or(|p| kept != patterns[p]) {
                torn += 1;
                eprintln!("round {round}: the memory is not the last Ok batch's bytes");
            }
        }
        assert!(
            started_after > 0 || changed > 0,
            "round {round}: no batch after finalize"
        );
        client.deregister_mem(ch).ok();
        client.finalize();
        hixl::fabric::free_mem(c_mem).unwrap();
        hixl::fabric::free_mem(s_mem).unwrap();
    }
    eprintln!(
        "fabric finalize under a writing client, {rounds} rounds: memory changed after finalize \
         in {changed}, batches started after it reported Ok in {late_ok}, memory not the last \
         Ok batch (fenced rounds) in {torn}"
    );
    assert_eq!((changed, late_ok, torn), (0, 0, 0));
}
