// Memory can only be deregistered in `Registered`, and leaving `Connected` needs every link gone:
// a live link borrows the engine, so `deactivate` does not compile.
use hixl::{Hixl, HostBuffer, Options};

fn main() -> Result<(), hixl::Error> {
    let (engine, region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let engine = engine.activate()?;
    let link = engine.connect("127.0.0.1:26000")?;
    let engine = engine.deactivate(); //~ ERROR E0505
    let _mem = engine.deregister(region);
    drop(link);
    Ok(())
}
