//! The published crates declare `rust-version = "1.85"`. Clippy's `incompatible_msrv` (denied
//! in the workspace lints) catches library items newer than that, but not language features.
//! The likeliest newer feature to slip in is the let chain (`if let A = b && c`, stable in
//! 1.88, and common in edition 2024 code elsewhere), so this test scans
//! every source file of the published crates for one. Comments, strings and char literals
//! are blanked out first. Known misses: a chain whose `if let` scrutinee holds a brace block
//! (`if let S { a } = v && c`, `= unsafe { .. } && c`): the scan takes the first `{` at the
//! condition's depth for the body. Other newer features (trait upcasting, 1.86) are not
//! scanned for.

use std::fs;
use std::path::{Path, PathBuf};

/// The source trees of the three published packages, and the `no_std` sketch.
const TREES: &[&str] = &[
    "throttle-core",
    "runtime-tokio",
    "runtime-async-std",
    "examples/no_std_sketch",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src` with comments, string literals and char literals replaced by spaces (newlines kept),
/// so that only code tokens remain. Raw strings with up to three `#` are handled.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0usize;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"' | b'#')) {
            let mut hashes = 0;
            let mut j = i + 1;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: Vec<u8> = core::iter::once(b'"')
                .chain(core::iter::repeat_n(b'#', hashes))
                .collect();
            let end = src[j + 1..]
                .find(std::str::from_utf8(&close).unwrap_or("\""))
                .map_or(b.len(), |k| j + 1 + k + close.len());
            for &x in &b[i..end] {
                blank(&mut out, x);
            }
            i = end;
        } else if c == b'"' {
            blank(&mut out, c);
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            if i < b.len() {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): blank only the former.
            let lit_end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|k| i + 3 + k)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 3)
            } else {
                None
            };
            match lit_end {
                Some(end) => {
                    for &x in &b[i..end] {
                        blank(&mut out, x);
                    }
                    i = end;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The words of `code` and the punctuation between them, with the bracket depth of each.
fn tokens(code: &str) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut Vec<(String, i32)>, depth: i32| {
        if !word.is_empty() {
            out.push((core::mem::take(word), depth));
        }
    };
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out, depth);
            match c {
                '(' | '[' => {
                    out.push((c.to_string(), depth));
                    depth += 1;
                }
                ')' | ']' => {
                    depth -= 1;
                    out.push((c.to_string(), depth));
                }
                '&' if chars.get(i + 1) == Some(&'&') => {
                    out.push(("&&".into(), depth));
                    i += 1;
                }
                c if c.is_whitespace() => {}
                c => out.push((c.to_string(), depth)),
            }
        }
        i += 1;
    }
    flush(&mut word, &mut out, depth);
    out
}

/// Line-free description of every let chain in `code`: an `&& let` anywhere, or an `&&` at
/// the condition's own bracket depth after `if let` / `while let`, before the body's `{`.
fn let_chains(code: &str) -> Vec<String> {
    let t = tokens(code);
    let mut found = Vec::new();
    for (i, (tok, depth)) in t.iter().enumerate() {
        if tok == "&&" && t.get(i + 1).is_some_and(|(n, _)| n == "let") {
            found.push(context(&t, i));
        }
        if (tok == "if" || tok == "while") && t.get(i + 1).is_some_and(|(n, _)| n == "let") {
            for (j, (inner, d)) in t.iter().enumerate().skip(i + 2) {
                if *d == *depth && (inner == "{" || inner == ";") {
                    break;
                }
                if *d == *depth && inner == "&&" {
                    found.push(context(&t, j));
                    break;
                }
            }
        }
    }
    found
}

fn context(t: &[(String, i32)], at: usize) -> String {
    let from = at.saturating_sub(6);
    let to = (at + 6).min(t.len());
    t[from..to]
        .iter()
        .map(|(s, _)| s.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_detector_finds_let_chains_and_nothing_else() {
    let chained = [
        "fn f() { if let Some(x) = a && x > 1 { } }",
        "fn f() { if a\n    && let Some(x) = b\n{ } }",
        "fn f() { while let Some(x) = it.next() && x.ok() { } }",
        "fn f() { if a && b && let Ok(y) = c { } }",
    ];
    for src in chained {
        assert_eq!(let_chains(&code_only(src)).len(), 1, "missed: {src}");
    }
    let plain = [
        "fn f() { if let Some(c) = v.iter().find(|c| c.a && c.b) { } }",
        "fn f() { if a && b { let x = 1; } }",
        "fn f() { if let Some(x) = a { if x && y { } } }",
        "fn f() { let s = \"if let a = b && c\"; } // && let",
        "fn f() { if matches!(x, Some(y) if y && z) { } }",
        "fn f<'a>(x: &'a str) { if let Some(c) = x.chars().next() { let _ = c == '&'; } }",
        "fn f() { let _ = r#\"&& let\"#; /* if let a = b && c */ }",
    ];
    for src in plain {
        assert!(let_chains(&code_only(src)).is_empty(), "false alarm: {src}");
    }
}

#[test]
fn published_crates_use_no_let_chains() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for tree in TREES {
        rust_files(&root.join(tree), &mut files);
    }
    assert!(
        files.len() > 50,
        "found only {} source files: is the workspace layout still the same?",
        files.len()
    );
    let mut bad = Vec::new();
    for f in &files {
        let src = fs::read_to_string(f).expect("source is UTF-8");
        for chain in let_chains(&code_only(&src)) {
            bad.push(format!("{}: … {chain} …", f.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "let chains need Rust 1.88, above the declared rust-version 1.85:\n{}",
        bad.join("\n")
    );
}
