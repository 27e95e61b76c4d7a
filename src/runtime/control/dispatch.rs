//! The frame dispatch of the control plane's server: one connection's life, from its handshake
//! (HELLO, CHALLENGE/AUTH, the allow-list, WELCOME with the region table) to the frames of an
//! established lane (NOTIFY, PING, BYE, a transport's setup request such as UCXASK or
//! DEVICE_HELLO, and XFER, which TCP's serving half applies: `transport::tcp::serve`). The
//! whole handshake has one deadline, and once a request's first byte arrives the whole request
//! has `server_io_timeout`. Every descriptor is validated against the region table (region id,
//! bounds with overflow checks, access rights) before a byte moves, and no length is trusted
//! before it is checked.

use super::server::{ActiveGuard, LinkRec, ServerShared};
use crate::error::Status;
use crate::io::{Inbound, Sock, read_frame};
use crate::notify::Notify;
use crate::runtime::control::limits::{self};
use crate::runtime::revoke::fence::ServerFence;
use crate::runtime::transports::{XferEnd, XferServer};
use crate::sync::lock;
use crate::transport::{Accept, AcceptFail};
use crate::wire::{self, Hello, Kind, LaneRole, Refuse, Welcome, WireError};
use std::collections::HashSet;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a serving thread polls for the next request before sleeping: back-to-back small
/// requests skip a wake-up.
pub(super) const SERVE_SPIN: Duration = Duration::from_micros(20);

/// Why a serving connection ended.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnEnd {
    #[error("peer closed the connection")]
    Closed,
    #[error("link closed by BYE")]
    Bye,
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation: {0}")]
    Protocol(#[from] WireError),
    #[error("refused: {0}")]
    Refused(String),
}

/// Reads one handshake frame (HELLO, AUTH) by `deadline`: a header declaring more than
/// [`limits::MAX_HANDSHAKE_FRAME`] bytes is refused before anything is allocated for it.
pub(super) fn read_handshake_frame<'a>(
    sock: &mut Sock,
    inb: &'a mut Inbound,
    deadline: Option<Instant>,
) -> Result<Result<(Kind, &'a [u8]), WireError>, io::Error> {
    inb.fill(sock, wire::HEADER_LEN, deadline)?;
    let h: [u8; wire::HEADER_LEN] = inb.take(wire::HEADER_LEN).try_into().expect("header size");
    let h = match wire::decode_header(&h) {
        Ok(h) if h.len > limits::MAX_HANDSHAKE_FRAME => {
            return Ok(Err(WireError::OverLimit {
                what: "handshake frame length",
                got: h.len.into(),
                limit: limits::MAX_HANDSHAKE_FRAME.into(),
            }));
        }
        Ok(h) => h,
        Err(e) => return Ok(Err(e)),
    };
    inb.fill(sock, h.len as usize, deadline)?;
    Ok(Ok((h.kind, inb.take(h.len as usize))))
}

