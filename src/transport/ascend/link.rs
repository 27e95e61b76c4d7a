//! The device data path of a link between two Ascend engines, as HIXL's default engine builds
//! it: the handshake exchanges each side's device (DEVICE_HELLO / DEVICE_WELCOME), both build
//! the same two-rank HCCL 1.0 rank table (rank 0: the serving engine, rank 1: the client),
//! `HcclCommInitClusterInfoMemConfig`, `HcclCommBindMem` for every region, `HcclCommPrepare`;
//! then transfers are `HcclBatchPut`/`HcclBatchGet` on the link's stream (at most 256
//! descriptors per call) and `aclrtSynchronizeStreamWithTimeout`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::Runtime;
use super::acl::Stream;
use super::hccl::{Comm, Direction, OneSideDesc};
use crate::error::{Error, Status};
use crate::memory::{Access, RegionCore};
use crate::transfer::TransferOp;
use crate::transport::tcp::{Lane, LaneFail, Xd};
use crate::wire::{DeviceInfo, Kind, TableEntry};

/// The server's rank in a link's communicator.
pub(crate) const SERVER_RANK: u32 = 0;
/// The client's rank.
pub(crate) const CLIENT_RANK: u32 = 1;
/// How long dropping a link whose last transfer failed waits for its stream to drain before it
/// gives up and leaks the link's memory instead of freeing it under a running copy.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// One side of a link's device data path: the communicator (with this engine's regions bound),
/// the stream, and the peer's rank. Unbinds and destroys everything when dropped.
pub(crate) struct DeviceLink {
    rt: Arc<Runtime>,
    bound: Vec<Arc<RegionCore>>,
    comm: Option<Comm>,
    stream: Option<Stream>,
    remote_rank: u32,
    peer: String,
    /// Peer region id → its start address (client side).
    remote: HashMap<u32, u64>,
    /// Set when a transfer failed: copies may still be queued on the stream (a stream-sync
    /// timeout does not cancel them), so dropping must drain it before anything is released.
    dirty: AtomicBool,
}

impl std::fmt::Debug for DeviceLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceLink")
            .field("peer", &self.peer)
            .field("remote_rank", &self.remote_rank)
            .field("bound", &self.bound.len())
            .finish()
    }
}

impl Drop for DeviceLink {
    fn drop(&mut self) {
        let guard = self.rt.enter();
        // A failed transfer may have left copies queued on the stream (a stream-sync timeout
        // does not cancel them): they read or write the bound regions, which must not be
        // unbound, deregistered or freed under them. Drain first; if the stream will not
        // drain, leak the communicator, the stream and the regions' memory rather than free
        // memory the device may still write.
        if self.dirty.load(Ordering::SeqCst)
            && let Some(s) = &self.stream
            && let Err(e) = self
                .rt
                .acl
                .synchronize(s, DRAIN_TIMEOUT, "disconnect", &self.peer)
        {
            tracing::error!(
                peer = %self.peer,
                "the device stream did not drain after a failed transfer ({e}); leaking the \
                 link's communicator, stream and {} regions",
                self.bound.len()
            );
            std::mem::forget(self.comm.take());
            std::mem::forget(self.stream.take());
            std::mem::forget(std::mem::take(&mut self.bound));
            drop(guard);
            return;
        }
        if let Some(comm) = self.comm.take() {
            for r in &self.bound {
                if let Some(d) = &r.device
                    && let Err(e) = self.rt.hccl.unbind(&comm, &d.mem)
                {
                    tracing::warn!("HcclCommUnbindMem failed: {e}");
                }
            }
            if let Err(e) = comm.destroy() {
                tracing::warn!("HcclCommDestroy failed: {e}");
            }
        }
        if let Some(s) = self.stream.take()
            && let Err(e) = self.rt.acl.destroy_stream(s)
        {
            tracing::warn!("aclrtDestroyStream failed: {e}");
        }
        drop(guard);
    }
}

fn ip_of_name(name: &str) -> String {
    crate::engine::EngineName::parse(name)
        .map(|n| n.ip.to_string())
        .unwrap_or_else(|_| "0.0.0.0".into())
}

/// A rank's device, as the rank table lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankDev {
    pub(crate) device_id: u32,
    pub(crate) device_ip: IpAddr,
    pub(crate) host_ip: IpAddr,
}

