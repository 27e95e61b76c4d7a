//! A default build of hixl (no cargo features) has no test support: `hixl::testkit` (which can
//! write into a named process's memory, through an `unsafe fn` even where it exists) is not
//! there at all. Checked by compiling a small crate against this one with `cargo check`,
//! offline, in a target directory of its own under `target/`.
//!
//! With the `testkit` feature (which this crate's tests turn on), the write is still unsafe:
//! `ui-tests/testkit_write_needs_unsafe.rs`.

use std::process::Command;

#[test]
fn testkit_is_not_in_a_default_build() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("default-build-user");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"default-build-user\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\
             publish = false\n\n[dependencies]\nhixl = {{ path = {root:?} }}\n\n[workspace]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("src/main.rs"),
        "fn main() {\n    let _ = hixl::testkit::fnv1a(b\"default\");\n}\n",
    )
    .unwrap();
    // the lock file of this workspace, so the check resolves the same versions offline
    std::fs::copy(format!("{root}/Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["check", "--offline", "--quiet", "--message-format=short"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a default build reached hixl::testkit"
    );
    assert!(
        err.contains("could not find `testkit` in `hixl`"),
        "the check failed for another reason:\n{err}"
    );
}
