//! Memory handed to an engine: its raw parts ([`RawMemory`]) and the contract of a type whose
//! ownership can be handed over and back ([`RegistrableMemory`]).

use std::ptr::NonNull;

use super::MemType;

/// The raw parts of a piece of memory whose ownership was handed to an engine.
#[derive(Debug, Clone, Copy)]
pub struct RawMemory {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
    pub(crate) extra: usize,
    pub(crate) mem_type: MemType,
    /// The sealed memfd behind the memory (HostBuffer only), or -1.
    pub(crate) fd: i32,
}

impl RawMemory {
    /// Describes `len` bytes at `ptr`. `extra` is free for the implementor (a `Vec`'s capacity,
    /// for example) and comes back unchanged in [`RegistrableMemory::from_raw_parts`].
    pub fn new(ptr: NonNull<u8>, len: usize, extra: usize, mem_type: MemType) -> Self {
        Self {
            ptr,
            len,
            extra,
            mem_type,
            fd: -1,
        }
    }
    /// Start of the memory.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The implementor's extra word.
    pub fn extra(&self) -> usize {
        self.extra
    }
    /// The memory's type.
    pub fn mem_type(&self) -> MemType {
        self.mem_type
    }
}

/// Memory whose ownership can be handed to an engine for registration, and handed back.
///
/// # Safety
/// An implementation promises that:
/// - `into_raw_parts` gives up all access to the memory: from then until `from_raw_parts` is called
///   with the same parts, nothing but the engine reads, writes, moves, frees or unmaps the
///   `len` bytes at `ptr`, and they stay valid for reads and writes of any byte values;
/// - `from_raw_parts(raw)` accepts exactly what `into_raw_parts` returned and restores the value;
///   dropping that value frees the memory;
/// - the reported [`MemType`] is true.
pub unsafe trait RegistrableMemory: Send + 'static {
    /// Gives up ownership and returns the raw parts.
    fn into_raw_parts(self) -> RawMemory;
    /// Restores the value from its raw parts.
    ///
    /// # Safety
    /// `raw` must come from `into_raw_parts` of the same type, and be used once.
    unsafe fn from_raw_parts(raw: RawMemory) -> Self;
}
