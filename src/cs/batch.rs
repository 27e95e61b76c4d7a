//! HIXL-CS batches: PUT (a WRITE) and GET (a READ), sync and async; the address checks every
//! batch passes; completions (at most [`MAX_HANDLES`] unqueried); the latch a failed or
//! timed-out batch sets.

use std::time::Duration;

use super::client::{Client, State};
use super::{CompleteStatus, Completion, Error, MAX_HANDLES, OpDesc, Result};
use crate::{Status, TransferOp};

/// Whether a batch's error of status `s` latches the client: `FAILED` and `TIMEOUT`, as
/// upstream's (a batch call that returned either); not bad arguments, a full completion table,
/// memory the link cannot move (`UNSUPPORTED`, refused before anything moved), nor a code that
/// is no HIXL status.
fn latches(s: Option<Status>) -> bool {
    matches!(s, Some(Status::FAILED | Status::TIMEOUT))
}

impl State {
    /// Latches the client on a failed or timed-out batch ([`latches`]).
    fn after<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r
            && latches(e.status())
        {
            self.latched = true;
        }
        r
    }

    /// A batch may start: not latched, and each descriptor's local range inside one registered
    /// client range and its remote range inside one imported server range.
    fn admit(&self, descs: &[OpDesc]) -> Result<()> {
        if self.latched {
            return Err(Error::failed(
                "an earlier batch failed or timed out: destroy the client and create it again",
            ));
        }
        for (i, d) in descs.iter().enumerate() {
            let (local, remote) = (d.local_addr, d.remote_addr);
            let len = usize::try_from(d.len)
                .map_err(|_| Error::invalid(format!("desc {i}: len overflows")))?;
            if len == 0 {
                return Err(Error::invalid(format!("desc {i}: len is 0")));
            }
            let in_local = local.checked_add(len).is_some_and(|end| {
                (self.mems.range(..=local).next_back()).is_some_and(|(&a, m)| end <= a + m.len)
            });
            if !in_local {
                return Err(Error::invalid(format!(
                    "desc {i}: local {local:#x}+{len} is not inside one range registered with \
                     HixlCSClientRegMem"
                )));
            }
            let in_remote = remote.checked_add(d.len).is_some_and(|end| {
                (self.remote_mems.range(..=remote).next_back()).is_some_and(|(_, &e)| end <= e)
            });
            if !in_remote {
                return Err(Error::invalid(format!(
                    "desc {i}: remote {remote:#x}+{len} is not inside one range of the server's \
                     memory list{}",
                    if self.connected {
                        ""
                    } else {
                        " (not connected)"
                    }
                )));
            }
        }
        Ok(())
    }
}

/// `PARAM_INVALID` for a batch of no descriptor.
fn not_empty(descs: &[OpDesc]) -> Result<()> {
    if descs.is_empty() {
        return Err(Error::invalid("list_num is 0: a batch of no descriptor"));
    }
    Ok(())
}

impl Client {
    /// A batch, waited for within `timeout` (`HixlCSClientBatchPutSync` for
    /// [`TransferOp::Write`], `HixlCSClientBatchGetSync` for [`TransferOp::Read`]).
    ///
    /// # Errors
    /// `PARAM_INVALID` before anything moves: no descriptor, a length 0, a local range not
    /// inside one registration, a remote range not inside one range of the imported list;
    /// `TIMEOUT` (a zero `timeout` at once); `FAILED` for a latched client (the error of a
    /// batch that failed or timed out latches it) and once closed; the engine's errors.
    pub fn batch_sync(&self, op: TransferOp, descs: &[OpDesc], timeout: Duration) -> Result<()> {
        not_empty(descs)?;
        let mut st = self.state()?;
        st.admit(descs)?;
        if timeout.is_zero() {
            return st.after(Err(Error::timeout("timeout_ms is 0")));
        }
        let r = st.engine.transfer_sync(&st.remote, op, descs, timeout);
        st.after(r)
    }

    /// A batch, started (`HixlCSClientBatchPutAsync` for [`TransferOp::Write`],
    /// `HixlCSClientBatchGetAsync` for [`TransferOp::Read`]): its completion, for
    /// [`Client::query`].
    ///
    /// # Errors
    /// As [`Client::batch_sync`]; `RESOURCE_EXHAUSTED` while [`MAX_HANDLES`] completions are
    /// not yet reported COMPLETED or FAILED.
    pub fn batch_async(&self, op: TransferOp, descs: &[OpDesc]) -> Result<Completion> {
        not_empty(descs)?;
        let mut st = self.state()?;
        st.admit(descs)?;
        if st.handles.len() >= MAX_HANDLES {
            return Err(Error::exhausted(format!(
                "{MAX_HANDLES} async batches are not yet reported COMPLETED or FAILED"
            )));
        }
        let r = st.engine.transfer_async(&st.remote, op, descs);
        let req = st.after(r)?;
        let c = Completion::next();
        st.handles.insert(c, req);
        Ok(c)
    }

    /// The state of an async batch (`HixlCSClientQueryCompleteStatus`): COMPLETED and FAILED
    /// free the completion; a batch that failed or timed out latches the client, as a sync
    /// batch's `FAILED` or `TIMEOUT` does; one the server refused (a range it no longer
    /// serves: `PARAM_INVALID`) does not, as the same sync batch does not.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a completion that is not one of this client's (never issued, or
    /// already reported COMPLETED or FAILED); `FAILED` once closed.
    pub fn query(&self, c: Completion) -> Result<CompleteStatus> {
        let mut st = self.state()?;
        let Some(req) = st.handles.get(&c).cloned() else {
            return Err(Error::invalid(format!(
                "{:#x} is not a live completion of this client (never issued, or already \
                 reported COMPLETED or FAILED)",
                c.into_raw()
            )));
        };
        let (s, code) = st.engine.status(&req);
        if s != CompleteStatus::Waiting {
            st.handles.remove(&c);
        }
        if s == CompleteStatus::Failed && latches(code) {
            st.latched = true;
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failed_and_timeout_latch() {
        for (s, latched) in [
            (Status::FAILED, true),
            (Status::TIMEOUT, true),
            (Status::PARAM_INVALID, false),
            (Status::RESOURCE_EXHAUSTED, false),
            (Status::UNSUPPORTED, false),
            // (the engine's connection statuses reach a batch as FAILED: engine.rs `fail`)
            (Status::NOT_CONNECTED, false),
            (Status::ALREADY_CONNECTED, false),
            (Status::NOTIFY_FAILED, false),
            (Status::SUCCESS, false),
        ] {
            assert_eq!(latches(Some(s)), latched, "{s:?}");
        }
        // ACL's own code (107002): no HIXL status
        assert!(!latches(Status::from_code(107_002)));
    }
}
