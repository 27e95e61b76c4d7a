//! A failed consuming call that hands back what it consumed ([`HandedBack`]).

use std::fmt;

use super::{Error, Status};

/// A failed consuming call that hands back what it consumed (local: "refused" in hixl always
/// means a peer's refusal, [`Error::Refused`]).
///
/// Registration returns the memory it could not register; deregistration returns the region.
/// `?` converts it into [`Error`] (dropping the value).
pub struct HandedBack<T> {
    /// Why the call failed.
    pub error: Error,
    /// What the call consumed, handed back unchanged.
    pub value: T,
}

impl<T> HandedBack<T> {
    /// The value that was handed back.
    pub fn into_inner(self) -> T {
        self.value
    }

    /// The error and the value.
    pub fn into_parts(self) -> (Error, T) {
        (self.error, self.value)
    }

    /// HIXL's status code for the failure.
    pub fn status(&self) -> Status {
        self.error.status()
    }
}

impl<T> fmt::Debug for HandedBack<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandedBack")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for HandedBack<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for HandedBack<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<T> From<HandedBack<T>> for Error {
    fn from(r: HandedBack<T>) -> Self {
        r.error
    }
}
