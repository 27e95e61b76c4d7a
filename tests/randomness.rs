//! Nonces, instance ids and link tokens come from the operating system's random source only: a
//! process whose source fails cannot initialize an engine (a typed error with HIXL's `FAILED`),
//! instead of falling back on values a peer could guess (time, pid, a counter).

use std::process::Command;

/// `hixl-peer norandom` takes its own random sources away (as root: `/dev/urandom` and
/// `/dev/random` bound to `/dev/null` in a mount namespace of its own, `getrandom(2)` failing
/// with `EPERM` under seccomp) and then initializes an engine, and connects one it made
/// before.
#[test]
fn initialize_fails_without_a_random_source() {
    let out = Command::new(env!("CARGO_BIN_EXE_hixl-peer"))
        .arg("norandom")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(why) = said.strip_prefix("SKIP ") {
        eprintln!(
            "initialize_fails_without_a_random_source: skipped: {}",
            why.trim()
        );
        return;
    }
    let mut lines = said.lines();
    let line = lines.next().unwrap_or_default();
    assert!(
        line.starts_with("INIT err 503900 the operating system's random source failed"),
        "{line}"
    );
    // an engine made before the sources went cannot connect either (its HELLO's nonce)
    let line = lines.next().unwrap_or_default();
    assert!(
        line.starts_with("CONNECT err 503900 the operating system's random source failed"),
        "{line}"
    );
}
