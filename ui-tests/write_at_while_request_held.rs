// An async request borrows the regions its descriptors borrow: while it is held, the engine may
// still be reading the region, so `write_at` (which needs `&mut Region`) does not compile.
use hixl::{Hixl, HostBuffer, Options, TransferArgs, TransferDesc, TransferOp};
use std::time::Duration;

fn main() -> Result<(), hixl::Error> {
    let (engine, mut region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let engine = engine.activate()?;
    let link = engine.connect("127.0.0.1:26000")?;
    let remote = link.remote(0x1000, 4096)?;
    let req = link.transfer_async(TransferOp::Write, &[TransferDesc::new(region.range(..)?, remote)], TransferArgs::default())?;
    region.write_at(0, b"next layer")?; //~ ERROR E0502
    let _ = req.wait(Duration::from_secs(5));
    Ok(())
}
