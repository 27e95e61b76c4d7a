// A finalized engine cannot register memory (or connect): it has no such methods.
use hixl::{Hixl, HostBuffer, Options};

fn main() -> Result<(), hixl::Error> {
    let engine = Hixl::initialize("127.0.0.1", Options::default())?.into_registered();
    let done = engine.finalize();
    let _r = done.register(HostBuffer::new(4096)?); //~ ERROR E0599
    Ok(())
}
