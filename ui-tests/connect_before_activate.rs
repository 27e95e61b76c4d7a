// Connecting needs `Hixl<Connected>`: registration must be closed first (`activate`).
use hixl::{Hixl, HostBuffer, Options};

fn main() -> Result<(), hixl::Error> {
    let (engine, _region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let _link = engine.connect("127.0.0.1:26000"); //~ ERROR E0599
    Ok(())
}
