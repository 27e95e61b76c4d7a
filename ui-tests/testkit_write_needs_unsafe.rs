// Even with the `testkit` feature (test support, off by default), writing into a process's
// memory is an `unsafe fn`: safe code cannot reach it.
fn main() -> std::io::Result<()> {
    let peer = hixl::testkit::SameHostPeer::open(std::process::id())?;
    let secret = Box::new(0u64);
    peer.write(&*secret as *const u64 as usize, &[0xFF; 8])
}
