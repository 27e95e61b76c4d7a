// A `ContextToken` proves the device context is bound on *this* thread: it cannot be sent to
// another one (use `DetachedContext` and bind it there).
use hixl::{Hixl, Options};

fn main() -> Result<(), hixl::Error> {
    let engine = Hixl::initialize("127.0.0.1", Options::default())?;
    engine.with_context(|tok| {
        std::thread::scope(|s| {
            s.spawn(move || { //~ ERROR E0277
                let _ = tok.engine_id();
            });
        });
    })?;
    Ok(())
}
