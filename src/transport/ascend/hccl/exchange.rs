//! `HcclExchangeMemDesc`: one descriptor swapped with a remote rank of a communicator, the
//! rendezvous of LLM-DataDist's explicit-rank-table link (HIXL's `CommLinkManager::ExchangeMem`
//! posts one NUL-terminated JSON text per peer and reads the peer's).

use std::ffi::c_char;
use std::time::{Duration, Instant};

use super::sys::{self as ffi, HcclMemDesc, HcclMemDescs};
use super::{Comm, Hccl, check};
use crate::error::Error;

/// Most bytes of text one descriptor carries (the 504-byte field less its NUL).
pub(crate) const MAX_DESC_TEXT: usize = ffi::HCCL_MEM_DESC_TEXT - 1;

impl Hccl {
    /// Posts `text` for `remote_rank` of `comm` (this process being `local_rank`) and returns
    /// the text that rank posted for this one, or `None` when it posted nothing (hcomm answers
    /// the own rank so). Blocks until the remote rank takes part, up to `timeout` rounded up
    /// to whole seconds (HCCL's unit).
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] when HCCL has no `HcclExchangeMemDesc`;
    /// [`Error::InvalidOption`] for a text over [`MAX_DESC_TEXT`] bytes or containing NUL;
    /// [`Error::Timeout`] (`op: "connect"`, `peer`) for `HCCL_E_TIMEOUT`; [`Error::Native`].
    pub(crate) fn exchange_mem_desc(
        &self,
        comm: &Comm,
        local_rank: u32,
        remote_rank: u32,
        text: &str,
        timeout: Duration,
        peer: &str,
    ) -> Result<Option<String>, Error> {
        let f = self.api.exchange()?.exchange_mem_desc;
        let bytes = text.as_bytes();
        if bytes.len() > MAX_DESC_TEXT || bytes.contains(&0) {
            return Err(Error::InvalidOption {
                key: "HcclMemDesc".into(),
                value: text.to_owned(),
                problem: "at most 503 bytes of text, without NUL",
            });
        }
        let mut local = HcclMemDesc {
            local_rank,
            remote_rank,
            desc: [0; ffi::HCCL_MEM_DESC_TEXT],
        };
        for (d, s) in local.desc.iter_mut().zip(bytes) {
            *d = *s as c_char;
        }
        let mut remote = HcclMemDesc {
            local_rank: 0,
            remote_rank: 0,
            desc: [0; ffi::HCCL_MEM_DESC_TEXT],
        };
        let mut locals = HcclMemDescs {
            array: &mut local,
            array_length: 1,
        };
        let mut remotes = HcclMemDescs {
            array: &mut remote,
            array_length: 1,
        };
        let secs = i32::try_from(timeout.as_millis().div_ceil(1000).max(1)).unwrap_or(i32::MAX);
        let mut got: u32 = 0;
        let start = Instant::now();
        // SAFETY: the communicator is alive (borrowed); both arrays hold one initialised
        // descriptor and outlive the call, `got` is writable; HCCL writes at most
        // `remotes.array_length` descriptors.
        let rc = unsafe {
            f(
                comm.as_raw(),
                remote_rank,
                &mut locals,
                secs,
                &mut remotes,
                &mut got,
            )
        };
        check("HcclExchangeMemDesc", rc, "connect", peer, start)?;
        if got == 0 {
            return Ok(None);
        }
        let n = remote
            .desc
            .iter()
            .position(|c| *c == 0)
            .unwrap_or(ffi::HCCL_MEM_DESC_TEXT);
        let text: Vec<u8> = remote.desc[..n].iter().map(|c| *c as u8).collect();
        Ok(Some(String::from_utf8_lossy(&text).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::device::acl::tests::Fixture;
    use crate::transport::ascend::hccl::CommConfig;

    fn table() -> String {
        serde_json::json!({"version": "1.0", "server_count": "1", "status": "completed",
            "server_list": [{"server_id": "10.0.0.1", "device": [
                {"device_id": "10", "device_ip": "192.168.101.1", "rank_id": "0"},
                {"device_id": "10", "device_ip": "192.168.101.2", "rank_id": "1"}]}]})
        .to_string()
    }

    /// Two ranks of one comm (in one process: two processes to the double) swap texts; the
    /// own rank answers nothing; a rank that never takes part times out; a text too long is
    /// refused before HCCL is called.
    #[test]
    fn two_ranks_swap_descriptors() {
        let f = Fixture::on_device("exchange");
        let hccl = Hccl::load(Some(&f.so)).unwrap();
        let name = format!("dd_exchange_{}", std::process::id());
        let cfg = CommConfig {
            comm_name: name,
            ..CommConfig::default()
        };
        let t = table();
        let c0 = hccl.init_comm(&t, 0, &cfg).unwrap();
        let c1 = hccl.init_comm(&t, 1, &cfg).unwrap();
        let h1 = hccl.clone();
        let other = std::thread::spawn(move || {
            let got = h1
                .exchange_mem_desc(&c1, 1, 0, "{\"from\":1}", Duration::from_secs(10), "r0")
                .unwrap();
            (got, c1)
        });
        let got = hccl
            .exchange_mem_desc(&c0, 0, 1, "{\"from\":0}", Duration::from_secs(10), "r1")
            .unwrap();
        let (got1, c1) = other.join().unwrap();
        assert_eq!(got.as_deref(), Some("{\"from\":1}"));
        assert_eq!(got1.as_deref(), Some("{\"from\":0}"));
        // the own rank: success, nothing exchanged (hcomm's answer)
        assert_eq!(
            hccl.exchange_mem_desc(&c0, 0, 0, "x", Duration::from_secs(1), "me")
                .unwrap(),
            None
        );
        // rank 1 does not take part again: rank 0 waits its timeout (1 s) and no more
        let start = std::time::Instant::now();
        let e = hccl
            .exchange_mem_desc(&c0, 0, 1, "again", Duration::from_millis(300), "r1")
            .unwrap_err();
        assert!(matches!(e, Error::Timeout { op: "connect", .. }), "{e:?}");
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(990) && waited < Duration::from_secs(8),
            "{waited:?}"
        );
        let long = "x".repeat(MAX_DESC_TEXT + 1);
        let e = hccl
            .exchange_mem_desc(&c0, 0, 1, &long, Duration::from_secs(1), "r1")
            .unwrap_err();
        assert!(matches!(e, Error::InvalidOption { .. }), "{e:?}");
        let log = f.log_lines();
        assert!(
            log.iter().any(|l| l.starts_with("HcclExchangeMemDesc ")
                && l.contains("rank=0 remote=1 num=1 got=1 timeout=10 rc=0")),
            "{log:#?}"
        );
        assert!(log.iter().any(|l| l.contains("self=1 rc=0")), "{log:#?}");
        c0.destroy().unwrap();
        c1.destroy().unwrap();
    }
}
