//! Serving under hostile, starving and heavy clients: malformed protocol, local attackers,
//! resource limits, the serving budget, and load (one test crate; each module is one former test
//! file; `support` holds their shared helpers).

mod attack_support;
#[path = "../common/mod.rs"]
mod common;
mod support;

mod attack;
mod budget;
mod hostile;
mod limits;
mod load;
