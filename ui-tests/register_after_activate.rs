// Registering memory after the engine can have links does not compile: `Hixl<Connected>` has no
// `register` (HIXL: all memory is registered before Connect).
use hixl::{Hixl, HostBuffer, Options};

fn main() -> Result<(), hixl::Error> {
    let (engine, _region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let engine = engine.activate()?;
    let _late = engine.register(HostBuffer::new(4096)?); //~ ERROR E0599
    Ok(())
}
