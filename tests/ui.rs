//! Compile-fail cases: every misuse the type system rules out has a case in `ui-tests/`, with the
//! compiler's reviewed output beside it.

#[test]
fn ui() {
    // The .stderr files follow the stable compiler this project pins (1.95); other compilers word
    // their errors differently, so the check only runs there.
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if !version.starts_with("rustc 1.95.") {
        eprintln!(
            "ui-tests skipped: their .stderr files follow rustc 1.95 stable, this is {version:?}"
        );
        return;
    }
    let t = trybuild::TestCases::new();
    t.compile_fail("ui-tests/*.rs");
}
