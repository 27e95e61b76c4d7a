//! The WELCOME frame: the server's acceptance and its region table, checked on decode (ranges
//! non-empty and disjoint, ids unique).

use super::codec::{check_unique_ids, put_host};
use super::{ENTRY_LEN, HostId, Kind, MAX_TABLE, Reader, WireError, begin, seal};
use crate::types::{Access, MemType};

/// One entry of a region table, as a peer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableEntry {
    /// Region id.
    pub id: u32,
    /// Start address in the owner's address space.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Memory type.
    pub mem_type: MemType,
    /// Remote access rights.
    pub access: Access,
    /// The owner's descriptor of the sealed memfd behind the region, for same-host peers
    /// (`-1`: none, or not offered to this peer).
    pub fd: i32,
}

/// [`TableEntry::fd`] of a region same-host peers must reach over TCP (no one-sided access).
pub const FD_TCP_ONLY: i32 = -2;

/// Server → client acceptance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    /// The server engine's per-process instance id.
    pub instance: u64,
    /// The link token, for joining more lanes and for BYE.
    pub token: u64,
    /// The server's process id (informational; used by same-host transports).
    pub pid: u32,
    /// The server's region table (empty for joined lanes).
    pub table: Vec<TableEntry>,
    /// The server process, for same-host transfers (`None` if it does not offer them).
    pub host: Option<HostId>,
    /// The server's descriptor of this link's fence page (same-host one-sided access it can
    /// revoke), or `-1`.
    pub fence: i32,
    /// Only when the HELLO asked for it ([`ASKS_SERVER_PROOF`](super::ASKS_SERVER_PROOF)): the
    /// server's descriptor of this very connection (`-1` when it offers no same-host access),
    /// which a client on its host takes from the process [`host`](Self::host) names to check
    /// that this process holds the other end of the connection before it trusts anything
    /// same-host of the WELCOME. `None`: the field is absent (an engine that does not know the
    /// flag; encoded as before).
    pub lane_fd: Option<i32>,
}

impl Welcome {
    /// Encodes the frame into `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        begin(out, Kind::Welcome);
        out.extend_from_slice(&self.instance.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&(self.table.len() as u32).to_le_bytes());
        for e in &self.table {
            out.extend_from_slice(&e.id.to_le_bytes());
            out.extend_from_slice(&e.addr.to_le_bytes());
            out.extend_from_slice(&e.len.to_le_bytes());
            out.push(e.mem_type as u8);
            out.push(e.access as u8);
            out.extend_from_slice(&e.fd.to_le_bytes());
        }
        put_host(out, &self.host);
        out.extend_from_slice(&self.fence.to_le_bytes());
        if let Some(fd) = self.lane_fd {
            out.extend_from_slice(&fd.to_le_bytes());
        }
        seal(out);
    }
    /// Decodes a WELCOME payload and checks the table: lengths non-zero, no overflow, ids unique,
    /// ranges sorted by address and disjoint.
    ///
    /// # Errors
    /// A [`WireError`] if the payload or the table is malformed.
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        let instance = r.u64("instance")?;
        let token = r.u64("token")?;
        let pid = r.u32("pid")?;
        let n = r.count("region count", MAX_TABLE, ENTRY_LEN)?;
        let mut table = Vec::with_capacity(n);
        for _ in 0..n {
            let id = r.u32("region id")?;
            let addr = r.u64("region addr")?;
            let len = r.u64("region len")?;
            let mem_type =
                MemType::from_u8(r.u8("mem type")?).ok_or(WireError::Invalid("mem type"))?;
            let access = Access::from_u8(r.u8("access")?).ok_or(WireError::Invalid("access"))?;
            let fd = r.u32("region fd")? as i32;
            if len == 0 || addr.checked_add(len).is_none() {
                return Err(WireError::Invalid("region range"));
            }
            table.push(TableEntry {
                id,
                addr,
                len,
                mem_type,
                access,
                fd,
            });
        }
        let host = r.host()?;
        let fence = r.u32("fence fd")? as i32;
        let lane_fd = if r.has_more() {
            Some(r.u32("lane fd")? as i32)
        } else {
            None
        };
        r.finish()?;
        check_unique_ids(table.iter().map(|e| e.id))?;
        table.sort_by_key(|e| e.addr);
        if table.windows(2).any(|w| w[0].addr + w[0].len > w[1].addr) {
            return Err(WireError::Invalid("overlapping regions"));
        }
        Ok(Welcome {
            instance,
            token,
            pid,
            table,
            host,
            fence,
            lane_fd,
        })
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::payload;

    #[test]
    fn welcome_checks_the_table() {
        let e = |id, addr, len| TableEntry {
            id,
            addr,
            len,
            mem_type: MemType::Host,
            access: Access::ReadWrite,
            fd: -1,
        };
        let w = Welcome {
            instance: 1,
            token: 2,
            pid: 3,
            table: vec![e(0, 4096, 100), e(1, 8192, 10)],
            host: None,
            fence: 7,
            lane_fd: None,
        };
        let mut out = Vec::new();
        w.encode(&mut out);
        assert_eq!(Welcome::decode(payload(&out).1).unwrap(), w);
        // with the server's proof of its process (asked for), and without it (as before)
        for fd in [Some(9), Some(-1)] {
            let asked = Welcome {
                lane_fd: fd,
                ..w.clone()
            };
            let mut with = Vec::new();
            asked.encode(&mut with);
            assert_eq!(with.len(), out.len() + 4);
            assert_eq!(Welcome::decode(payload(&with).1).unwrap(), asked);
        }
        for (bad, why) in [
            (vec![e(0, 4096, 100), e(1, 4100, 10)], "overlapping regions"),
            (vec![e(0, 4096, 100), e(0, 9000, 10)], "duplicate region id"),
            (vec![e(0, 4096, 0)], "region range"),
            (vec![e(0, u64::MAX, 2)], "region range"),
        ] {
            let mut out = Vec::new();
            Welcome {
                table: bad,
                ..w.clone()
            }
            .encode(&mut out);
            assert_eq!(
                Welcome::decode(payload(&out).1),
                Err(WireError::Invalid(why))
            );
        }
    }
}
