// A descriptor cannot be built from a raw address: it takes a registered `LocalRange`.
use hixl::{Hixl, HostBuffer, Options, TransferDesc};

fn main() -> Result<(), hixl::Error> {
    let (engine, _region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let engine = engine.activate()?;
    let link = engine.connect("127.0.0.1:26000")?;
    let remote = link.remote(0x1000, 64)?;
    let _desc = TransferDesc::new(0x7f00_0000_0000usize, remote); //~ ERROR E0308
    Ok(())
}
