// A transition consumes the engine in its old state: the old value cannot be used again.
use hixl::{Hixl, HostBuffer, Options};

fn main() -> Result<(), hixl::Error> {
    let (engine, _region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let _connected = engine.activate()?;
    let _more = engine.register(HostBuffer::new(4096)?); //~ ERROR E0382
    Ok(())
}
