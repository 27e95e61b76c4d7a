//! The documentation's links and pointers resolve, and the README's first program is the crate's
//! doctest.
//!
//! - Every relative link in the repository's markdown files (`README.md`, `docs/`,
//!   `python/README.md`, ...), inline `[text](path#anchor)` or a reference definition
//!   `[label]: path`, names a file or directory that exists, and its `#anchor` (also a bare
//!   `(#anchor)` in the same file) matches a heading of the target file as GitHub spells the
//!   heading's anchor (lower case; letters, digits, `-` and `_` kept, spaces to `-`, the rest
//!   dropped; `-1`, `-2` for repeats). Links with a scheme (`https:`, `mailto:`) are not fetched.
//! - Every path the prose cites in a code span (`tests/serving/hostile.rs::a_superseded_link_applies_nothing`,
//!   `ui-tests/forge_state.rs`, `tools/layers.sh`) exists, and the test or function named after
//!   `::` is defined in it: the pointers from promises to the tests that back them stay true
//!   when files move.
//! - The README's first Rust block is the crate's own doctest (`src/lib.rs`), the same code up to
//!   whitespace and rustdoc's hidden-line markers, so the first program a reader sees is one that
//!   `cargo test` compiles and runs.
//!
//! Code blocks and code spans are not links; headings inside code blocks are not headings.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The repository's markdown files, outside build output, fuzz data and hidden directories.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !(name.starts_with('.')
                    || ["target", "corpus", "artifacts", "node_modules"].contains(&name.as_str()))
                {
                    walk(&p, out);
                }
            } else if name.ends_with(".md") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &mut out);
    out.sort();
    out
}

/// The file's lines outside fenced code blocks (``` or ~~~), with their line numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| t.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m && t.trim_end().trim_start_matches(m).is_empty() => {
                fence = None
            }
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// A line with its code spans blanked (so `[x](y)` inside backticks is not a link), and the
/// code spans themselves.
fn split_code_spans(line: &str) -> (String, Vec<String>) {
    let b = line.as_bytes();
    let (mut prose, mut spans) = (String::new(), Vec::new());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'`' {
            let n = b[i..].iter().take_while(|&&c| c == b'`').count();
            let ticks = &line[i..i + n];
            if let Some(end) = line[i + n..].find(ticks) {
                spans.push(line[i + n..i + n + end].trim().to_owned());
                prose.push_str(&" ".repeat(n + end + n));
                i += n + end + n;
                continue;
            }
            prose.push_str(ticks);
            i += n;
            continue;
        }
        let c = line[i..].chars().next().unwrap();
        prose.push(c);
        i += c.len_utf8();
    }
    (prose, spans)
}

/// The destinations of inline links and images (`[text](dest)`, `![alt](dest)`) and reference
/// definitions (`[label]: dest`) in one line of prose.
fn link_targets(prose: &str) -> Vec<String> {
    let mut out = Vec::new();
    let t = prose.trim_start();
    if let Some((label, def)) = t.strip_prefix('[').and_then(|l| l.split_once("]:"))
        && !label.contains([']', '['])
        && let Some(dest) = def.split_whitespace().next()
    {
        out.push(dest.trim_matches(['<', '>']).to_owned());
    }
    let mut rest = prose;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        // the destination ends at the matching `)`; an optional title follows a space
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = i;
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let dest = after[..end].split_whitespace().next().unwrap_or("");
        out.push(dest.trim_matches(['<', '>']).to_owned());
        rest = &after[end.min(after.len())..];
    }
    out
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    // the rendered text: a link's text without its destination, no emphasis or code markers
    let mut text = String::new();
    let mut rest = heading;
    while let Some(at) = rest.find("](") {
        text.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        rest = after.find(')').map_or("", |c| &after[c + 1..]);
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown file's headings (ATX, outside code blocks), with GitHub's suffixes
/// for repeats, and any explicit `id="..."` / `name="..."` of HTML elements.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let t = line.trim_start();
        let hashes = t.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && t[hashes..].starts_with(' ') {
            let body = t[hashes..].trim().trim_end_matches('#').trim();
            let base = slug(body);
            let n = seen.entry(base.clone()).or_insert(0);
            out.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                let v = &rest[at + attr.len()..];
                let end = v.find('"').unwrap_or(v.len());
                out.insert(v[..end].to_owned());
                rest = &v[end..];
            }
        }
    }
    out
}