/// The HCCL rank table (version "1.0", as HIXL's `RankTableGeneratorV1` writes it) of a link:
/// rank 0 is the server's device, rank 1 the client's; one `server_list` entry per host.
pub(crate) fn rank_table(server: &RankDev, client: &RankDev) -> String {
    let dev = |d: &RankDev, rank: u32| {
        format!(
            r#"{{"device_id":"{}","device_ip":"{}","rank_id":"{rank}"}}"#,
            d.device_id, d.device_ip
        )
    };
    let servers = if server.host_ip == client.host_ip {
        vec![format!(
            r#"{{"server_id":"{}","device":[{},{}]}}"#,
            server.host_ip,
            dev(server, SERVER_RANK),
            dev(client, CLIENT_RANK)
        )]
    } else {
        vec![
            format!(
                r#"{{"server_id":"{}","device":[{}]}}"#,
                server.host_ip,
                dev(server, SERVER_RANK)
            ),
            format!(
                r#"{{"server_id":"{}","device":[{}]}}"#,
                client.host_ip,
                dev(client, CLIENT_RANK)
            ),
        ]
    };
    format!(
        r#"{{"version":"1.0","server_count":"{}","server_list":[{}],"status":"completed"}}"#,
        servers.len(),
        servers.join(",")
    )
}

/// HIXL's communicator name, `hixl_<client>_<server>`, cut to 127 bytes, without NUL.
fn comm_name(client: &str, server: &str) -> String {
    let mut s: String = format!("hixl_{client}_{server}")
        .chars()
        .filter(|c| *c != '\0')
        .collect();
    while s.len() > 127 {
        s.pop();
    }
    s
}

fn parse_dev(info: &DeviceInfo) -> Result<RankDev, &'static str> {
    Ok(RankDev {
        device_id: info.device_id,
        device_ip: info.device_ip.parse().map_err(|_| "a device IP address")?,
        host_ip: info.host_ip.parse().map_err(|_| "a host IP address")?,
    })
}

fn my_info(rt: &Runtime, name: &str, timeout: Duration) -> DeviceInfo {
    DeviceInfo {
        status: 0,
        device_id: rt.device_id,
        device_ip: rt.device_ip.to_string(),
        host_ip: ip_of_name(name),
        timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
        reason: String::new(),
    }
}

/// Builds this side's communicator: init from the rank table, bind every region, prepare.
#[allow(clippy::too_many_arguments)]
fn build(
    rt: &Arc<Runtime>,
    table: &str,
    rank: u32,
    name: String,
    regions: &[Arc<RegionCore>],
    peer: &str,
    timeout: Duration,
    remote: HashMap<u32, u64>,
) -> Result<DeviceLink, Error> {
    let _guard = rt.enter()?;
    let cfg = super::hccl::CommConfig {
        comm_name: name,
        ..rt.comm.clone()
    };
    let comm = rt.hccl.init_comm(table, rank, &cfg)?;
    let mut link = DeviceLink {
        rt: rt.clone(),
        bound: Vec::with_capacity(regions.len()),
        comm: None,
        stream: None,
        remote_rank: if rank == SERVER_RANK {
            CLIENT_RANK
        } else {
            SERVER_RANK
        },
        peer: peer.to_owned(),
        remote,
        dirty: AtomicBool::new(false),
    };
    // from here on, dropping `link` unbinds and destroys
    link.comm = Some(comm);
    let comm = link.comm.as_ref().expect("just set");
    for r in regions {
        if let Some(d) = &r.device {
            rt.hccl.bind(comm, &d.mem)?;
            link.bound.push(r.clone());
        }
    }
    rt.hccl.prepare(comm, timeout, peer)?;
    link.stream = Some(rt.acl.create_stream()?);
    Ok(link)
}

