//! A parsed HIXL engine name (`ip`, `ip:port`, `[ipv6]:port`).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::error::Error;

/// A parsed HIXL engine name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineName {
    /// The IP address.
    pub ip: IpAddr,
    /// The port; `None` (or 0 in the name) means the engine does not listen.
    pub port: Option<u16>,
}

impl EngineName {
    /// Parses `"ip"`, `"ip:port"`, `"[ipv6]"` or `"[ipv6]:port"` (a bare IPv6 address without
    /// a port is accepted too). A port of 0 means "no port", as in HIXL.
    ///
    /// # Errors
    /// [`Error::InvalidEngineName`] (`PARAM_INVALID`).
    pub fn parse(name: &str) -> Result<Self, Error> {
        let bad = |problem| Error::InvalidEngineName {
            name: name.to_owned(),
            problem,
        };
        let (ip, port) = if let Some(rest) = name.strip_prefix('[') {
            let (ip, after) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
            let ip: Ipv6Addr = ip.parse().map_err(|_| bad("not an IPv6 address"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("expected ':' after ']'"))?,
                ),
            };
            (IpAddr::V6(ip), port)
        } else if let Ok(ip) = name.parse::<Ipv6Addr>() {
            (IpAddr::V6(ip), None)
        } else {
            let (ip, port) = match name.split_once(':') {
                Some((ip, port)) => (ip, Some(port)),
                None => (name, None),
            };
            (
                IpAddr::V4(ip.parse().map_err(|_| bad("not an IPv4 address"))?),
                port,
            )
        };
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(0) => None,
                Ok(p) => Some(p),
                Err(_) => return Err(bad("the port is not a number in 0..=65535")),
            },
        };
        Ok(Self { ip, port })
    }

    /// The socket address, if the name has a port.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        self.port.map(|p| SocketAddr::new(self.ip, p))
    }
}

impl fmt::Display for EngineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.ip, self.port) {
            (IpAddr::V4(ip), None) => write!(f, "{ip}"),
            (IpAddr::V6(ip), None) => write!(f, "[{ip}]"),
            (ip, Some(p)) => write!(f, "{}", SocketAddr::new(ip, p)),
        }
    }
}
