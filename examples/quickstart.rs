//! Two engines on loopback: register, connect, WRITE and READ random data, verify, and print
//! throughput. Both engines are in one process, so the link uses the same-host transport where
//! the kernel allows it (`HIXL_TCP=1` forces TCP).
//!
//! ```text
//! cargo run --release --example quickstart
//! ```

use std::time::{Duration, Instant};

use hixl::testkit::Rng;
use hixl::{Hixl, HostBuffer, Options, SameHost, TransferDesc, TransferOp};

const BLOCK: usize = 1 << 20; // 1 MiB blocks
const BLOCKS: usize = 64; // 64 MiB per region
const ROUNDS: usize = 8;

fn main() -> Result<(), hixl::Error> {
    // 1. Initialize: a serving engine (listens on a port the OS picks) and a client engine.
    let server = Hixl::initialize_ephemeral("127.0.0.1", Options::default())?;
    let policy = if std::env::var_os("HIXL_TCP").is_some() {
        SameHost::Forbid
    } else {
        SameHost::Auto
    };
    let client = Hixl::initialize("127.0.0.1", Options::default().same_host(policy))?;

    // 2. Register memory: the engines take ownership of the buffers.
    // touch every page first, as a cache in use is (a page's first touch costs more than its copy)
    let (mut cache_mem, mut buf_mem) = (
        HostBuffer::new(BLOCK * BLOCKS)?,
        HostBuffer::new(2 * BLOCK * BLOCKS)?,
    );
    cache_mem.fill(0);
    buf_mem.fill(0);
    let (server, cache) = server.register(cache_mem)?;
    let (client, mut buf) = client.register(buf_mem)?;
    println!(
        "server {} serves {} MiB; client {}",
        server.name(),
        cache.len() >> 20,
        client.name()
    );

    // 3. Close registration; the server starts serving its region table.
    let server = server.activate()?;
    let client = client.activate()?;

    let mut rng = Rng::new(2026);
    let data = rng.bytes(BLOCK * BLOCKS);
    buf.write_at(0, &data)?;

    let (write_s, read_s) = {
        // 4. Connect: the server's region table arrives with the link.
        let link = client.connect(server.name())?;
        println!("link to {} over {:?}", link.peer(), link.transport());
        let remote = link
            .regions()
            .next()
            .expect("the server registered one region");
        let t = Duration::from_secs(10);

        // 5. WRITE the first half of `buf` into the server, one descriptor per block, one batch.
        let writes: Vec<_> = (0..BLOCKS)
            .map(|i| {
                let (o, r) = (i * BLOCK, (i * BLOCK) as u64);
                Ok(TransferDesc::new(
                    buf.range(o..o + BLOCK)?,
                    remote.range(r..r + BLOCK as u64)?,
                ))
            })
            .collect::<Result<_, hixl::Error>>()?;
        // 6. READ it back into the second half.
        let reads: Vec<_> = (0..BLOCKS)
            .map(|i| {
                let (o, r) = (BLOCKS * BLOCK + i * BLOCK, (i * BLOCK) as u64);
                Ok(TransferDesc::new(
                    buf.range(o..o + BLOCK)?,
                    remote.range(r..r + BLOCK as u64)?,
                ))
            })
            .collect::<Result<_, hixl::Error>>()?;

        let t0 = Instant::now();
        for _ in 0..ROUNDS {
            link.transfer_sync(TransferOp::Write, &writes, t)?;
        }
        let write_s = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        for _ in 0..ROUNDS {
            link.transfer_sync(TransferOp::Read, &reads, t)?;
        }
        let read_s = t0.elapsed().as_secs_f64();

        // 7. Disconnect (consumes the link).
        drop((writes, reads));
        link.disconnect(t)?;
        (write_s, read_s)
    };

    // 8. Verify what came back, byte for byte.
    let mut back = vec![0u8; BLOCK * BLOCKS];
    buf.read_at(BLOCK * BLOCKS, &mut back)?;
    assert!(back == data, "READ back differs from what was written");

    // 9. Leave Connected, hand the memory back, finalize.
    let server = server.deactivate();
    let cache = server.deregister(cache)?;
    assert!(
        cache[..] == data[..],
        "the server's memory differs from what was written"
    );
    let _ = (server.finalize(), client.finalize());

    let bytes = (ROUNDS * BLOCKS * BLOCK) as f64;
    println!(
        "verified {} MiB written and read back intact",
        (BLOCKS * BLOCK) >> 20
    );
    println!(
        "WRITE  {:>6.2} GB/s  ({} x {} x 1 MiB blocks, batch {})",
        bytes / write_s / 1e9,
        ROUNDS,
        BLOCKS,
        BLOCKS
    );
    println!(
        "READ   {:>6.2} GB/s  ({} x {} x 1 MiB blocks, batch {})",
        bytes / read_s / 1e9,
        ROUNDS,
        BLOCKS,
        BLOCKS
    );
    Ok(())
}
