// Registering device memory needs a token for the engine's device context on the calling
// thread: a spawned thread cannot use the token of the thread that bound the context (it must
// re-bind with `DetachedContext::bind`).
use hixl::{Hixl, Options};

fn main() -> Result<(), hixl::Error> {
    let engine = Hixl::initialize("127.0.0.1", Options::default())?.into_registered();
    engine.with_context(|tok| {
        let buf = engine.alloc_device(tok, 2 << 20).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| { //~ ERROR E0277
                let _ = engine.register_device(tok, buf);
            });
        });
    })?;
    Ok(())
}
