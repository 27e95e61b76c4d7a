//! Transfer operations and descriptors.
//!
//! A [`TransferDesc`] pairs a [`LocalRange`] (a sub-range of a region registered with this engine)
//! with a [`RemoteRange`] (a sub-range of a region in the peer's table, obtained from the link). Both
//! are capabilities that borrow what they came from, so a descriptor cannot be built from a raw
//! address, cannot outlive its region or link, and cannot name memory that was never registered.

use std::fmt;

use crate::link::RemoteRange;
use crate::memory::LocalRange;

/// One `{local, remote, len}` descriptor (HIXL `TransferOpDesc`), built from capabilities.
///
/// The lengths of both sides must match; the transfer checks it and reports the index of a
/// descriptor that does not ([`Error::LengthMismatch`](crate::Error::LengthMismatch)).
#[derive(Clone, Copy)]
pub struct TransferDesc<'a> {
    pub(crate) local: LocalRange<'a>,
    pub(crate) remote: RemoteRange<'a>,
}

impl<'a> TransferDesc<'a> {
    /// Pairs a local and a remote range.
    pub fn new(local: LocalRange<'a>, remote: RemoteRange<'a>) -> Self {
        Self { local, remote }
    }
    /// The local side.
    pub fn local(&self) -> LocalRange<'a> {
        self.local
    }
    /// The remote side.
    pub fn remote(&self) -> RemoteRange<'a> {
        self.remote
    }
}

impl fmt::Debug for TransferDesc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransferDesc")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish()
    }
}
