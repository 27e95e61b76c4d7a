//! Serving under hostile, starving and heavy clients: malformed protocol, local attackers,
//! resource limits, the serving budget, and load (one test crate; each module is one former test
//! file; `support` holds their shared helpers and the one lock that keeps the tests measuring a
//! process apart from the others).

#[path = "../common/mod.rs"]
mod common;
mod support;

mod attack;
mod budget;
mod fair;
mod hostile;
mod limits;
mod load;
mod trust;
mod withheld;