/// `a/./b/../c` → `a/c`, without touching the file system.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = markdown_files();
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "no README.md found under {}",
        root().display()
    );
    let mut cache: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut anchors_of = |p: &Path| -> Option<BTreeSet<String>> {
        if !cache.contains_key(p) {
            cache.insert(p.to_owned(), anchors(&fs::read_to_string(p).ok()?));
        }
        cache.get(p).cloned()
    };
    let (mut checked, mut bad) = (0, Vec::new());
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        for (n, line) in prose_lines(&text) {
            let (prose, _) = split_code_spans(line);
            for dest in link_targets(&prose) {
                let scheme = dest.split_once(':').is_some_and(|(s, _)| {
                    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphabetic())
                });
                if dest.is_empty() || scheme {
                    continue;
                }
                checked += 1;
                let (path, anchor) = dest.split_once('#').unwrap_or((&dest, ""));
                let target = if path.is_empty() {
                    file.clone()
                } else if let Some(abs) = path.strip_prefix('/') {
                    root().join(abs)
                } else {
                    normalize(&file.parent().unwrap().join(path))
                };
                let at = format!("{}:{n}: ({dest})", rel(file));
                if !target.exists() {
                    bad.push(format!("{at}: {} does not exist", rel(&target)));
                    continue;
                }
                if anchor.is_empty() {
                    continue;
                }
                if target.extension().is_none_or(|e| e != "md") {
                    bad.push(format!("{at}: an anchor into a file that is not markdown"));
                    continue;
                }
                let have = anchors_of(&target).unwrap();
                if !have.contains(anchor) {
                    bad.push(format!(
                        "{at}: no heading of {} has the anchor #{anchor} (it has: {})",
                        rel(&target),
                        have.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {checked} links do not resolve:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(
        checked > 20,
        "only {checked} relative links found: is the parser broken?"
    );
}

/// Paths in code spans that name files of other projects (CANN's HIXL), not ours.
const FOREIGN: &[&str] = &[
    "tests/python/test_hixl_engine_api.py",
    "examples/python/hixl/hixl_d2rd_multiproc_sample.py",
    "src/python/hixl_py/hixl_py.cc",
];

/// The top-level directories whose paths the prose cites.
const CITED: &[&str] = &[
    ".ci/",
    "docs/",
    "examples/",
    "fuzz/",
    "hixl-capi/",
    "include/hixl",
    "python/",
    "src/",
    "tests/",
    "tools/",
    "ui-tests/",
];

#[test]
fn every_cited_path_and_test_exists() {
    let (mut checked, mut bad) = (0, Vec::new());
    for file in markdown_files() {
        let text = fs::read_to_string(&file).unwrap();
        for (n, line) in prose_lines(&text) {
            for span in split_code_spans(line).1 {
                // `path`, `path::test_name`; not commands, globs, placeholders or lists
                let (path, item) = span.split_once("::").unwrap_or((&span, ""));
                if !CITED.iter().any(|d| path.starts_with(d))
                    || path.contains(|c: char| c.is_whitespace() || "*{}<>$,|".contains(c))
                    || FOREIGN.contains(&path)
                    // hixl has no `.cc` file: such a path is HIXL's (`src/llm_datadist/...`)
                    || path.ends_with(".cc")
                {
                    continue;
                }
                let target = root().join(path.trim_end_matches('/'));
                checked += 1;
                let at = format!("{}:{n}: `{span}`", rel(&file));
                if !target.exists() {
                    bad.push(format!("{at}: {path} does not exist"));
                    continue;
                }
                if item.is_empty() || !item.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let body = fs::read_to_string(&target).unwrap_or_default();
                let defined = [format!("fn {item}("), format!("def {item}(")]
                    .iter()
                    .any(|d| body.contains(d.as_str()));
                if !defined {
                    bad.push(format!("{at}: {path} defines no `{item}`"));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {checked} cited paths do not resolve:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(
        checked > 20,
        "only {checked} cited paths found: is the parser broken?"
    );
}

/// The lines of the first fenced block of `lang` in markdown `text`.
fn first_block<'a>(text: &'a str, opening: &str) -> Vec<&'a str> {
    let mut lines = text.lines().skip_while(|l| l.trim() != opening);
    assert!(lines.next().is_some(), "no {opening} block");
    lines.take_while(|l| l.trim() != "```").collect()
}

#[test]
fn the_readme_program_is_the_crate_doctest() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let lib = fs::read_to_string(root().join("src/lib.rs")).unwrap();
    // the crate docs, as rustdoc sees them
    let docs: String = lib
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    // the first Rust block of the crate docs (a bare ``` is Rust to rustdoc)
    let opening = docs
        .lines()
        .map(str::trim)
        .find(|l| *l == "```" || *l == "```rust")
        .expect("no Rust block in the crate docs");
    let doctest: String = first_block(&docs, opening)
        .into_iter()
        .map(|l| {
            let t = l.trim_start();
            // rustdoc's hidden lines: `# code`, or a lone `#`
            if t == "#" {
                ""
            } else {
                t.strip_prefix("# ").unwrap_or(l)
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let shown = first_block(&readme, "```rust").join("\n");
    let squeeze = |s: &str| s.split_whitespace().collect::<String>();
    assert_eq!(
        squeeze(&shown),
        squeeze(&doctest),
        "README.md's first ```rust block differs from the doctest of src/lib.rs (up to whitespace);\
         \nREADME:\n{shown}\n\ndoctest:\n{doctest}"
    );
}

#[test]
fn the_slugs_are_githubs() {
    assert_eq!(
        slug("What is guaranteed, and what is yours"),
        "what-is-guaranteed-and-what-is-yours"
    );
    assert_eq!(slug("HIXL's calls on hixl"), "hixls-calls-on-hixl");
    assert_eq!(
        slug("The Pythonic layer: `hixl.Engine`"),
        "the-pythonic-layer-hixlengine"
    );
    assert_eq!(
        slug("The main benchmark (`examples/bench.rs`)"),
        "the-main-benchmark-examplesbenchrs"
    );
    assert_eq!(
        slug("TCP: latency, connect, registration"),
        "tcp-latency-connect-registration"
    );
    assert_eq!(slug("A [linked](x.md) heading"), "a-linked-heading");
    let a = anchors("# A\n\n```\n# not a heading\n```\n\n## A\n### b_c-d\n");
    assert_eq!(
        a.into_iter().collect::<Vec<_>>(),
        ["a", "a-1", "b_c-d"].map(String::from)
    );
    assert_eq!(
        link_targets("see [x](a.md#b), ![i](p.png \"t\") and [y](https://e.org)"),
        ["a.md#b", "p.png", "https://e.org"].map(String::from)
    );
    assert_eq!(
        link_targets("[ref]: docs/x.md"),
        ["docs/x.md"].map(String::from)
    );
    let (prose, spans) = split_code_spans("a `[x](nope.md)` b `tests/x.rs::f`");
    assert!(link_targets(&prose).is_empty());
    assert_eq!(spans, ["[x](nope.md)", "tests/x.rs::f"].map(String::from));
}
