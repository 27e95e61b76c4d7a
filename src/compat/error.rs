//! The compat layer's error: HIXL's status code and a message (what every compat call returns),
//! with the typed error it came from as its `source()`.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use crate::Status;

/// A failed call: HIXL's status code, a human-readable cause and, when the typed engine failed,
/// its [`hixl::Error`](crate::Error) as [`source`](StdError::source) (to match on its variant:
/// `e.source().and_then(|s| s.downcast_ref::<hixl::Error>())`).
///
/// [`message`](Error::message) and `Display` include the typed error's text, so a caller that
/// only prints (the C ABI, the Python binding) loses nothing.
#[derive(Debug, Clone)]
pub struct Error {
    pub(super) status: Status,
    pub(super) message: String,
    /// The typed error, shared so the compat error stays `Clone`.
    source: Option<Arc<crate::Error>>,
}

impl Error {
    pub(super) fn new(status: Status, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            source: None,
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
    /// ACL's own error code when the engine could not read its device as it started
    /// (`aclrtGetDevice` failed: 107002 `ACL_ERROR_RT_CONTEXT_NULL` on a thread with no device),
    /// which HIXL, ADXL and HIXL-CS return as it is (`HIXL_CHK_ACL_RET` on `aclrtGetDevice`);
    /// `None` for any other failure.
    pub fn acl_start_code(&self) -> Option<u32> {
        self.source.as_deref()?.acl_start_code()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

impl From<crate::Error> for Error {
    fn from(e: crate::Error) -> Self {
        Self {
            status: e.status(),
            message: e.to_string(),
            source: Some(Arc::new(e)),
        }
    }
}

/// A compat result.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typed_error_is_the_source() {
        let e = Error::from(crate::Error::InvalidTimeout { millis: 0 });
        assert_eq!(e.status(), Status::PARAM_INVALID);
        assert!(e.message().contains("timeout"), "{}", e.message());
        let typed = e
            .source()
            .and_then(|s| s.downcast_ref::<crate::Error>())
            .expect("the typed error is the source");
        assert!(matches!(typed, crate::Error::InvalidTimeout { millis: 0 }));
        // a clone keeps it
        assert!(e.clone().source().is_some());
        // the compat layer's own errors have none
        assert!(
            Error::new(Status::FAILED, "not initialized")
                .source()
                .is_none()
        );
    }
}
