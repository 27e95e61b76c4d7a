// `finalize` consumes the engine: using it afterwards does not compile.
use hixl::{Hixl, HostBuffer, Options};

fn main() -> Result<(), hixl::Error> {
    let (engine, _region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let engine = engine.activate()?;
    let _done = engine.finalize();
    let _link = engine.connect("127.0.0.1:26000"); //~ ERROR E0382
    Ok(())
}
