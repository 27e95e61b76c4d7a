// `Hixl<Connected>` has no `deregister`: peers may be using the memory.
use hixl::{Hixl, HostBuffer, Options};

fn main() -> Result<(), hixl::Error> {
    let (engine, region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let engine = engine.activate()?;
    let _mem = engine.deregister(region); //~ ERROR E0599
    Ok(())
}
