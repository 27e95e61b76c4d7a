// Registration takes ownership: the vector cannot be used (or resized) while it is registered.
use hixl::{Hixl, Options};

fn main() -> Result<(), hixl::Error> {
    let mut v = vec![0u8; 4096];
    let (_engine, _region) = Hixl::initialize("127.0.0.1", Options::default())?.register(v)?;
    v.push(1); //~ ERROR E0382
    Ok(())
}