/// Client side, on a new link's first lane right after WELCOME: sets up the device data path
/// with the server. `Ok(None)` when the server has no Ascend runtime (the link stays on TCP or
/// the same-host path).
///
/// # Errors
/// Lane failures through `lane_err`; HCCL/ACL errors; the server's failure as [`Error::Refused`]
/// (via `lane_err`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect(
    rt: &Arc<Runtime>,
    lane: &mut Lane,
    regions: &[Arc<RegionCore>],
    table: &[TableEntry],
    me: &str,
    peer: &str,
    deadline: Instant,
    lane_err: impl Fn(LaneFail) -> Error,
) -> Result<Option<DeviceLink>, Error> {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut out = Vec::new();
    my_info(rt, me, left).encode(Kind::DeviceHello, &mut out);
    lane.send_frame(&out, deadline).map_err(&lane_err)?;
    let theirs = lane
        .recv_frame(Kind::DeviceWelcome, deadline, DeviceInfo::decode)
        .map_err(&lane_err)?
        .map_err(|e| lane_err(LaneFail::Protocol(e.to_string())))?;
    if theirs.status != 0 {
        tracing::debug!(peer, reason = %theirs.reason, "the peer has no device data path");
        return Ok(None);
    }
    let server = parse_dev(&theirs)
        .map_err(|what| lane_err(LaneFail::Protocol(format!("DEVICE_WELCOME without {what}"))))?;
    let client = RankDev {
        device_id: rt.device_id,
        device_ip: rt.device_ip,
        host_ip: ip_of_name(me).parse().unwrap_or(IpAddr::from([0, 0, 0, 0])),
    };
    let remote = table.iter().map(|e| (e.id, e.addr)).collect();
    let left = deadline.saturating_duration_since(Instant::now());
    let link = build(
        rt,
        &rank_table(&server, &client),
        CLIENT_RANK,
        comm_name(me, peer),
        regions,
        peer,
        left,
        remote,
    )?;
    // the server reports its own side with DONE for request 0
    let wait = deadline.max(Instant::now() + Duration::from_millis(100));
    let (status, reason) = lane.read_done_for(0, wait).map_err(&lane_err)?;
    if status != 0 {
        return Err(lane_err(LaneFail::Refused {
            status: Status::from_code(status).unwrap_or(Status::FAILED),
            reason,
            usable: false,
        }));
    }
    Ok(Some(link))
}

