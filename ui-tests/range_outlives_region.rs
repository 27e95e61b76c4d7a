// A local range borrows its region: the region cannot be deregistered while a range of it lives.
use hixl::{Hixl, HostBuffer, Options};

fn main() -> Result<(), hixl::Error> {
    let (engine, region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let range = region.range(0..64)?;
    let _mem = engine.deregister(region); //~ ERROR E0505
    let _len = range.len();
    Ok(())
}
