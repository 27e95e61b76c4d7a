// A transfer needs a link: there is no transfer method on the engine itself.
use hixl::{Hixl, HostBuffer, Options, TransferOp};
use std::time::Duration;

fn main() -> Result<(), hixl::Error> {
    let (engine, _region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    engine.transfer_sync(TransferOp::Write, &[], Duration::from_secs(1)); //~ ERROR E0599
    Ok(())
}
