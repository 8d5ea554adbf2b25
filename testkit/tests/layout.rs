//! The source layout's rules, checked over every library crate's `src/`: no file over 600 lines,
//! and no import circle between files (a file's `crate::` / `super::` / `self::` paths, comments
//! and test modules left out, resolved to the file that defines the module they name; a folder
//! module's children may use their parent, which is the module tree, not an import).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: &[&str] = &[
    "seam",
    "engine",
    "kernels",
    "backends",
    "checkpoints",
    "frontend",
    "pipeline",
    "service",
    "python",
    "testkit",
];
const MAX_LINES: usize = 600;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a source file under `src` (`lib.rs` / `main.rs` / `mod.rs` name their
/// folder).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file
        .strip_prefix(src)
        .expect("under src")
        .with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The source without comments and without a trailing `#[cfg(test)] mod tests { … }`.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::a::b…` / `super::…` / `self::…` path in `code`, as its segments (the head
/// included).
fn paths(code: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts = (i == 0 || !ident(bytes[i - 1]))
            && ["crate::", "super::", "self::"]
                .iter()
                .any(|h| bytes[i..].starts_with(h.as_bytes()));
        if !starts {
            i += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let s = j;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            if s == j {
                break;
            }
            segs.push(code[s..j].to_string());
            if bytes[j..].starts_with(b"::") {
                j += 2;
            } else {
                break;
            }
        }
        out.push(segs);
        i = j.max(i + 1);
    }
    out
}

/// The file-level import graph of one crate: module → modules (files) it imports.
fn graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).expect("readable source");
        let mut targets = BTreeSet::new();
        for p in paths(&code(&text)) {
            // `self::` names this module, `super::` its parent (a `mod.rs` file is its folder's
            // module, so the same rule holds for it), `crate::` the root
            let mut base: Vec<String> = match p[0].as_str() {
                "crate" => Vec::new(),
                "self" => module.clone(),
                _ => module[..module.len().saturating_sub(1)].to_vec(),
            };
            let mut rest = &p[1..];
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            let full: Vec<String> = base.iter().chain(rest).cloned().collect();
            // the longest prefix that is a file's module
            let target = (1..=full.len())
                .rev()
                .map(|n| full[..n].to_vec())
                .find(|m| modules.contains_key(m));
            if let Some(t) = target {
                // a module's own ancestors are its module tree, not imports
                if t != *module && !module.starts_with(&t) {
                    targets.insert(t);
                }
            }
        }
        edges.insert(module.clone(), targets);
    }
    edges
}

/// Strongly connected components with more than one module (Tarjan).
fn circles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on: BTreeSet<&'a Vec<String>>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a Vec<String>) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        let edges = t.edges;
        for w in edges.get(v).into_iter().flatten() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.join("/"));
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_library_source_file_is_over_600_lines() {
    let mut long = Vec::new();
    for c in CRATES {
        let mut files = Vec::new();
        rust_files(&workspace().join(c).join("src"), &mut files);
        for f in files {
            let n = std::fs::read_to_string(&f)
                .expect("readable")
                .lines()
                .count();
            if n > MAX_LINES {
                long.push(format!("{} ({n} lines)", f.display()));
            }
        }
    }
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:#?}");
}

#[test]
fn no_crate_has_an_import_circle_between_files() {
    let mut found = Vec::new();
    for c in CRATES {
        for comp in circles(&graph(&workspace().join(c).join("src"))) {
            found.push(format!("{c}: {comp:?}"));
        }
    }
    assert!(found.is_empty(), "import circles: {found:#?}");
}

/// The checker finds a circle where there is one.
#[test]
fn a_circle_is_found() {
    let m = |s: &str| vec![s.to_string()];
    let mut edges = BTreeMap::new();
    edges.insert(m("a"), BTreeSet::from([m("b")]));
    edges.insert(m("b"), BTreeSet::from([m("c")]));
    edges.insert(m("c"), BTreeSet::from([m("a")]));
    edges.insert(m("d"), BTreeSet::from([m("a")]));
    assert_eq!(circles(&edges), vec![vec!["a", "b", "c"]]);
    let segs = paths("use super::super::x::{y}; crate::a::B; not_crate::z");
    assert_eq!(segs[0], ["super", "super", "x"]);
    assert_eq!(segs[1], ["crate", "a", "B"]);
    assert_eq!(segs.len(), 2);
}
