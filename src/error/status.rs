//! HIXL's status codes ([`Status`], with HIXL's numeric values) and a peer's refusal as it was
//! received ([`RemoteRefusal`]).

use std::fmt;

/// A HIXL status code (`hixl::Status`, a `uint32_t`), with HIXL's numeric values.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(u32);

impl Status {
    /// `SUCCESS`: no error.
    pub const SUCCESS: Self = Self(0);
    /// `PARAM_INVALID`: a bad parameter. Recoverable.
    pub const PARAM_INVALID: Self = Self(103_900);
    /// `TIMEOUT`: an operation did not finish within its deadline.
    pub const TIMEOUT: Self = Self(103_901);
    /// `NOT_CONNECTED`: there is no (usable) link to the peer. Recoverable by connecting again.
    pub const NOT_CONNECTED: Self = Self(103_902);
    /// `ALREADY_CONNECTED`: a second connect to the same remote engine. Recoverable.
    pub const ALREADY_CONNECTED: Self = Self(103_903);
    /// `NOTIFY_FAILED`: reserved by HIXL, never returned.
    pub const NOTIFY_FAILED: Self = Self(103_904);
    /// `UNSUPPORTED`: a parameter or feature this build or backend does not support. Recoverable.
    pub const UNSUPPORTED: Self = Self(103_905);
    /// `RESOURCE_EXHAUSTED`: out of a bounded resource (regions, lanes, queue slots). Retry later.
    pub const RESOURCE_EXHAUSTED: Self = Self(203_900);
    /// `FAILED`: a generic failure. Not recoverable on this link.
    pub const FAILED: Self = Self(503_900);

    /// The numeric code, as HIXL's C++ API returns it.
    pub const fn code(self) -> u32 {
        self.0
    }

    /// HIXL's name for each code it defines, and `None` for any other code: the one list of
    /// the codes a [`Status`] may hold.
    const fn known(code: u32) -> Option<&'static str> {
        Some(match code {
            0 => "SUCCESS",
            103_900 => "PARAM_INVALID",
            103_901 => "TIMEOUT",
            103_902 => "NOT_CONNECTED",
            103_903 => "ALREADY_CONNECTED",
            103_904 => "NOTIFY_FAILED",
            103_905 => "UNSUPPORTED",
            203_900 => "RESOURCE_EXHAUSTED",
            503_900 => "FAILED",
            _ => return None,
        })
    }

    /// The status for a numeric code, if it is one HIXL defines.
    pub const fn from_code(code: u32) -> Option<Self> {
        match Self::known(code) {
            Some(_) => Some(Self(code)),
            None => None,
        }
    }

    /// The status a peer reported as `code`; a code HIXL does not define is `FAILED` (the one
    /// place an unknown code becomes a status).
    pub(crate) const fn from_peer(code: u32) -> Self {
        match Self::from_code(code) {
            Some(s) => s,
            None => Self::FAILED,
        }
    }

    /// HIXL's name for the code (`"PARAM_INVALID"`, ...).
    pub const fn name(self) -> &'static str {
        match Self::known(self.0) {
            Some(name) => name,
            // not reached: a `Status` is built only from the constants above and `from_code`
            None => "FAILED",
        }
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Why a peer refused a request or a connection (sent back over the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRefusal {
    /// The HIXL status the peer reported.
    pub status: Status,
    /// The peer's explanation.
    pub reason: String,
}

impl fmt::Display for RemoteRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.reason)
    }
}
