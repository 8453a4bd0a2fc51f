//! The server crate's module layers, checked from its source: every
//! `crate::…` and `super::…` path is an edge from the file's module to the
//! module it names.
//!
//! * Across top-level modules, an edge may only go down the layer table
//!   (`LAYERS`, drawn in docs/design.md): no top-level module imports one
//!   of its own layer or above, so no cycle among them.
//! * Inside a folder, its files (and subfolders) must not import each
//!   other in a cycle either (a folder's `mod.rs` holds what its children
//!   share, so child → parent edges are allowed).
//!
//! Test code (`#[cfg(test)]` to the end of a file) and comments are not
//! looked at.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules, lowest layer first. A module may import only from
/// lower layers.
const LAYERS: &[(&str, u32)] = &[
    ("config", 0),
    ("ids", 0),
    ("log", 1),
    ("failpoints", 0),
    ("metrics", 1),
    ("tls", 1),
    ("auth", 2),
    ("error", 3),
    ("apply", 4),
    ("raft", 5),
    ("server", 6),
    ("api", 7),
    ("run", 8),
];

/// Every `.rs` file under `dir` (recursively).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a source file: `api/grpc/kv.rs` → `api::grpc::kv`,
/// `api/mod.rs` → `api`. None for the crate root, binaries and test files.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts[0] == "bin" || parts == ["lib"] || parts == ["main"] {
        return None;
    }
    let mut parts = parts;
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.last().is_some_and(|p| p == "tests") {
        return None; // a test-only module file
    }
    Some(parts.join("::"))
}

/// The code of a file without comments and without its test module.
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The identifiers after each occurrence of `prefix` (`a::b::c`).
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // `xcrate::` or `a::super::`
        }
        let mut segs = Vec::new();
        let mut s = rest;
        loop {
            let n = s
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(s.len());
            if n == 0 {
                break;
            }
            segs.push(s[..n].to_string());
            s = &s[n..];
            match s.strip_prefix("::") {
                Some(r) => s = r,
                None => break,
            }
        }
        out.push(segs);
    }
    out
}

/// The longest prefix of `segs` that is a known module.
fn resolve(segs: &[String], modules: &BTreeSet<String>) -> Option<String> {
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find(|m| modules.contains(m))
}

fn parent(m: &str) -> String {
    m.rsplit_once("::")
        .map_or(String::new(), |(p, _)| p.to_string())
}

/// Whether `m` is `folder` or inside it.
fn within(m: &str, folder: &str) -> bool {
    folder.is_empty() || m == folder || m.starts_with(&format!("{folder}::"))
}

/// The child of `folder` that `m` is in (`m` strictly inside `folder`).
fn child_of(m: &str, folder: &str) -> String {
    let rest = if folder.is_empty() {
        m
    } else {
        &m[folder.len() + 2..]
    };
    let first = rest.split("::").next().unwrap_or(rest);
    if folder.is_empty() {
        first.to_string()
    } else {
        format!("{folder}::{first}")
    }
}

/// A cycle in `graph`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    let mut c = stack[at..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = visit(m, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// (from module, to module) for every path in the crate's code.
fn edges() -> (BTreeSet<String>, Vec<(String, String)>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut texts = Vec::new();
    let mut modules = BTreeSet::new();
    for f in files {
        if let Some(m) = module_of(&src, &f) {
            modules.insert(m.clone());
            texts.push((m, std::fs::read_to_string(&f).unwrap()));
        }
    }
    let mut edges = Vec::new();
    for (m, text) in &texts {
        let code = code(text);
        for segs in paths_after(&code, "crate::") {
            if let Some(to) = resolve(&segs, &modules) {
                edges.push((m.clone(), to));
            }
        }
        // `super` is the parent module both for `folder/file.rs`
        // (`folder::file` → `folder`) and for `folder/mod.rs` (`folder` →
        // its parent).
        let sup = parent(m);
        for segs in paths_after(&code, "super::") {
            let mut full: Vec<String> = sup
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            full.extend(segs);
            let to = resolve(&full, &modules).unwrap_or_else(|| sup.clone());
            if !to.is_empty() {
                edges.push((m.clone(), to));
            }
        }
    }
    (modules, edges)
}

#[test]
fn test_top_level_modules_import_only_lower_layers() {
    let (_, edges) = edges();
    let layer: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut bad = BTreeSet::new();
    for (from, to) in &edges {
        let (a, b) = (child_of(from, ""), child_of(to, ""));
        if a == b {
            continue;
        }
        let la = *layer
            .get(a.as_str())
            .unwrap_or_else(|| panic!("top-level module {a} is not in LAYERS"));
        let lb = *layer
            .get(b.as_str())
            .unwrap_or_else(|| panic!("top-level module {b} is not in LAYERS"));
        if la <= lb {
            bad.insert(format!(
                "{from} -> {to} ({a} is layer {la}, {b} layer {lb})"
            ));
        }
    }
    assert!(bad.is_empty(), "imports against the layers:\n{bad:#?}");
}

#[test]
fn test_no_import_cycle_inside_a_folder() {
    let (modules, edges) = edges();
    let folders: BTreeSet<String> = modules
        .iter()
        .map(|m| parent(m))
        .chain(std::iter::once(String::new()))
        .collect();
    for folder in folders {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in &edges {
            let inside = |m: &str| within(m, &folder) && m != folder;
            if !inside(from) || !inside(to) {
                continue;
            }
            let (a, b) = (child_of(from, &folder), child_of(to, &folder));
            if a != b {
                graph.entry(a).or_default().insert(b);
            }
        }
        if let Some(c) = find_cycle(&graph) {
            panic!("import cycle in {folder:?}: {}", c.join(" -> "));
        }
    }
}

#[test]
fn test_the_checker_sees_imports() {
    // the checker itself: it finds the edges it must (a broken parser
    // would pass every rule above)
    let (modules, edges) = edges();
    assert!(modules.contains("raft::node") && modules.contains("api::grpc::kv"));
    let has = |a: &str, b: &str| edges.iter().any(|(f, t)| f == a && t == b);
    assert!(has("raft::node", "apply"), "raft::node uses the applier");
    assert!(
        has("api::grpc::kv", "server"),
        "the KV service calls the server"
    );
    assert!(has("api::grpc::watch_server", "api::grpc::watch"));
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert!(find_cycle(&g).is_some());
}
