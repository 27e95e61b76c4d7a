//! The compat layer's error: HIXL's status code and a message (what every compat call returns).

use std::fmt;

use crate::Status;

/// A failed call: HIXL's status code and a human-readable cause.
#[derive(Debug, Clone)]
pub struct Error {
    pub(super) status: Status,
    pub(super) message: String,
}

impl Error {
    pub(super) fn new(status: Status, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
    /// HIXL's status code.
    pub fn status(&self) -> Status {
        self.status
    }
    /// The cause, for logs.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

impl From<crate::Error> for Error {
    fn from(e: crate::Error) -> Self {
        Self::new(e.status(), e.to_string())
    }
}

/// A compat result.
pub type Result<T> = std::result::Result<T, Error>;
