// A remote range borrows its link: the link cannot be disconnected while the range is in use.
use hixl::{Hixl, HostBuffer, Options};
use std::time::Duration;

fn main() -> Result<(), hixl::Error> {
    let (engine, _region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let engine = engine.activate()?;
    let link = engine.connect("127.0.0.1:26000")?;
    let remote = link.remote(0x1000, 64)?;
    link.disconnect(Duration::from_secs(1))?; //~ ERROR E0505
    let _len = remote.len();
    Ok(())
}
