//! What is checked of a peer's worker address and packed rkey before UCX parses them (UCX reads
//! both without a length and trusts their content; see the module documentation on trust).

/// The largest worker address accepted (real ones are a few hundred bytes, a few KiB with many
/// RDMA devices).
pub(super) const MAX_ADDRESS_LEN: usize = 64 * 1024;
/// The smallest plausible worker address (header, uuid).
const MIN_ADDRESS_LEN: usize = 9;
/// Zero bytes appended to a worker address before UCX parses it: UCX reads it without a
/// length, and every length field it follows is at most a byte or two, so a malformed address
/// cannot make it read past this padding.
pub(super) const ADDRESS_PADDING: usize = 256 * 1024;
/// Zero bytes appended to a packed rkey before UCX unpacks it. `check_rkey` checks the size byte
/// of each memory domain's key, but UCX hands each transport its key without that size, and the
/// transport reads a struct of its own (8 bytes for InfiniBand, more for shared memory): a peer
/// that gives a key of 0 bytes would make it read past the buffer. A key's size is a byte, so no
/// transport's key is longer than 255 bytes.
pub(super) const RKEY_PADDING: usize = 256;
/// The memory types UCX 1.13 knows (`UCS_MEMORY_TYPE_LAST`), used to bound the rkey's type byte.
const KNOWN_MEMORY_TYPES: u8 = 5;

/// Checks what can be checked of a worker address without UCX's parser.
pub(super) fn check_address(a: &[u8]) -> Result<(), &'static str> {
    if a.len() < MIN_ADDRESS_LEN {
        return Err("too short");
    }
    if a.len() > MAX_ADDRESS_LEN {
        return Err("too long");
    }
    // header: the low 4 bits are the address version (V1 = 0, V2 = 1 in UCX 1.13+); UCX
    // aborts on a version it does not know
    if a[0] & 0x0f > 1 {
        return Err("unknown UCX address version");
    }
    Ok(())
}

/// Checks that a packed rkey holds every byte UCX's `ucp_ep_rkey_unpack` reads: a 64-bit
/// memory-domain map, a memory-type byte, then for each bit of the map a size byte and that
/// many bytes.
pub(super) fn check_rkey(r: &[u8]) -> Result<(), &'static str> {
    let Some((map, rest)) = r.split_first_chunk::<8>() else {
        return Err("too short for its header");
    };
    let Some((&mem_type, mut rest)) = rest.split_first() else {
        return Err("too short for its header");
    };
    if mem_type >= KNOWN_MEMORY_TYPES {
        return Err("unknown memory type");
    }
    let map = u64::from_ne_bytes(*map);
    for _ in 0..map.count_ones() {
        let Some((&size, tail)) = rest.split_first() else {
            return Err("shorter than its memory-domain map says");
        };
        let Some(tail) = tail.get(usize::from(size)..) else {
            return Err("shorter than its key sizes say");
        };
        rest = tail;
    }
    Ok(())
}

/// `packed` followed by [`RKEY_PADDING`] zero bytes: what UCX's unpack is given.
pub(super) fn padded_rkey(packed: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(packed.len() + RKEY_PADDING);
    v.extend_from_slice(packed);
    v.resize(packed.len() + RKEY_PADDING, 0);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key UCX unpacks is followed by a transport's largest key of zeros, whatever sizes the
    /// peer gave (0 here: a key the size check passes whose transports would read beyond it).
    #[test]
    fn an_rkey_is_unpacked_from_a_zero_padded_copy() {
        let mut r = u64::MAX.to_ne_bytes().to_vec();
        r.push(0);
        r.extend([0u8; 64]); // 64 domains, each key 0 bytes long
        assert_eq!(check_rkey(&r), Ok(()));
        let p = padded_rkey(&r);
        assert_eq!(&p[..r.len()], &r[..]);
        assert_eq!(p.len(), r.len() + 256);
        assert!(p[r.len()..].iter().all(|&b| b == 0));
    }

    #[test]
    fn rkey_length_walk() {
        let mut r = 0b101u64.to_ne_bytes().to_vec();
        r.push(0); // host memory
        r.extend_from_slice(&[2, 0xaa, 0xbb]); // first domain: 2 bytes
        assert_eq!(
            check_rkey(&r),
            Err("shorter than its memory-domain map says")
        );
        r.push(0); // second domain: 0 bytes
        assert_eq!(check_rkey(&r), Ok(()));
        r.truncate(10);
        assert_eq!(check_rkey(&r), Err("shorter than its key sizes say"));
        assert!(check_rkey(&[0; 9]).is_ok());
        assert!(check_address(&[0x20; 9]).is_ok());
        assert!(check_address(&[0x2f; 9]).is_err());
    }
}
