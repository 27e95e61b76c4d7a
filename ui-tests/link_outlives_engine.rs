// A link borrows its engine: it cannot outlive it.
use hixl::{Hixl, Link, Options};

fn leak() -> Result<Link<'static>, hixl::Error> {
    let engine = Hixl::initialize("127.0.0.1", Options::default())?.into_registered().activate()?;
    let link = engine.connect("127.0.0.1:26000")?;
    Ok(link) //~ ERROR E0515
}

fn main() {
    let _ = leak();
}
