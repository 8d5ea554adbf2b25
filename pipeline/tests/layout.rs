//! The code's layout rules, checked on the sources: no file over 600 lines in any library
//! `src/`, and no import circle between the files of a crate (file a → file b when a names a
//! path into b through `crate::`, `super::` or `self::`; a child file naming an ancestor folder
//! module — `use super::*` — does not count, and unit-test modules are left out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: &[&str] = &[
    "seam",
    "engine",
    "backends",
    "kernels",
    "checkpoints",
    "frontend",
    "service",
    "pipeline",
    "python",
    "testkit",
];
const MAX_LINES: usize = 600;

type Module = Vec<String>;

fn root() -> PathBuf {
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

/// `src/a/b.rs` and `src/a/b/mod.rs` -> `["a", "b"]`; `src/lib.rs` -> `[]`.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Module = rel
        .iter()
        .map(|s| s.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The source without comments and without a trailing `#[cfg(test)] mod tests { .. }`.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::a::b…`, `super::…`, `self::…` path in `code`, as its segments.
fn paths(code: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let bytes: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if ident(bytes[i]) && (i == 0 || !ident(bytes[i - 1])) {
            let mut j = i;
            let mut segs = Vec::new();
            loop {
                let s = j;
                while j < bytes.len() && ident(bytes[j]) {
                    j += 1;
                }
                segs.push(bytes[s..j].iter().collect::<String>());
                if j + 2 < bytes.len()
                    && bytes[j] == ':'
                    && bytes[j + 1] == ':'
                    && ident(bytes[j + 2])
                {
                    j += 2;
                } else {
                    break;
                }
            }
            if segs.len() > 1 && matches!(segs[0].as_str(), "crate" | "super" | "self") {
                out.push(segs);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The file-level import graph of one crate's `src/`.
fn graph(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Module, PathBuf> = files
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, f) in &modules {
        if m.last().is_some_and(|s| s == "tests") {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("readable source");
        for p in paths(&code(&text)) {
            let mut at: Module = match p[0].as_str() {
                "crate" => Vec::new(),
                // `self` / `super` resolve from the file's module
                _ => m.clone(),
            };
            let mut rest = &p[..];
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "crate" | "self" => {}
                    "super" => {
                        at.pop();
                    }
                    _ => break,
                }
                rest = &rest[1..];
            }
            for seg in rest {
                let mut next = at.clone();
                next.push(seg.clone());
                if modules.contains_key(&next) {
                    at = next;
                } else {
                    break;
                }
            }
            // a child naming an ancestor folder module (`use super::*`) does not count
            if at != *m && modules.contains_key(&at) && !m.starts_with(&at) {
                edges.entry(m.clone()).or_default().insert(at);
            }
        }
    }
    edges
}

/// The circles (strongly connected components of more than one file) of `edges`.
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<BTreeSet<Module>> {
    let nodes: BTreeSet<&Module> = edges
        .iter()
        .flat_map(|(a, bs)| std::iter::once(a).chain(bs))
        .collect();
    let reach = |from: &Module| -> BTreeSet<Module> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(v) = stack.pop() {
            for w in edges.get(&v).into_iter().flatten() {
                if seen.insert(w.clone()) {
                    stack.push(w.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&Module, BTreeSet<Module>> =
        nodes.iter().map(|&n| (n, reach(n))).collect();
    let mut out: Vec<BTreeSet<Module>> = Vec::new();
    for &a in &nodes {
        let comp: BTreeSet<Module> = nodes
            .iter()
            .filter(|&&b| b != a && reaches[a].contains(b) && reaches[b].contains(a))
            .map(|&b| b.clone())
            .chain(std::iter::once(a.clone()))
            .collect();
        if comp.len() > 1 && !out.contains(&comp) {
            out.push(comp);
        }
    }
    out
}

#[test]
fn no_library_file_is_over_600_lines() {
    let mut long = Vec::new();
    for c in CRATES {
        let mut files = Vec::new();
        rust_files(&root().join(c).join("src"), &mut files);
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
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
}

#[test]
fn no_import_circle_between_files() {
    let mut found = Vec::new();
    for c in CRATES {
        for circle in circles(&graph(&root().join(c).join("src"))) {
            let names: Vec<String> = circle.iter().map(|m| m.join("::")).collect();
            found.push(format!("{c}: {names:?}"));
        }
    }
    assert!(found.is_empty(), "import circles: {found:#?}");
}

/// The checker sees a circle where there is one, and not the child-to-parent `use super::*`.
#[test]
fn the_checker_finds_a_circle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).expect("mkdir");
    std::fs::write(src.join("lib.rs"), "mod a; mod b;").expect("write");
    std::fs::write(src.join("a/mod.rs"), "mod c; use crate::b::X; use c::Y;").expect("write");
    std::fs::write(src.join("a/c.rs"), "use super::*;").expect("write");
    std::fs::write(src.join("b.rs"), "use crate::a::Z; // crate::nothing::here").expect("write");
    let c = circles(&graph(src));
    assert_eq!(c.len(), 1, "{c:?}");
    let names: Vec<String> = c[0].iter().map(|m| m.join("::")).collect();
    assert_eq!(names, ["a", "b"]);
    std::fs::write(src.join("b.rs"), "pub struct X;").expect("write");
    assert!(circles(&graph(src)).is_empty());
}
