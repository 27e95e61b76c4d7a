//! The engine's state graph, checked by the `typestate` crate.
//!
//! The engine itself ([`Hixl<S>`](crate::Hixl)) is written by hand: the `typestate` macro cannot
//! express fallible transitions that return `Result`, and generates traits callers would have to
//! import (see the crate docs). This module mirrors the engine's graph declaratively, and the
//! macro checks at compile time that every state is reachable from `initialize` and can reach
//! the final state. A test (`spec_edges_match_the_engine`) walks the real engine through
//! [`EDGES`] so the two cannot drift apart.
//!
//! Fallible transitions are modelled as the macro wants them: a decision enum whose variants are
//! the success state and the state the engine is handed back in.

#![allow(missing_docs, dead_code, clippy::manual_non_exhaustive)]

#[typestate::typestate]
pub mod graph {
    /// The engine, as an automaton.
    #[automaton]
    pub struct Engine {
        pub(crate) _private: (),
    }

    #[state]
    pub struct Initialized;
    #[state]
    pub struct Registered;
    #[state]
    pub struct Connected;
    #[state]
    pub struct Finalized;

    pub trait Initialized {
        fn initialize() -> Initialized;
        fn register(self) -> FirstRegistration;
        fn into_registered(self) -> Registered;
        fn finalize(self) -> Finalized;
    }

    pub trait Registered {
        fn register_more(&self);
        fn deregister(&self);
        fn activate(self) -> Activation;
        fn finalize(self) -> Finalized;
    }

    pub trait Connected {
        fn connect(&self);
        fn deactivate(self) -> Registered;
        fn finalize(self) -> Finalized;
    }

    pub trait Finalized {
        fn deregister(&self);
        fn drop(self);
    }

    pub enum FirstRegistration {
        Registered,
        Initialized,
    }

    pub enum Activation {
        Connected,
        Registered,
    }
}

/// Every state-changing edge of the engine: (from, method, to). The failure edges of
/// `register` and `activate` hand the engine back in its previous state.
pub const EDGES: &[(&str, &str, &str)] = &[
    ("Initialized", "register", "Registered"),
    ("Initialized", "register", "Initialized"),
    ("Initialized", "into_registered", "Registered"),
    ("Initialized", "finalize", "Finalized"),
    ("Registered", "activate", "Connected"),
    ("Registered", "activate", "Registered"),
    ("Registered", "finalize", "Finalized"),
    ("Connected", "deactivate", "Registered"),
    ("Connected", "finalize", "Finalized"),
];