/// Reads the next request of an established connection: waits as long as it takes for its
/// first byte, then the whole frame must arrive within `timeout`. Returns the frame and that
/// deadline, which also bounds the rest of the request (a WRITE's payload, the reply).
#[allow(clippy::type_complexity)]
pub(super) fn read_request<'a>(
    sock: &mut Sock,
    inb: &'a mut Inbound,
    timeout: Duration,
) -> Result<(Result<(Kind, &'a [u8]), WireError>, Instant), io::Error> {
    inb.fill(sock, 1, None)?;
    let deadline = Instant::now() + timeout;
    let frame = read_frame(sock, inb, Some(deadline), || Some(deadline))?;
    Ok((frame, deadline))
}

/// Gives back what a large request made a connection's buffers grow to.
pub(super) fn trim(inb: &mut Inbound, xfer: &mut XferServer, out: &mut Vec<u8>) {
    inb.trim();
    xfer.trim();
    if out.capacity() > 64 << 10 {
        *out = Vec::with_capacity(256);
    }
}

/// Ends a handshake that failed on I/O: past its deadline the client is told so (`REFUSE`
/// `TIMEOUT`) before the connection closes.
pub(super) fn handshake_failed(sock: &mut Sock, out: &mut Vec<u8>, e: io::Error) -> ConnEnd {
    if e.kind() == io::ErrorKind::TimedOut {
        // the send buffer is empty this early: the short deadline only guards a stuck peer
        let quick = Some(Instant::now() + Duration::from_millis(100));
        refuse(sock, out, Status::TIMEOUT, "handshake timed out", quick);
    }
    ConnEnd::Io(e)
}

/// Counts connection `id` as an established lane (it finished its handshake).
pub(super) fn establish(shared: &ServerShared, id: u64) -> Result<(), limits::Refusal> {
    lock(&shared.conns).establish(id, &shared.limits)
}

pub(super) fn serve_conn(shared: Arc<ServerShared>, id: u64, stream: TcpStream, from: SocketAddr) {
    let mut link = None;
    let end = serve(&shared, id, stream, &mut link);
    if let Some(token) = link {
        let mut links = lock(&shared.links);
        let emptied = match links.get_mut(&token) {
            Some(l) => {
                l.conns.remove(&id);
                // its last lane: the link is kept a while for its client to rejoin (a client
                // that cancels a running request closes that request's lane, maybe its only
                // one); its pending notifications start their grace now
                let last = l.conns.is_empty() && !matches!(end, ConnEnd::Bye);
                if last {
                    l.orphaned = Some(std::time::Instant::now());
                }
                last
            }
            None => false, // closed by BYE or replaced
        };
        // fences of links that go are revoked as their records go
        let gone = shared.prune_orphans(&mut links);
        drop(links);
        if emptied {
            shared.notifies.link_closed(token);
        }
        for t in gone {
            shared.notifies.link_closed(t);
        }
        shared.prune_fences();
    }
    match end {
        ConnEnd::Closed | ConnEnd::Bye => {
            tracing::trace!(parent: &shared.span, %from, reason = %end, "lane closed")
        }
        _ => tracing::debug!(parent: &shared.span, %from, reason = %end, "lane closed"),
    }
}

/// Ends a connection that broke the protocol: tells the peer why, then closes.
pub(super) fn violation(
    sock: &mut Sock,
    out: &mut Vec<u8>,
    e: WireError,
    deadline: Option<Instant>,
) -> ConnEnd {
    refuse(sock, out, Status::FAILED, &e.to_string(), deadline);
    ConnEnd::Protocol(e)
}

/// Refuses a handshake: tells the client `told` with `status` (by `deadline`) and ends the
/// connection for `why` (what the log says).
fn refused(
    sock: &mut Sock,
    out: &mut Vec<u8>,
    status: Status,
    told: &str,
    why: impl Into<String>,
    deadline: Option<Instant>,
) -> ConnEnd {
    refuse(sock, out, status, told, deadline);
    ConnEnd::Refused(why.into())
}

/// The random source failed in a handshake: the client is refused (`FAILED`), never given a
/// guessable token or nonce.
fn no_randomness(
    sock: &mut Sock,
    out: &mut Vec<u8>,
    e: crate::error::Error,
    deadline: Option<Instant>,
) -> ConnEnd {
    let told = "the server has no random source";
    refused(sock, out, Status::FAILED, told, e.to_string(), deadline)
}

pub(super) fn refuse(
    sock: &mut Sock,
    out: &mut Vec<u8>,
    status: Status,
    reason: &str,
    deadline: Option<Instant>,
) {
    Refuse {
        status: status.code(),
        reason: reason.to_owned(),
    }
    .encode(out);
    let _ = sock.send_bytes(out, deadline);
}

pub(super) fn serve(
    shared: &ServerShared,
    id: u64,
    stream: TcpStream,
    link: &mut Option<u64>,
) -> ConnEnd {
    let on_this_host = crate::io::peer_on_this_host(&stream);
    let mut sock = Sock::adopt(stream);
    // declared after `sock`, so the connection leaves the table before its socket closes
    let _entry = limits::Entry {
        table: &shared.conns,
        id,
    };
    // the whole handshake, up to the WELCOME, has one deadline
    let handshake = Some(Instant::now() + shared.io_timeout);
    if let Err(e) = sock.stream.set_nodelay(true) {
        return ConnEnd::Io(e);
    }
    if let Err(e) = sock.set_fixed_timeout(shared.io_timeout) {
        return ConnEnd::Io(e);
    }
    sock.set_spin(SERVE_SPIN);
    if let Some(every) = shared.keepalive
        && let Err(e) = sock.set_keepalive(every)
    {
        return ConnEnd::Io(e);
    }
    // handshake frames are small: so is the buffer until the client is welcomed
    let mut inb = Inbound::with_capacity(limits::MAX_HANDSHAKE_FRAME as usize);
    let mut out = Vec::with_capacity(256);
    let io_deadline = || Some(Instant::now() + shared.io_timeout);

    // handshake: the first frame must be HELLO, within the I/O timeout
    let hello = match read_handshake_frame(&mut sock, &mut inb, handshake) {
        Err(e) => return handshake_failed(&mut sock, &mut out, e),
        Ok(Err(e)) => {
            return violation(&mut sock, &mut out, e, io_deadline());
        }
        Ok(Ok((Kind::Hello, p))) => match Hello::decode(p) {
            Ok(h) => h,
            Err(e) => {
                return violation(&mut sock, &mut out, e, io_deadline());
            }
        },
        Ok(Ok((k, _))) => {
            let e = WireError::Unexpected(k);
            refuse(
                &mut sock,
                &mut out,
                Status::FAILED,
                "expected HELLO",
                io_deadline(),
            );
            return ConnEnd::Protocol(e);
        }
    };
    if let Some(key) = &shared.psk {
        let sn = match crate::auth::nonce() {
            Ok(n) => n,
            Err(e) => return no_randomness(&mut sock, &mut out, e, io_deadline()),
        };
        let proof = key.server_proof(&hello.nonce, &sn, &hello.name);
        wire::encode_auth(&mut out, Kind::Challenge, &[&sn, &proof]);
        if let Err(e) = sock.send_bytes(&out, handshake) {
            return handshake_failed(&mut sock, &mut out, e);
        }
        let answer = match read_handshake_frame(&mut sock, &mut inb, handshake) {
            Err(e) => return handshake_failed(&mut sock, &mut out, e),
            Ok(Ok((Kind::Auth, p))) => wire::decode_auth(p, 1).ok().map(|f| f[0]),
            Ok(_) => None,
        };
        if !answer.is_some_and(|a| key.check_client(&hello.nonce, &sn, &hello.name, &a)) {
            let why = format!("engine {:?} failed authentication", hello.name);
            return refused(
                &mut sock,
                &mut out,
                Status::PARAM_INVALID,
                "authentication failed",
                why,
                io_deadline(),
            );
        }
    }
    if let Some(allow) = &shared.allow
        && !allow.contains(&hello.name)
    {
        let why = format!("engine {:?} is not on the allow-list", hello.name);
        return refused(
            &mut sock,
            &mut out,
            Status::PARAM_INVALID,
            &why,
            why.clone(),
            io_deadline(),
        );
    }
    if let Err(why) = establish(shared, id) {
        return refused(
            &mut sock,
            &mut out,
            Status::RESOURCE_EXHAUSTED,
            why,
            why,
            io_deadline(),
        );
    }
    let same_host = matches!((&hello.host, &shared.host), (Some(c), Some(s)) if c.same_host(s));
    let (token, live, busy, fence) = match hello.role {
        LaneRole::NewLink => {
            // a same-host client gets a fence: one-sided access this server can revoke
            let fence = match &hello.host {
                Some(client) if same_host => match ServerFence::new(client) {
                    Ok(f) => Some(Arc::new(f)),
                    Err(e) => {
                        tracing::debug!(parent: &shared.span, error = %e, "no fence for a same-host client; serving it over tcp");
                        None
                    }
                },
                _ => None,
            };
            // only a fence the server will revoke and wait for is offered
            let fence = fence.filter(|f| shared.offer_fence(f));
            // the link's token is what later lanes present to JOIN it: unguessable, never 0
            let token = loop {
                match crate::types::random_u64() {
                    Ok(0) => {}
                    Ok(t) => break t,
                    Err(e) => return no_randomness(&mut sock, &mut out, e, io_deadline()),
                }
            };
            let mut links = lock(&shared.links);
            // a new link from the same client engine (name and instance) replaces its old one,
            // whose lanes may linger; clients are told apart by name *and* instance, since many
            // client-only engines on one host share the name of its address
            let stale: Vec<u64> = links
                .iter()
                .filter(|(_, l)| l.client == hello.name && l.instance == hello.instance)
                .map(|(t, _)| *t)
                .collect();
            let mut retired = Vec::new();
            for t in stale {
                if let Some(old) = links.remove(&t) {
                    tracing::debug!(parent: &shared.span, server = %shared.name, client = %old.client,
                        instance = old.instance, "replacing the old link of a reconnecting client");
                    old.retire(shared);
                    retired.push(old);
                }
            }
            let rec = LinkRec {
                client: hello.name.clone(),
                instance: hello.instance,
                conns: HashSet::from([id]),
                live: Arc::new(AtomicBool::new(true)),
                busy: Arc::new(AtomicUsize::new(0)),
                paths: Vec::new(),
                fence: fence.clone(),
                orphaned: None,
            };
            let (live, busy) = (rec.live.clone(), rec.busy.clone());
            links.insert(token, rec);
            drop(links);
            // nothing of the old link is applied once the new one exists: wait for requests
            // it was applying (each is bounded by the I/O timeout) before welcoming the new one
            for old in retired {
                if !old.drain(shared.io_timeout) {
                    return refused(
                        &mut sock,
                        &mut out,
                        Status::FAILED,
                        "the previous link is still busy",
                        "the previous link did not drain",
                        io_deadline(),
                    );
                }
            }
            tracing::debug!(parent: &shared.span, client = %hello.name, "link opened");
            (token, live, busy, fence)
        }
        LaneRole::Join => {
            let mut links = lock(&shared.links);
            match links.get_mut(&hello.token) {
                Some(l)
                    if l.instance == hello.instance
                        && l.client == hello.name
                        && l.conns.len() < shared.limits.max_lanes_per_link =>
                {
                    l.conns.insert(id);
                    if l.orphaned.take().is_some() {
                        shared.notifies.link_reopened(hello.token);
                    }
                    (hello.token, l.live.clone(), l.busy.clone(), None)
                }
                Some(l) if l.instance == hello.instance && l.client == hello.name => {
                    drop(links);
                    let why = "too many lanes on this link";
                    return refused(
                        &mut sock,
                        &mut out,
                        Status::RESOURCE_EXHAUSTED,
                        why,
                        why,
                        io_deadline(),
                    );
                }
                _ => {
                    drop(links);
                    return refused(
                        &mut sock,
                        &mut out,
                        Status::NOT_CONNECTED,
                        "unknown link",
                        "join to an unknown link",
                        io_deadline(),
                    );
                }
            }
        }
    };
    *link = Some(token);
    Welcome {
        instance: shared.instance,
        token,
        pid: std::process::id(),
        table: match hello.role {
            LaneRole::NewLink => shared.table.entries(fence.is_some()),
            LaneRole::Join => Vec::new(),
        },
        host: if same_host { shared.host } else { None },
        fence: fence.as_ref().map_or(-1, |f| f.fd()),
    }
    .encode(&mut out);
    if let Err(e) = sock.send_bytes(&out, io_deadline()) {
        return ConnEnd::Io(e);
    }

    // a transport's data path is set up on the lane that opened the link, once (unless the
    // transport allows its request again)
    let mut asked: Vec<Kind> = Vec::new();
    let mut xfer = XferServer::default();
    loop {
        // between requests a connection keeps no more memory than a small one needs
        trim(&mut inb, &mut xfer, &mut out);
        // idle: wait for the next request as long as it takes (shutdown wakes us); once its
        // first byte is in, the whole request has `io_timeout`
        let (frame, deadline) = match read_request(&mut sock, &mut inb, shared.io_timeout) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return ConnEnd::Closed,
            Err(e) => return ConnEnd::Io(e),
            Ok((Err(e), _)) => {
                return violation(&mut sock, &mut out, e, io_deadline());
            }
            Ok((Ok(f), deadline)) => (f, Some(deadline)),
        };
        shared.active.fetch_add(1, Ordering::SeqCst);
        let _guard = ActiveGuard(&shared.active);
        busy.fetch_add(1, Ordering::SeqCst);
        let _busy = ActiveGuard(&busy);
        if !live.load(Ordering::SeqCst) {
            // superseded (or closed) while this request was on its way: apply nothing
            return ConnEnd::Refused("request on a superseded link".into());
        }
        match frame {
            (Kind::Xfer, p) => {
                let x = match xfer.decode(p) {
                    Ok(x) => x,
                    Err(e) => return violation(&mut sock, &mut out, e, deadline),
                };
                let table = &*shared.table;
                match xfer.apply(x, &mut sock, &mut inb, &mut out, deadline, table) {
                    Ok(()) => {}
                    Err(XferEnd::Io(e)) => return ConnEnd::Io(e),
                    Err(XferEnd::Refused(reason)) => return ConnEnd::Refused(reason),
                }
            }
            (Kind::Notify, p) => {
                let (req, name, msg) = match wire::decode_notify(p) {
                    Ok(x) => x,
                    Err(e) => {
                        return violation(&mut sock, &mut out, e, deadline);
                    }
                };
                let from = lock(&shared.links)
                    .get(&token)
                    .map(|l| l.client.clone())
                    .unwrap_or_default();
                match shared.notifies.push(token, Notify { from, name, msg }) {
                    Ok(()) => wire::encode_done(&mut out, req, 0, ""),
                    Err(reason) => {
                        wire::encode_done(&mut out, req, Status::RESOURCE_EXHAUSTED.code(), &reason)
                    }
                }
                if let Err(e) = sock.send_bytes(&out, deadline) {
                    return ConnEnd::Io(e);
                }
            }
            (Kind::Ping, p) => {
                if !p.is_empty() {
                    return violation(&mut sock, &mut out, WireError::Trailing(p.len()), deadline);
                }
                if let Err(e) = sock.send_bytes(&wire::header(Kind::Pong, 0), deadline) {
                    return ConnEnd::Io(e);
                }
            }
            (Kind::Bye, p) => {
                if !p.is_empty() {
                    return ConnEnd::Protocol(WireError::Trailing(p.len()));
                }
                let rec = lock(&shared.links).remove(&token);
                if let Some(rec) = rec {
                    rec.live.store(false, Ordering::SeqCst);
                    let conns = lock(&shared.conns);
                    for c in rec
                        .conns
                        .iter()
                        .filter(|&&c| c != id)
                        .filter_map(|c| conns.get(c))
                    {
                        Sock::shutdown(c);
                    }
                    tracing::debug!(parent: &shared.span, client = %rec.client, "link closed by client");
                    drop(rec);
                    shared.prune_fences();
                }
                out.clear();
                out.extend_from_slice(&wire::header(Kind::ByeAck, 0));
                let _ = sock.send_bytes(&out, deadline);
                return ConnEnd::Bye;
            }
            // a transport's setup request, or a frame no one takes
            (k, p) => {
                let Some(b) = shared.backends.iter().find(|b| b.request_kind() == Some(k)) else {
                    let e = WireError::Unexpected(k);
                    return violation(&mut sock, &mut out, e, deadline);
                };
                let new_link = hello.role == LaneRole::NewLink;
                if !b.repeatable() && (!new_link || asked.contains(&k)) {
                    let e = WireError::Unexpected(k);
                    return violation(&mut sock, &mut out, e, deadline);
                }
                asked.push(k);
                let fenced = lock(&shared.links)
                    .get(&token)
                    .is_some_and(|l| l.fence.is_some());
                let accepted = b.accept(Accept {
                    me: &shared.name,
                    client: &hello.name,
                    payload: p,
                    fenced,
                    on_this_host,
                    send: &mut |f| sock.send_bytes(f, deadline),
                });
                match accepted {
                    Ok(Some(side)) => {
                        let mut links = lock(&shared.links);
                        if let Some(l) = links.get_mut(&token) {
                            l.paths.push(side);
                        }
                    }
                    Ok(None) => {}
                    Err(AcceptFail::Io(e)) => return ConnEnd::Io(e),
                    Err(AcceptFail::Violation(e)) => {
                        return violation(&mut sock, &mut out, e, deadline);
                    }
                }
            }
        }
    }
}
