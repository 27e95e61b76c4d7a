// `write_at` needs `&mut Region`, so it cannot run while descriptors (which borrow the region for
// a transfer) are alive.
use hixl::{Hixl, HostBuffer, Options};

fn main() -> Result<(), hixl::Error> {
    let (_engine, mut region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let range = region.range(0..64)?;
    region.write_at(0, b"racing a transfer")?; //~ ERROR E0502
    let _len = range.len();
    Ok(())
}
