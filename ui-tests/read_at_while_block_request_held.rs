// An async block READ writes into the local region until it ends: while the request is held,
// reading the region with `read_at` (which needs `&mut Region`) does not compile.
use hixl::{BlockLayout, Hixl, HostBuffer, Options, TransferArgs, TransferOp};
use std::time::Duration;

fn main() -> Result<(), hixl::Error> {
    let (engine, mut region) = Hixl::initialize("127.0.0.1", Options::default())?.register(HostBuffer::new(4096)?)?;
    let engine = engine.activate()?;
    let link = engine.connect("127.0.0.1:26000")?;
    let layout = BlockLayout::new(region.range(..)?, link.remote(0x1000, 4096)?, 64);
    let idx: Vec<u32> = (0..64).collect();
    let req = link.transfer_blocks_async(TransferOp::Read, &layout, &idx, &idx, TransferArgs::default())?;
    let mut first = [0u8; 1];
    region.read_at(0, &mut first)?; //~ ERROR E0502
    let _ = req.wait(Duration::from_secs(5));
    Ok(())
}
