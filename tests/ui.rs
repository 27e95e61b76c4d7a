//! Compile-fail cases: every misuse the type system rules out has a case in `ui-tests/`, with the
//! compiler's reviewed output beside it.

// The .stderr files follow the stable compiler this project pins (1.95); other compilers word
// their errors differently, so the check only runs there (elsewhere the test is ignored).
#[rustversion::attr(
    not(stable(1.95)),
    ignore = "the .stderr files follow rustc 1.95 stable"
)]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui-tests/*.rs");
}
