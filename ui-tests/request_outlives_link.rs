// An async request borrows its link: the link cannot be disconnected while a request is held,
// so waiting on a request after its link was consumed does not compile.
use hixl::{Hixl, HostBuffer, Options, TransferArgs, TransferDesc, TransferOp};
use std::time::Duration;

fn main() -> Result<(), hixl::Error> {
    let (engine, region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let engine = engine.activate()?;
    let link = engine.connect("127.0.0.1:26000")?;
    let desc = TransferDesc::new(region.range(0..64)?, link.remote(0x1000, 64)?);
    let req = link.transfer_async(TransferOp::Write, &[desc], TransferArgs::default())?;
    drop(desc);
    link.disconnect(Duration::from_secs(1))?; //~ ERROR E0505
    let _ = req.wait(Duration::from_secs(1));
    Ok(())
}
