//! LLM-DataDist's link by an explicit rank table (the Python package's `link(comm_name,
//! {cluster_id: rank}, rank_table)`), HCCL's half, as HIXL's `CommLinkManager` does it: the
//! communicator the caller's rank table describes (`HcclCommInitClusterInfoMemConfig` with
//! the caller's comm name and rank), made ready (`HcclCommPrepare`), then one descriptor
//! swapped with each peer rank (`HcclExchangeMemDesc`). What the descriptors say and what is
//! done with them is the caller's (`datadist`: hixl moves the data over its engine, whose
//! address the descriptors carry, not over this communicator, so no memory is bound to it).
//!
//! HCCL is loaded as the engine loads it (`$HIXL_HCCL_LIB`, else `libhcomm.so`, `libhccl.so`);
//! calls run under whatever ACL context the caller made current (the engine's).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use serde_json::Value;

use super::{Comm, CommConfig, Hccl};
use crate::error::Error;

/// A communicator made from a caller's rank table, for the descriptor rendezvous.
#[derive(Debug)]
pub(crate) struct RankComm {
    hccl: Hccl,
    comm: Comm,
    rank: u32,
    /// Each rank's `server_id`, where the table could be read (HCCL is the judge of the
    /// table: a shape this does not read leaves it `None`).
    ranks: Option<BTreeMap<u32, String>>,
}

impl RankComm {
    /// Loads HCCL, checks that it has `HcclExchangeMemDesc`, and makes the communicator `name`
    /// over `rank_table` (HCCL's rank-table JSON) for `rank`, with the RDMA traffic class and
    /// service level given. Runs under the calling thread's current ACL context, which must
    /// be of the device the table names for `rank`.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] when HCCL does not load or lacks the symbol;
    /// [`Error::InvalidOption`] for a bad name; HCCL's errors ([`Error::Native`],
    /// [`Error::Timeout`]) for a table or rank it refuses.
    pub(crate) fn init(
        rank_table: &str,
        rank: u32,
        name: &str,
        traffic_class: Option<u32>,
        service_level: Option<u32>,
    ) -> Result<Self, Error> {
        let hccl = Hccl::load(None)?;
        hccl.api.exchange()?;
        let cfg = CommConfig {
            comm_name: name.to_owned(),
            traffic_class,
            service_level,
            ..CommConfig::default()
        };
        let comm = hccl.init_comm(rank_table, rank, &cfg)?;
        Ok(Self {
            hccl,
            comm,
            rank,
            ranks: ranks_of(rank_table),
        })
    }

    /// Whether the table lists `rank` (`None`: the table's shape is not one hixl reads).
    pub(crate) fn has_rank(&self, rank: u32) -> Option<bool> {
        self.ranks.as_ref().map(|r| r.contains_key(&rank))
    }

    /// `HcclCommPrepare` (full mesh), up to `timeout` (whole seconds, rounded up).
    ///
    /// # Errors
    /// [`Error::Timeout`] when peers do not come in time; [`Error::Native`].
    pub(crate) fn prepare(&self, timeout: Duration) -> Result<(), Error> {
        self.hccl
            .prepare(&self.comm, timeout, "the rank table's ranks")
    }

    /// Posts `text` for `remote_rank` and returns what that rank posted for this one (`None`:
    /// nothing), waiting up to `timeout` for it.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the rank does not take part in time; [`Error::InvalidOption`]
    /// for a text over 503 bytes; [`Error::Native`].
    pub(crate) fn exchange(
        &self,
        remote_rank: u32,
        text: &str,
        timeout: Duration,
    ) -> Result<Option<String>, Error> {
        let peer = format!("rank {remote_rank}");
        self.hccl
            .exchange_mem_desc(&self.comm, self.rank, remote_rank, text, timeout, &peer)
    }

    /// `HcclCommDestroy`.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn destroy(self) -> Result<(), Error> {
        self.comm.destroy()
    }
}

/// The host address of `rank` in `rank_table`: its server's `server_id` where that is an IP
/// address (HIXL's generators and the downstream connectors write the host's address there),
/// else its server's `host_ip` (version 1.2 tables, as CANN's samples write them, name
/// servers "1", "2", ... and give the address there).
pub(crate) fn rank_server_ip(rank_table: &str, rank: u32) -> Option<IpAddr> {
    if let Some(ip) = ranks_of(rank_table)?
        .get(&rank)
        .and_then(|id| id.parse().ok())
    {
        return Some(ip);
    }
    let v: Value = serde_json::from_str(rank_table).ok()?;
    let server = v.get("server_list")?.as_array()?.iter().find(|s| {
        (s.get("device")
            .and_then(Value::as_array)
            .into_iter()
            .flatten())
        .any(|d| match d.get("rank_id") {
            Some(Value::String(r)) => r.parse() == Ok(rank),
            Some(Value::Number(n)) => n.as_u64() == Some(u64::from(rank)),
            _ => false,
        })
    })?;
    server.get("host_ip")?.as_str()?.parse().ok()
}

/// Each rank's `server_id` (`server_list[].device[].rank_id`, a string or a number), or `None`
/// for JSON not of that shape.
fn ranks_of(rank_table: &str) -> Option<BTreeMap<u32, String>> {
    let v: Value = serde_json::from_str(rank_table).ok()?;
    let mut out = BTreeMap::new();
    for server in v.get("server_list")?.as_array()? {
        let id = server
            .get("server_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        for d in server.get("device")?.as_array()? {
            let rank = match d.get("rank_id")? {
                Value::String(s) => s.parse().ok()?,
                Value::Number(n) => u32::try_from(n.as_u64()?).ok()?,
                _ => return None,
            };
            out.insert(rank, id.to_owned());
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_ids_of_ranks() {
        let t = serde_json::json!({"version": "1.0", "server_count": "2", "status": "completed",
            "server_list": [
                {"server_id": "10.1.0.1", "device": [{"device_id": "0", "device_ip": "1.1.1.1", "rank_id": "0"}]},
                {"server_id": "node-b", "device": [{"device_id": "0", "device_ip": "1.1.1.2", "rank_id": 1}]}]})
        .to_string();
        assert_eq!(rank_server_ip(&t, 0), Some("10.1.0.1".parse().unwrap()));
        assert_eq!(rank_server_ip(&t, 1), None, "not an address");
        assert_eq!(rank_server_ip(&t, 2), None, "no such rank");
        let ranks = ranks_of(&t).unwrap();
        assert_eq!(ranks.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(ranks_of("{}"), None);
        assert_eq!(ranks_of("not json"), None);
        assert_eq!(rank_server_ip("[]", 0), None);
        // version 1.2, as CANN's samples write it: the address is the server's host_ip
        let t = serde_json::json!({"version": "1.2", "server_count": "1", "status": "completed",
            "server_list": [{"server_id": "1", "host_ip": "10.2.0.7", "device": [
                {"device_id": "0", "device_ip": "1.1.1.1", "rank_id": "0"},
                {"device_id": "1", "device_ip": "1.1.1.2", "rank_id": 1}]},
                {"server_id": "2", "host_ip": "not-an-ip", "device": [
                {"device_id": "0", "device_ip": "1.1.1.3", "rank_id": "2"}]}]})
        .to_string();
        assert_eq!(rank_server_ip(&t, 0), Some("10.2.0.7".parse().unwrap()));
        assert_eq!(rank_server_ip(&t, 1), Some("10.2.0.7".parse().unwrap()));
        assert_eq!(rank_server_ip(&t, 2), None, "host_ip not an address");
        assert_eq!(rank_server_ip(&t, 3), None, "no such rank");
    }
}
