// `disconnect` consumes the link: using it afterwards does not compile.
use hixl::{Hixl, HostBuffer, Options, TransferOp};
use std::time::Duration;

fn main() -> Result<(), hixl::Error> {
    let (engine, _region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let engine = engine.activate()?;
    let link = engine.connect("127.0.0.1:26000")?;
    link.disconnect(Duration::from_secs(1))?;
    link.transfer_sync(TransferOp::Write, &[], Duration::from_secs(1))?; //~ ERROR E0382
    Ok(())
}