/// Server side of DEVICE_HELLO: answers with DEVICE_WELCOME, builds its side, and reports the
/// outcome with DONE (request 0). `send` writes a frame to the client.
///
/// # Errors
/// Only I/O errors from `send`; device failures are reported to the client.
pub(crate) fn serve(
    rt: Option<&Arc<Runtime>>,
    hello: &DeviceInfo,
    regions: &[Arc<RegionCore>],
    me: &str,
    client_name: &str,
    mut send: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<Option<DeviceLink>> {
    let mut out = Vec::new();
    let refuse = |status: Status, reason: &str, out: &mut Vec<u8>| {
        DeviceInfo {
            status: status.code(),
            device_id: 0,
            device_ip: String::new(),
            host_ip: String::new(),
            timeout_ms: 0,
            reason: reason.to_owned(),
        }
        .encode(Kind::DeviceWelcome, out);
    };
    let Some(rt) = rt else {
        refuse(
            Status::UNSUPPORTED,
            "this engine has no Ascend runtime",
            &mut out,
        );
        send(&out)?;
        return Ok(None);
    };
    let client = match parse_dev(hello) {
        Ok(c) if hello.status == 0 => c,
        Ok(_) => {
            refuse(
                Status::PARAM_INVALID,
                "DEVICE_HELLO with a status",
                &mut out,
            );
            send(&out)?;
            return Ok(None);
        }
        Err(what) => {
            refuse(
                Status::PARAM_INVALID,
                &format!("DEVICE_HELLO without {what}"),
                &mut out,
            );
            send(&out)?;
            return Ok(None);
        }
    };
    // at most a minute: the client's connect timeout bounds the wait, capped against abuse
    let timeout = Duration::from_millis(u64::from(hello.timeout_ms).clamp(1, 60_000));
    my_info(rt, me, timeout).encode(Kind::DeviceWelcome, &mut out);
    send(&out)?;
    let server = RankDev {
        device_id: rt.device_id,
        device_ip: rt.device_ip,
        host_ip: ip_of_name(me).parse().unwrap_or(IpAddr::from([0, 0, 0, 0])),
    };
    // regions peers may neither read nor write are not exposed through the communicator
    let served: Vec<Arc<RegionCore>> = regions
        .iter()
        .filter(|r| r.access != Access::None)
        .cloned()
        .collect();
    let r = build(
        rt,
        &rank_table(&server, &client),
        SERVER_RANK,
        comm_name(client_name, me),
        &served,
        client_name,
        timeout,
        HashMap::new(),
    );
    out.clear();
    match r {
        Ok(link) => {
            crate::wire::encode_done(&mut out, 0, 0, "");
            send(&out)?;
            Ok(Some(link))
        }
        Err(e) => {
            crate::wire::encode_done(&mut out, 0, e.status().code(), &e.to_string());
            send(&out)?;
            Ok(None)
        }
    }
}

impl DeviceLink {
    /// Moves `xds` (local addresses inside this engine's bound regions, peer ranges validated
    /// against its table) with HCCL, within `timeout`.
    ///
    /// # Safety
    /// Every local range lies in a region of this engine that stays registered and alive for
    /// the call; for READ, no Rust reference to a local range is live.
    ///
    /// # Errors
    /// [`Error::RemoteNotRegistered`] for a region the peer's table lacks; what
    /// [`Hccl::transfer`](super::hccl::Hccl::transfer) returns.
    pub(crate) unsafe fn transfer(
        &self,
        op: TransferOp,
        xds: &[Xd],
        timeout: Duration,
    ) -> Result<(), Error> {
        let (Some(comm), Some(stream)) = (&self.comm, &self.stream) else {
            return Err(Error::NotConnected {
                peer: self.peer.clone(),
                why: "the device data path is closed".into(),
            });
        };
        let mut descs = Vec::with_capacity(xds.len());
        for d in xds {
            let Some(base) = self.remote.get(&d.remote.region) else {
                return Err(Error::RemoteNotRegistered {
                    peer: self.peer.clone(),
                    addr: d.remote.offset,
                    len: d.remote.len,
                });
            };
            descs.push(OneSideDesc {
                local: d.local as u64,
                remote: base + d.remote.offset,
                len: d.remote.len,
            });
        }
        let dir = match op {
            TransferOp::Write => Direction::Put,
            TransferOp::Read => Direction::Get,
        };
        // SAFETY: forwarded from the caller; the regions are bound to `comm` (every region of
        // the engine was bound when the link was built).
        let r = unsafe {
            self.rt.hccl.transfer(
                &self.rt.acl,
                comm,
                self.remote_rank,
                dir,
                &descs,
                stream,
                timeout,
                &self.peer,
            )
        };
        if r.is_err() {
            // copies may still be queued (a stream-sync timeout does not cancel them): give the
            // stream a bounded chance to drain now, so that when this call returns the device no
            // longer touches the caller's buffers; if it will not drain, the link stays dirty
            // and its drop keeps the regions (and leaks them rather than free them under a copy)
            let drained = self
                .rt
                .acl
                .synchronize(
                    stream,
                    DRAIN_TIMEOUT,
                    "drain after a failed transfer",
                    &self.peer,
                )
                .is_ok();
            if !drained {
                tracing::error!(peer = %self.peer,
                    "the device stream did not drain after a failed transfer; its buffers may still be written");
                self.dirty.store(true, Ordering::SeqCst);
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_tables_follow_hccl_v1() {
        let s = RankDev {
            device_id: 0,
            device_ip: "192.168.1.8".parse().unwrap(),
            host_ip: "10.0.0.1".parse().unwrap(),
        };
        let mut c = RankDev {
            device_id: 3,
            device_ip: "192.168.1.9".parse().unwrap(),
            host_ip: "10.0.0.1".parse().unwrap(),
        };
        assert_eq!(
            rank_table(&s, &c),
            r#"{"version":"1.0","server_count":"1","server_list":[{"server_id":"10.0.0.1","device":[{"device_id":"0","device_ip":"192.168.1.8","rank_id":"0"},{"device_id":"3","device_ip":"192.168.1.9","rank_id":"1"}]}],"status":"completed"}"#
        );
        c.host_ip = "10.0.0.2".parse().unwrap();
        let t = rank_table(&s, &c);
        assert!(t.contains(r#""server_count":"2""#), "{t}");
        assert!(t.contains(r#"{"server_id":"10.0.0.2","device":[{"device_id":"3","device_ip":"192.168.1.9","rank_id":"1"}]}"#), "{t}");
        super::super::options::parse_json(&t).expect("well-formed JSON");
        assert_eq!(comm_name("a", "b"), "hixl_a_b");
        assert_eq!(comm_name(&"x".repeat(300), "b").len(), 127);
        assert_eq!(comm_name("a\0", "b"), "hixl_a_b");
    }

    #[test]
    fn peer_strings_never_reach_the_rank_table_unparsed() {
        let ok = DeviceInfo {
            status: 0,
            device_id: 1,
            device_ip: "192.168.1.9".into(),
            host_ip: "::1".into(),
            timeout_ms: 1,
            reason: String::new(),
        };
        assert!(parse_dev(&ok).is_ok());
        for inject in [
            r#"1.2.3.4","rank_id":"0"#,
            "1.2.3.4 ",
            "fe80::1%eth0",
            "",
            "../../etc/passwd",
        ] {
            let mut d = ok.clone();
            d.device_ip = inject.into();
            assert!(parse_dev(&d).is_err(), "device ip {inject:?}");
            let mut d = ok.clone();
            d.host_ip = inject.into();
            assert!(parse_dev(&d).is_err(), "host ip {inject:?}");
        }
    }
}
