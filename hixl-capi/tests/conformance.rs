//! The conformance table (`tests/conformance/cases.json`, issue 44) through C and C++: the
//! engine's cases through `libhixl`'s `hixl_*`, LLM-DataDist's through `hixl_dd_*` and through
//! `libllm_datadist`'s `llm_datadist::LlmDataDist` (CANN's C++ class), HIXL-CS's through
//! `HixlCS*`. This process holds the peers (an engine and an LLM-DataDist cluster, each on a
//! port the OS chose); the programs (`tests/c/conformance.c` with `conformance_cs.c`,
//! `tests/cpp/conformance.cpp`) take one case a line, rendered here into their words, and
//! answer its status. The same table runs through Rust (`tests/conformance/`) and Python
//! (`python/tests/test_conformance.py`).

extern crate hixl_rs as hixl;

mod common;
#[path = "../../tests/conformance/peer.rs"]
mod peer;
#[path = "../../tests/conformance/table.rs"]
mod table;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use peer::{DdPeer, EnginePeer, ME, PEER};
use serde_json::Value;
use table::Case;

fn cases() -> Vec<Case> {
    table::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/conformance/cases.json"))
}

/// A program answering one case a line.
struct Program {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Program {
    fn spawn(mut cmd: Command) -> Program {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the conformance program");
        Program {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
        }
    }

