//! ACL streams: [`Stream`] (destroyed under its context), and the calls on one: create,
//! destroy, synchronise with a timeout, abort.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::{Acl, Context, timeout_ms};
use crate::device::sys::acl as sys;
use crate::error::Error;

/// An `aclrtStream`, destroyed on drop under the context it was created in.
#[derive(Debug)]
pub(crate) struct Stream {
    acl: Acl,
    raw: NonNull<c_void>,
    ctx: Option<Context>,
}

// SAFETY: a stream handle may be used from any thread that has its context current (the calls
// switch to it); it is not shared (`!Sync`), so calls on one stream are not concurrent.
unsafe impl Send for Stream {}

impl Stream {
    /// The raw `aclrtStream`.
    pub(crate) fn as_raw(&self) -> *mut c_void {
        self.raw.as_ptr()
    }
    /// The context it belongs to.
    pub(crate) fn context(&self) -> Option<Context> {
        self.ctx
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _guard = self.ctx.and_then(|c| self.acl.enter(c).ok());
        let api = &self.acl.api;
        // SAFETY: the stream came from aclrtCreateStream and is destroyed once.
        let rc = unsafe { (api.destroy_stream)(self.raw.as_ptr()) };
        if rc != sys::ACL_SUCCESS {
            tracing::warn!(
                "aclrtDestroyStream failed: {}",
                self.acl.error("aclrtDestroyStream", rc)
            );
        }
    }
}

impl Acl {
    /// `aclrtStreamAbort`, under the stream's context: drops the tasks not yet executed, so
    /// no copy queued on it touches memory afterwards (HIXL's failure teardown).
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn abort(&self, stream: &Stream) -> Result<(), Error> {
        let _guard = self.enter_if(stream.ctx)?;
        // SAFETY: the stream is alive (borrowed).
        let rc = unsafe { (self.api.stream_abort)(stream.raw.as_ptr()) };
        self.check("aclrtStreamAbort", rc)
    }

    /// `aclrtCreateStream` under this thread's current context.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn create_stream(&self) -> Result<Stream, Error> {
        let mut s: *mut c_void = std::ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        let rc = unsafe { (self.api.create_stream)(&mut s) };
        self.check("aclrtCreateStream", rc)?;
        let raw = NonNull::new(s).ok_or_else(|| Error::Native {
            library: "acl",
            call: "aclrtCreateStream",
            code: 0,
            detail: "ACL_SUCCESS with a null stream".into(),
        })?;
        Ok(Stream {
            acl: self.clone(),
            raw,
            ctx: self.current_context().ok(),
        })
    }

    /// Destroys a stream now, reporting a failure (dropping destroys too, logging failures).
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn destroy_stream(&self, stream: Stream) -> Result<(), Error> {
        let stream = std::mem::ManuallyDrop::new(stream);
        let _guard = self.enter_if(stream.ctx)?;
        // SAFETY: the stream came from aclrtCreateStream and is destroyed once (its Drop does
        // not run).
        let rc = unsafe { (self.api.destroy_stream)(stream.raw.as_ptr()) };
        // SAFETY: the field is read once from a value that is never used again.
        drop(unsafe { std::ptr::read(&stream.acl) });
        self.check("aclrtDestroyStream", rc)
    }

    /// `aclrtSynchronizeStreamWithTimeout`, under the stream's context. `op` and `peer` name
    /// the transfer for a timeout error.
    ///
    /// # Errors
    /// [`Error::Timeout`] (`TIMEOUT`) for `ACL_ERROR_RT_STREAM_SYNC_TIMEOUT` and the runtime's
    /// other timeout codes; [`Error::Native`] (`FAILED`) otherwise.
    pub(crate) fn synchronize(
        &self,
        stream: &Stream,
        timeout: Duration,
        op: &'static str,
        peer: &str,
    ) -> Result<(), Error> {
        let _guard = self.enter_if(stream.ctx)?;
        let start = Instant::now();
        // SAFETY: the stream is alive (borrowed); the timeout is a plain value.
        let rc = unsafe {
            (self.api.synchronize_stream_with_timeout)(stream.raw.as_ptr(), timeout_ms(timeout))
        };
        if sys::ACL_TIMEOUT_CODES.contains(&rc) {
            let _ = self.recent_message();
            return Err(Error::Timeout {
                op,
                peer: peer.to_owned(),
                elapsed: start.elapsed(),
            });
        }
        self.check("aclrtSynchronizeStreamWithTimeout", rc)
    }
}
