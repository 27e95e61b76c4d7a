//! Whether a TCP peer may be a process of this host: the addresses it connects from, and the
//! network namespace of a socket.

use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd};

/// The network namespace of socket `s` (`SO_NETNS_COOKIE`, Linux 5.14), or `None` where the
/// kernel (or this architecture's option number) does not tell.
pub(super) fn netns_cookie(s: &impl AsFd) -> Option<u64> {
    // the option's number in the generic socket.h (not alpha, mips, parisc, sparc)
    let generic = cfg!(any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "riscv64",
        target_arch = "powerpc64",
        target_arch = "s390x",
        target_arch = "loongarch64"
    ));
    if !generic {
        return None;
    }
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let mut v = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`, a live u64, and its length.
    let r = unsafe {
        libc::getsockopt(
            s.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut v).cast(),
            &mut len,
        )
    };
    (r == 0 && len as usize == std::mem::size_of::<u64>()).then_some(v)
}

/// Whether the peer of `stream` may be a process on this host, whatever it says about itself:
/// it connects from a loopback address, from the address it reached, or from any address of
/// this host's interfaces (as `getifaddrs` lists them). Not knowing counts as yes.
pub(crate) fn peer_on_this_host(stream: &TcpStream) -> bool {
    let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
        return true;
    };
    let ip = canonical(peer.ip());
    if ip.is_loopback() || ip == canonical(local.ip()) {
        return true;
    }
    match interface_addresses() {
        Some(all) => all.contains(&ip),
        None => true,
    }
}

/// An IPv4-mapped IPv6 address as IPv4; others unchanged.
fn canonical(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        v4 => v4,
    }
}

/// Every IPv4 and IPv6 address of this host's interfaces (in this network namespace), or
/// `None` if the kernel will not say.
fn interface_addresses() -> Option<Vec<std::net::IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head`, which is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: a non-null `ifa_addr` points to a sockaddr whose family says its type.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: AF_INET: the sockaddr is a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                out.push(std::net::IpAddr::V4(ip));
            } else if family == libc::AF_INET6 {
                // SAFETY: AF_INET6: the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                out.push(std::net::IpAddr::V6(std::net::Ipv6Addr::from(
                    sin6.sin6_addr.s6_addr,
                )));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no node is used after this.
    unsafe { libc::freeifaddrs(head) };
    Some(out)
}
