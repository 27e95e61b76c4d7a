//! The conformance table (`tests/conformance/cases.json`) as its Rust readers take it: its cases,
//! the surfaces each runs on, the status names. Shared by `tests/conformance/` (the Rust
//! surface) and `hixl-capi/tests/conformance.rs` (C and C++).
#![allow(dead_code)]

use std::path::Path;

use serde_json::Value;

/// One case: a call on a surface with its arguments, from a state, and the status it returns.
#[derive(Debug, Clone)]
pub struct Case {
    pub id: String,
    pub product: String,
    pub state: String,
    pub call: String,
    pub args: Value,
    pub expect: String,
    /// The surfaces it runs on.
    pub surfaces: Vec<String>,
}

impl Case {
    /// Whether it runs on `surface`.
    pub fn runs_on(&self, surface: &str) -> bool {
        self.surfaces.iter().any(|s| s == surface)
    }

    /// Argument `name` (`Null` when absent).
    pub fn arg(&self, name: &str) -> &Value {
        self.args.get(name).unwrap_or(&Value::Null)
    }

    /// Whether argument `name` is given (given as `null` included).
    pub fn has(&self, name: &str) -> bool {
        self.args.get(name).is_some()
    }

    /// Integer argument `name`, or `default`.
    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.arg(name).as_i64().unwrap_or(default)
    }

    /// String argument `name`, or `default`.
    pub fn str<'a>(&'a self, name: &str, default: &'a str) -> &'a str {
        self.arg(name).as_str().unwrap_or(default)
    }

    /// List-of-ints argument `name` (empty when absent).
    pub fn ints(&self, name: &str) -> Vec<i64> {
        self.arg(name)
            .as_array()
            .map(|a| a.iter().map(|v| v.as_i64().expect("an int")).collect())
            .unwrap_or_default()
    }

    /// The expected status's code.
    pub fn code(&self) -> u32 {
        code(&self.expect).unwrap_or_else(|| panic!("{}: no status {}", self.id, self.expect))
    }
}

/// The table's cases.
pub fn load(path: &Path) -> Vec<Case> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let doc: Value = serde_json::from_str(&text).expect("cases.json is JSON");
    let surfaces = &doc["surfaces"];
    doc["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let s = |k: &str| {
                c[k].as_str()
                    .unwrap_or_else(|| panic!("a case without {k}: {c}"))
                    .to_owned()
            };
            let product = s("product");
            let absent = c.get("absent").and_then(Value::as_object);
            let all = surfaces[&product]
                .as_array()
                .unwrap_or_else(|| panic!("no surfaces for product {product}"));
            let surfaces = all
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .filter(|v| absent.is_none_or(|a| !a.contains_key(v)))
                .collect();
            Case {
                id: s("id"),
                product,
                state: s("state"),
                call: s("call"),
                args: c.get("args").cloned().unwrap_or(Value::Null),
                expect: s("expect"),
                surfaces,
            }
        })
        .collect()
}

/// A status by its name: HIXL's (`PARAM_INVALID` 103900 ...) and LLM-DataDist's
/// (`LLM_PARAM_INVALID` 0x5010B005 ...).
pub fn code(name: &str) -> Option<u32> {
    let hixl = [
        ("SUCCESS", 0),
        ("PARAM_INVALID", 103_900),
        ("TIMEOUT", 103_901),
        ("NOT_CONNECTED", 103_902),
        ("ALREADY_CONNECTED", 103_903),
        ("NOTIFY_FAILED", 103_904),
        ("UNSUPPORTED", 103_905),
        ("RESOURCE_EXHAUSTED", 203_900),
        ("FAILED", 503_900),
    ];
    let llm = [
        ("LLM_SUCCESS", 0),
        ("LLM_FAILED", 0xFFFF_FFFF),
        ("LLM_KV_CACHE_NOT_EXIST", 0x5010_B002),
        ("LLM_PARAM_INVALID", 0x5010_B005),
        ("LLM_NOT_YET_LINK", 0x5010_B007),
        ("LLM_ALREADY_LINK", 0x5010_B008),
        ("LLM_LINK_FAILED", 0x5010_B009),
        ("LLM_EXIST_LINK", 0x5010_B018),
        ("LLM_FEATURE_NOT_ENABLED", 0x5010_B019),
        ("LLM_TIMEOUT", 0x5010_B01A),
    ];
    hixl.iter()
        .chain(&llm)
        .find(|(n, _)| *n == name)
        .map(|(_, c)| *c)
}

/// The name of a status of `product` (for reports).
pub fn name(product: &str, status: u32) -> String {
    let hixl = [
        "SUCCESS",
        "PARAM_INVALID",
        "TIMEOUT",
        "NOT_CONNECTED",
        "ALREADY_CONNECTED",
        "NOTIFY_FAILED",
        "UNSUPPORTED",
        "RESOURCE_EXHAUSTED",
        "FAILED",
    ];
    let llm = [
        "LLM_SUCCESS",
        "LLM_FAILED",
        "LLM_KV_CACHE_NOT_EXIST",
        "LLM_PARAM_INVALID",
        "LLM_NOT_YET_LINK",
        "LLM_ALREADY_LINK",
        "LLM_LINK_FAILED",
        "LLM_EXIST_LINK",
        "LLM_FEATURE_NOT_ENABLED",
        "LLM_TIMEOUT",
    ];
    let names: &[&str] = if product == "datadist" { &llm } else { &hixl };
    names
        .iter()
        .find(|n| code(n) == Some(status))
        .map_or_else(|| format!("{status:#x}"), |n| (*n).to_owned())
}

/// Runs each case of `product` on `surface` with `run` (its status) and fails listing every
/// case whose status is not the table's.
pub fn check(cases: &[Case], product: &str, surface: &str, mut run: impl FnMut(&Case) -> u32) {
    let mut wrong = Vec::new();
    let mut ran = 0;
    for c in cases
        .iter()
        .filter(|c| c.product == product && c.runs_on(surface))
    {
        let got = run(c);
        ran += 1;
        if got != c.code() {
            wrong.push(format!(
                "{}: {} (the table: {})",
                c.id,
                name(product, got),
                c.expect
            ));
        }
    }
    eprintln!("{product} through {surface}: {ran} cases");
    assert!(ran > 0, "no {product} case runs on {surface}");
    assert!(
        wrong.is_empty(),
        "{} of {ran} {product} cases through {surface} differ from the table:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
