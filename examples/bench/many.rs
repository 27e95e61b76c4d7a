//! Many-to-many rows (`--fan in,out --peers N`) and what a link costs (`--link-cost`); the
//! module docs of `main.rs` say what each measures.
//!
//! The child processes they start speak lines on their stdin and stdout:
//! - `bench --client SERVER OP BLOCK BATCH WS REMOTE_OFFSET TRANSPORT`: one link to SERVER, the
//!   row's calls over WS bytes of its own memory and of the server's region from
//!   REMOTE_OFFSET; says `READY` once warmed up, runs `--duration` from `GO` (the duration is
//!   the line's second word), says `DONE CALLS START_NS END_NS` (wall clock), then on `VERIFY`
//!   runs one call again on fresh bytes and says `CHECK OFFSET LEN HASH` per descriptor and
//!   `END`; it ends when its stdin closes.
//! - `bench --links K SERVER TRANSPORT`: says `STAGE base`, and on each `NEXT` goes one stage
//!   on: K engines with one link each to SERVER (`STAGE connected`), one 4 KiB WRITE on each
//!   (`STAGE transferred`), then the WRITEs' `CHECK` lines and `END`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hixl::testkit::Rng;
use hixl::{Hixl, HostBuffer, Link, TransferOp};

use super::verify::{Check, check_call};
use super::{
    Args, Plan, ServeSpec, Server, client_options, default_batch, descs, human, parse_op, plan,
    progress, raise_nofile, read_line, run_calls, server_stop, start_server, warm_up, ws,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Nanoseconds since the epoch: comparable between the processes of one host.
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// One link's share of a fan row: its bytes and its wall-clock span.
struct Share {
    bytes: usize,
    start_ns: u128,
    end_ns: u128,
}

/// All links' bytes over the time from the first start to the last end, GB/s.
fn aggregate(shares: &[Share]) -> f64 {
    let start = shares.iter().map(|s| s.start_ns).min().unwrap_or(0);
    let end = shares.iter().map(|s| s.end_ns).max().unwrap_or(0);
    let bytes: usize = shares.iter().map(|s| s.bytes).sum();
    bytes as f64 / (end.saturating_sub(start).max(1) as f64 / 1e9) / 1e9
}

/// A link's share of the working set with `n` links, and the batch that fits in it.
fn split(a: &Args, block: usize, batch: usize, n: usize) -> Res<(usize, usize)> {
    let span = if a.ws == 0 {
        block
    } else {
        a.ws.clamp(block, ws())
    };
    let share = (span / n).max(block) / block * block;
    if share * n > ws() {
        return Err(format!(
            "--peers {n}: {n} links of {} blocks do not fit in the {} MiB region",
            human(block),
            ws() >> 20
        )
        .into());
    }
    Ok((share, batch.min(share / block).max(1)))
}

/// The `--fan` rows: per direction, op and block, one pair and N links, printed.
pub(crate) fn fan_rows(a: &Args) -> Res<()> {
    let n = a.peers;
    let mut out = Vec::new();
    for dir in &a.fan {
        for &block in &a.blocks {
            for &op in &a.ops {
                let batch = a.batch.unwrap_or_else(|| default_batch(block));
                // the batch that fits the smaller share, for the pair too
                let (_, batch) = split(a, block, batch, n)?;
                let run = |links| {
                    progress(&format!(
                        "fan {dir}: {op} {} x{batch}, {links} link(s) ...",
                        human(block)
                    ));
                    if dir == "in" {
                        fan_in(a, op, block, batch, links)
                    } else {
                        fan_out(a, op, block, batch, links)
                    }
                };
                let pair = run(1)?;
                let many = run(n)?;
                out.push((dir.as_str(), op, block, batch, pair, many));
            }
        }
    }
    progress("");
    eprint!("\r\x1b[2K");
    if a.json {
        for (dir, op, block, batch, pair, many) in &out {
            println!(
                "{}",
                serde_json::json!({
                    "metric": format!("fan_{dir}"),
                    "op": op.name(),
                    "transport": a.transport,
                    "block": block,
                    "batch": batch,
                    "links": n,
                    "gbps": round3(*many),
                    "pair_gbps": round3(*pair),
                    "ratio": round3(many / pair),
                })
            );
        }
        return Ok(());
    }
    println!(
        "many-to-many ({}): in = {n} client processes -> 1 server, out = 1 client -> {n} servers; \
         aggregate GB/s against one pair",
        a.transport
    );
    println!(
        "{:<4} {:<6} {:>8} {:>6} {:>6} {:>10} {:>10} {:>6} {:>14}",
        "fan", "op", "block", "batch", "links", "pair GB/s", "all GB/s", "ratio", "per link GB/s"
    );
    for (dir, op, block, batch, pair, many) in &out {
        println!(
            "{:<4} {:<6} {:>8} {:>6} {:>6} {:>10.3} {:>10.3} {:>6.2} {:>14.3}",
            dir,
            op.name(),
            human(*block),
            batch,
            n,
            pair,
            many,
            many / pair,
            many / n as f64
        );
    }
    Ok(())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A child process of the benchmark, spoken to in lines.
struct Kid {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Kid {
    fn spawn(args: &[String]) -> Res<Kid> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let input = child.stdin.take().ok_or("no stdin")?;
        let output = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(Kid {
            child,
            input,
            output,
        })
    }
    fn say(&mut self, line: &str) -> Res<()> {
        writeln!(self.input, "{line}")?;
        Ok(self.input.flush()?)
    }
    fn hear(&mut self) -> Res<String> {
        read_line(&mut self.output)
    }
    /// Reads `CHECK` lines up to `END`.
    fn checks(&mut self) -> Res<Vec<Check>> {
        let mut out = Vec::new();
        loop {
            let line = self.hear()?;
            if line == "END" {
                return Ok(out);
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["CHECK", off, len, hash] => out.push(Check {
                    off: off.parse()?,
                    len: len.parse()?,
                    hash: u64::from_str_radix(hash, 16)?,
                }),
                _ => return Err(format!("a client said {line:?}").into()),
            }
        }
    }
    /// Closes its stdin and waits for it to end well.
    fn finish(self) -> Res<()> {
        let Kid {
            mut child, input, ..
        } = self;
        drop(input);
        let st = child.wait()?;
        if !st.success() {
            return Err(format!("a client process ended with {st}").into());
        }
        Ok(())
    }
}

/// Says each check as a `CHECK` line, then `END`.
fn say_checks(out: &mut impl Write, checks: &[Check]) -> Res<()> {
    for c in checks {
        writeln!(out, "CHECK {} {} {:016x}", c.off, c.len, c.hash)?;
    }
    writeln!(out, "END")?;
    Ok(out.flush()?)
}

/// `n` client processes, one link each, to one serving process; aggregate GB/s.
fn fan_in(a: &Args, op: TransferOp, block: usize, batch: usize, n: usize) -> Res<f64> {
    let (share, _) = split(a, block, batch, n)?;
    let mut server = start_server(
        2,
        ServeSpec {
            conns: 1024.max(16 * n + 64),
            ..ServeSpec::of(a, ws())
        },
    )?;
    let mut kids = (0..n)
        .map(|k| {
            Kid::spawn(&[
                "--client".into(),
                server.name().to_owned(),
                op.name().to_owned(),
                block.to_string(),
                batch.to_string(),
                share.to_string(),
                (k * share).to_string(),
                a.transport.clone(),
            ])
        })
        .collect::<Res<Vec<_>>>()?;
    for k in &mut kids {
        let l = k.hear()?;
        if l != "READY" {
            return Err(format!("a client said {l:?}").into());
        }
    }
    let go = format!("GO {}", a.duration.as_secs_f64());
    for k in &mut kids {
        k.say(&go)?;
    }
    let mut shares = Vec::new();
    for k in &mut kids {
        let l = k.hear()?;
        let w: Vec<&str> = l.split_whitespace().collect();
        let ["DONE", calls, start, end] = w.as_slice() else {
            return Err(format!("a client said {l:?}").into());
        };
        shares.push(Share {
            bytes: calls.parse::<usize>()? * batch * block,
            start_ns: start.parse()?,
            end_ns: end.parse()?,
        });
    }
    // one client at a time: no other call runs while the server hashes a client's ranges
    for (i, k) in kids.iter_mut().enumerate() {
        k.say("VERIFY")?;
        let checks = k.checks()?;
        server.confirm(
            &checks,
            &format!("fan in, client {i} of {n}: {op} {} x{batch}", human(block)),
        )?;
    }
    for k in kids {
        k.finish()?;
    }
    server_stop(server)?;
    Ok(aggregate(&shares))
}

/// `bench --client ...`: one client of a fan-in row.
pub(crate) fn client_main(args: &[String]) -> Res<()> {
    let [server, op, block, batch, ws, remote, transport] = args else {
        return Err(format!("--client: expected 7 arguments, got {args:?}").into());
    };
    let op = parse_op(op)?;
    let (block, batch, ws): (usize, usize, usize) = (block.parse()?, batch.parse()?, ws.parse()?);
    let remote: u64 = remote.parse()?;
    let mut mem = HostBuffer::new(ws)?;
    Rng::new(2 + remote).fill(&mut mem); // touch every page
    let (client, mut buf) =
        Hixl::initialize("127.0.0.1", client_options(transport))?.register(mem)?;
    let client = client.activate()?;
    let link = client.connect_timeout(server, Duration::from_secs(10))?;
    let plan = plan(ws, block, batch, 0, remote);
    let descs = descs(&buf, &link, &plan)?;
    warm_up(&link, op, &descs)?;
    let mut input = std::io::stdin().lock();
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY")?;
    out.flush()?;
    let go = read_line(&mut input)?;
    let secs: f64 = go
        .strip_prefix("GO ")
        .and_then(|s| s.parse().ok())
        .ok_or(format!("--client: expected GO, got {go:?}"))?;
    let start = now_ns();
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let (calls, _) = run_calls(&link, op, &descs, (0, 1), |_| Instant::now() >= until)?;
    writeln!(out, "DONE {calls} {start} {}", now_ns())?;
    out.flush()?;
    if read_line(&mut input)? != "VERIFY" {
        return Err("--client: expected VERIFY".into());
    }
    drop(descs);
    say_checks(&mut out, &check_call(&link, &mut buf, op, &plan[0])?)?;
    // until the parent closes our stdin
    while input.read_line(&mut String::new())? > 0 {}
    drop(link);
    let _ = client.finalize();
    Ok(())
}

/// One client engine in this process with `n` links to `n` serving processes, a caller thread
/// per link; aggregate GB/s.
fn fan_out(a: &Args, op: TransferOp, block: usize, batch: usize, n: usize) -> Res<f64> {
    let (share, _) = split(a, block, batch, n)?;
    let mut servers = (0..n)
        .map(|_| start_server(2, ServeSpec::of(a, share)))
        .collect::<Res<Vec<Server>>>()?;
    let mut mem = HostBuffer::new(share * n)?;
    Rng::new(2).fill(&mut mem);
    let (client, mut buf) =
        Hixl::initialize("127.0.0.1", client_options(&a.transport))?.register(mem)?;
    let client = client.activate()?;
    let links = servers
        .iter()
        .map(|s| client.connect_timeout(s.name(), Duration::from_secs(10)))
        .collect::<Result<Vec<Link<'_>>, _>>()?;
    let plans: Vec<Plan> = (0..n)
        .map(|k| plan(share, block, batch, k * share, 0))
        .collect();
    let shares = {
        let all = links
            .iter()
            .zip(&plans)
            .map(|(l, p)| descs(&buf, l, p))
            .collect::<Res<Vec<_>>>()?;
        for (l, d) in links.iter().zip(&all) {
            warm_up(l, op, d)?;
        }
        let barrier = std::sync::Barrier::new(n);
        std::thread::scope(|s| {
            let hs: Vec<_> = links
                .iter()
                .zip(&all)
                .map(|(link, d)| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        let start_ns = now_ns();
                        let until = Instant::now() + a.duration;
                        let (calls, _) =
                            run_calls(link, op, d, (0, 1), |_| Instant::now() >= until)?;
                        Ok::<_, hixl::Error>(Share {
                            bytes: calls * batch * block,
                            start_ns,
                            end_ns: now_ns(),
                        })
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("a fan-out thread panicked"))
                .collect::<Result<Vec<_>, _>>()
        })?
    };
    for (k, (link, p)) in links.iter().zip(&plans).enumerate() {
        let checks = check_call(link, &mut buf, op, &p[0])?;
        servers[k].confirm(
            &checks,
            &format!("fan out, link {k} of {n}: {op} {} x{batch}", human(block)),
        )?;
    }
    drop(links);
    let _ = client.finalize();
    for s in servers {
        server_stop(s)?;
    }
    Ok(aggregate(&shares))
}

/// Resident memory (KiB), threads and open descriptors of a process.
#[derive(Clone, Copy, Default)]
struct Usage {
    rss_kib: i64,
    threads: i64,
    fds: i64,
}

fn usage(pid: u32) -> Res<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(Usage {
        rss_kib: field("VmRSS:"),
        threads: field("Threads:"),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as i64,
    })
}

/// The `--link-cost` table: per link count, both processes at each stage, printed.
pub(crate) fn link_cost(a: &Args) -> Res<()> {
    raise_nofile();
    let mut out = Vec::new();
    for &n in &a.link_cost {
        progress(&format!("link cost: {n} link(s) ..."));
        let mut server = start_server(
            2,
            ServeSpec {
                conns: 1024.max(16 * n + 64),
                ..ServeSpec::of(a, n * 4096)
            },
        )?;
        let mut kid = Kid::spawn(&[
            "--links".into(),
            n.to_string(),
            server.name().to_owned(),
            a.transport.clone(),
        ])?;
        let client_pid = kid.child.id();
        let mut base = None;
        for stage in ["base", "connected", "transferred"] {
            let l = kid.hear()?;
            if l != format!("STAGE {stage}") {
                return Err(format!("--links said {l:?}, not STAGE {stage}").into());
            }
            let now = (usage(server.pid())?, usage(client_pid)?);
            let b = *base.get_or_insert(now);
            out.push((n, stage, b, now));
            kid.say("NEXT")?;
        }
        let checks = kid.checks()?;
        server.confirm(
            &checks,
            &format!("link cost: WRITE 4 KiB on each of {n} links"),
        )?;
        kid.finish()?;
        server_stop(server)?;
    }
    progress("");
    eprint!("\r\x1b[2K");
    let per = |now: i64, base: i64, n: usize| (now - base) as f64 / n as f64;
    if a.json {
        for (n, stage, (sb, cb), (s, c)) in &out {
            let side = |u: &Usage, b: &Usage| {
                serde_json::json!({
                    "rss_kib": u.rss_kib, "threads": u.threads, "fds": u.fds,
                    "rss_kib_per_link": round3(per(u.rss_kib, b.rss_kib, *n)),
                    "threads_per_link": round3(per(u.threads, b.threads, *n)),
                    "fds_per_link": round3(per(u.fds, b.fds, *n)),
                })
            };
            println!(
                "{}",
                serde_json::json!({
                    "metric": "link_cost",
                    "transport": a.transport,
                    "links": n,
                    "stage": stage,
                    "server": side(s, sb),
                    "client": side(c, cb),
                })
            );
        }
        return Ok(());
    }
    println!(
        "link cost ({}): one serving process; a client process with one engine per link \
         (per link: growth from `base`, before any link, over the links)",
        a.transport
    );
    println!(
        "{:>5} {:<11} | {:>8} {:>4} {:>5} {:>9} {:>6} {:>5} | {:>8} {:>4} {:>5} {:>9} {:>6} {:>5}",
        "links",
        "stage",
        "srv MiB",
        "thr",
        "fds",
        "KiB/link",
        "thr/l",
        "fd/l",
        "cli MiB",
        "thr",
        "fds",
        "KiB/link",
        "thr/l",
        "fd/l"
    );
    for (n, stage, (sb, cb), (s, c)) in &out {
        print!("{n:>5} {stage:<11}");
        for (u, b) in [(s, sb), (c, cb)] {
            print!(
                " | {:>8.1} {:>4} {:>5} {:>9.1} {:>6.2} {:>5.2}",
                u.rss_kib as f64 / 1024.0,
                u.threads,
                u.fds,
                per(u.rss_kib, b.rss_kib, *n),
                per(u.threads, b.threads, *n),
                per(u.fds, b.fds, *n)
            );
        }
        println!();
    }
    Ok(())
}

/// `bench --links K SERVER TRANSPORT`: the client process of a `--link-cost` row.
pub(crate) fn links_main(args: &[String]) -> Res<()> {
    let [n, server, transport] = args else {
        return Err(format!("--links: expected 3 arguments, got {args:?}").into());
    };
    let n: usize = n.parse()?;
    raise_nofile();
    let mut input = std::io::stdin().lock();
    let mut out = std::io::stdout().lock();
    let mut stage = |name: &str, input: &mut std::io::StdinLock<'_>| -> Res<()> {
        writeln!(out, "STAGE {name}")?;
        out.flush()?;
        let l = read_line(input)?;
        if l != "NEXT" {
            return Err(format!("--links: expected NEXT, got {l:?}").into());
        }
        Ok(())
    };
    stage("base", &mut input)?;
    let mut engines = Vec::with_capacity(n);
    let mut bufs = Vec::with_capacity(n);
    for _ in 0..n {
        let (e, b) = Hixl::initialize("127.0.0.1", client_options(transport))?
            .register(HostBuffer::new(4096)?)?;
        engines.push(e.activate()?);
        bufs.push(b);
    }
    let links = engines
        .iter()
        .map(|e| e.connect_timeout(server, Duration::from_secs(10)))
        .collect::<Result<Vec<_>, _>>()?;
    stage("connected", &mut input)?;
    let mut checks = Vec::with_capacity(n);
    for (k, (link, buf)) in links.iter().zip(&mut bufs).enumerate() {
        let call = [(0, (k * 4096) as u64, 4096)];
        checks.extend(check_call(link, buf, TransferOp::Write, &call)?);
    }
    stage("transferred", &mut input)?;
    say_checks(&mut std::io::stdout().lock(), &checks)?;
    while input.read_line(&mut String::new())? > 0 {}
    drop(links);
    for e in engines {
        let _ = e.finalize();
    }
    Ok(())
}
