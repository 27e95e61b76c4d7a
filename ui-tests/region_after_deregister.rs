// A region is consumed by `deregister`: using it afterwards does not compile.
use hixl::{Hixl, HostBuffer, Options};

fn main() -> Result<(), hixl::Error> {
    let (engine, region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let _mem = engine.deregister(region)?;
    let _r = region.range(0..16); //~ ERROR E0382
    Ok(())
}