    /// The status the program answers `line` with.
    fn ask(&mut self, id: &str, line: &str) -> u32 {
        writeln!(self.stdin, "{line}").expect("the program takes a line");
        let mut got = String::new();
        assert!(
            self.stdout.read_line(&mut got).unwrap() > 0,
            "{id}: the program ended ({:?}) at `{line}`",
            self.child.wait()
        );
        got.trim()
            .strip_prefix("STATUS ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{id}: `{line}` answered {got:?}"))
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A string in the programs' words: `~` for "", `%` escapes for spaces.
fn esc(s: &str) -> String {
    if s.is_empty() {
        return "~".into();
    }
    s.replace('%', "%25").replace(' ', "%20")
}

/// A list in the programs' words: comma-separated, `-` for none.
fn list(v: &[i64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

fn engine_line(c: &Case) -> String {
    let head = format!("engine {} {}", c.state, c.call);
    match c.call.as_str() {
        "initialize" => {
            let opts = c.arg("options").as_object().cloned().unwrap_or_default();
            let pairs: Vec<String> = opts
                .iter()
                .map(|(k, v)| format!("{} {}", esc(k), esc(v.as_str().unwrap())))
                .collect();
            let name = esc(c.str("name", ""));
            format!("{head} {name} {} {}", pairs.len(), pairs.join(" "))
        }
        "register" => format!("{head} {} {}", c.str("addr", "fresh"), c.int("len", 0)),
        "connect" | "disconnect" => format!(
            "{head} {} {}",
            c.str("remote", "peer"),
            c.int("timeout", 1000)
        ),
        "notify" => format!(
            "{head} {} {} {} {}",
            c.str("remote", "peer"),
            c.int("timeout", 1000),
            c.int("name_len", 11),
            c.int("msg_len", 1)
        ),
        "transfer" => {
            let op = match &c.args["op"] {
                Value::String(s) if s == "read" => 0,
                Value::String(_) => 1,
                v => v.as_i64().unwrap(),
            };
            let descs = c.arg("descs").as_array().unwrap();
            let words: Vec<String> = descs
                .iter()
                .map(|d| {
                    let a = d.as_array().unwrap();
                    let w: Vec<String> = a
                        .iter()
                        .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
                        .collect();
                    w.join(" ")
                })
                .collect();
            format!(
                "{head} {op} {} {} {}",
                descs.len(),
                words.join(" "),
                c.int("timeout", 1000)
            )
        }
        _ => head,
    }
}

/// LLM-DataDist's case in the programs' words: the peer's cache by id (the C ABI's and C++'s
/// one form); `cpp` adds a push's Cache argument.
fn dd_line(c: &Case, peer: &DdPeer, cpp: bool) -> String {
    let head = format!("dd {} {}", c.state, c.call);
    let key = c.arg("key");
    let cluster = match key["cluster"].as_str() {
        Some("own") => ME,
        Some("unknown") => 77,
        _ => PEER,
    };
    let cache = key["id"].as_i64().unwrap_or(match key["cache"].as_str() {
        Some("blocks") => peer.blocks_id,
        Some("batches") => peer.batches_id,
        _ => 99,
    });
    let key_batch = key["batch"].as_i64().unwrap_or(0);
    let layers = c.ints("layers");
    let layers = if layers.is_empty() {
        vec![-1; 4]
    } else {
        layers
    };
    let tail = format!(
        "{} {} {} {} {} {}",
        layers[0],
        layers[1],
        layers[2],
        layers[3],
        c.int("per_layer", 2),
        match c.str("local", "") {
            "blocks" => 1,
            "batches" => 2,
            _ => 99,
        }
    );
    let arg = if cpp && c.call.starts_with("push") {
        let placement = u8::from(c.str("arg_placement", "device") == "device");
        format!(" {placement} {}", c.int("arg_tensors", 4))
    } else {
        String::new()
    };
    match c.call.as_str() {
        "pull_blocks" | "push_blocks" => format!(
            "{head} {cluster} {cache} {key_batch} {} {} {tail}{arg}",
            list(&c.ints("src")),
            list(&c.ints("dst"))
        ),
        "pull_cache" | "push_cache" => format!(
            "{head} {cluster} {cache} {key_batch} {} {} {tail}{arg}",
            c.int("batch", 0),
            c.int("size", -1)
        ),
        "register" => format!("{head} {}", c.str("addrs", "ok")),
        "unregister" => format!("{head} {}", c.int("id", 0)),
        "link" | "unlink" => format!(
            "{head} {} {} {}",
            if c.str("cluster", "peer") == "own" {
                ME
            } else {
                PEER
            },
            c.int("timeout", 1000),
            u8::from(c.arg("address") != &Value::Bool(false))
        ),
        other => panic!("{}: call {other}", c.id),
    }
}

fn cs_line(c: &Case) -> String {
    let head = format!("cs {} {}", c.state, c.call);
    let given = |k: &str| u8::from(!(c.has(k) && c.arg(k).is_null()));
    match c.call.as_str() {
        "server_create" => format!(
            "{head} {} {} {} {} {} {} {}",
            given("desc"),
            given("config"),
            given("out"),
            c.int("port", 0),
            match c.arg("ip") {
                Value::Null if c.has("ip") => "null".to_owned(),
                v => esc(v.as_str().unwrap_or("127.0.0.1")),
            },
            match c.arg("endpoints") {
                Value::Null if c.has("endpoints") => "null".to_owned(),
                v => v.as_i64().unwrap_or(1).to_string(),
            },
            esc(c.arg("config").as_str().unwrap_or(""))
        ),
        "server_reg_mem" => format!(
            "{head} {} {} {} {} {} {}",
            c.str("server", "ok"),
            given("mem"),
            given("out"),
            c.int("len", 16),
            c.int("type", 1),
            c.int("offset", 4096)
        ),
        "server_unreg_mem" => format!("{head} {}", c.str("mem", "unknown")),
        "client_create" => format!("{head} {} {}", given("desc"), c.int("port", 1)),
        _ => head,
    }
}

/// `tests/<rel>` of this crate.
fn source(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(rel)
}

#[test]
fn conformance_cases_through_c() {
    let Some(cc) = common::compiler("cc") else {
        return;
    };
    let dir = common::scratch("conformance-c");
    let exe = dir.join("conformance");
    let flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"];
    common::build(
        &cc,
        &flags,
        "hixl",
        &[source("c/conformance.c"), source("c/conformance_cs.c")],
        &exe,
    );
    let (engine, dd) = (EnginePeer::start(), DdPeer::start());
    let mut cmd = common::clean_command(&exe);
    cmd.arg(&engine.name)
        .arg(engine.region.to_string())
        .arg(dd.addr.ip().to_string())
        .arg(dd.addr.port().to_string());
    let mut p = Program::spawn(cmd);
    let cases = cases();
    table::check(&cases, "engine", "c", |c| p.ask(&c.id, &engine_line(c)));
    table::check(&cases, "datadist", "c", |c| {
        p.ask(&c.id, &dd_line(c, &dd, false))
    });
    table::check(&cases, "cs", "c", |c| p.ask(&c.id, &cs_line(c)));
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn datadist_cases_through_cpp() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    let lib = common::lib_dir();
    if !lib.join("libllm_datadist.so").exists() {
        eprintln!("skipped: no libllm_datadist.so (built only where a C++ compiler is)");
        return;
    }
    let dir = common::scratch("conformance-cpp");
    let exe = dir.join("conformance");
    common::build(
        &cxx,
        &common::HIXL_EXAMPLE_FLAGS,
        "llm_datadist",
        &[source("cpp/conformance.cpp")],
        &exe,
    );
    let dd = DdPeer::start();
    let mut cmd = common::clean_command(&exe);
    cmd.env("LD_LIBRARY_PATH", &lib)
        .arg(dd.addr.ip().to_string())
        .arg(dd.addr.port().to_string());
    let mut p = Program::spawn(cmd);
    table::check(&cases(), "datadist", "cpp", |c| {
        p.ask(&c.id, &dd_line(c, &dd, true))
    });
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}
