// Finalizing while a link is open does not compile: the link borrows the engine.
use hixl::{Hixl, HostBuffer, Options};

fn main() -> Result<(), hixl::Error> {
    let (engine, _region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let engine = engine.activate()?;
    let link = engine.connect("127.0.0.1:26000")?;
    let _done = engine.finalize(); //~ ERROR E0505
    drop(link);
    Ok(())
}
