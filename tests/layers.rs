//! The layer check (`tools/layers.sh`, also run first by `.ci/run`) as part of `cargo test`: the
//! tree keeps its layers, and each of the script's rules catches a violation planted in a copy
//! of `src/` (`--self-test`: an import up a layer, one transport importing another, each
//! transport named outside `src/transport/` and the registry, a glob import, a file or module
//! in no layer, a stale entry in `tools/layers.allow`).

use std::process::Command;

fn layers(args: &[&str]) -> (bool, String) {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("bash")
        .arg(format!("{root}/tools/layers.sh"))
        .args(args)
        .output()
        .expect("run bash tools/layers.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_tree_keeps_its_layers() {
    let (ok, out) = layers(&[]);
    assert!(ok, "tools/layers.sh:\n{out}");
    assert!(out.contains("layers: ok"), "{out}");
}

#[test]
fn each_rule_catches_a_planted_violation() {
    let (ok, out) = layers(&["--self-test"]);
    assert!(ok, "tools/layers.sh --self-test:\n{out}");
    for rule in ["rule 1:", "rule 2:", "rule 3:", "rule 4:"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with("self-test: caught: ") && l.contains(rule)),
            "no planted violation of {rule} caught:\n{out}"
        );
    }
    for transport in ["tcp", "same_host", "ucx", "ascend"] {
        assert!(
            out.contains(&format!("caught: rule 3: {transport} named")),
            "{transport}:\n{out}"
        );
    }
}
