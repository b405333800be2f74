//! The packaging files against the source tree, checked without a container engine
//! (tests/image.sh builds the image and runs it).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The top-level entries the Dockerfile's build stage copies (`COPY <src>... <dest>` after
/// `FROM ... AS build` and before its `cargo build`).
fn copied_by_the_build_stage() -> BTreeSet<String> {
    let dockerfile = fs::read_to_string(Path::new(ROOT).join("docker/Dockerfile")).unwrap();
    let mut copied = BTreeSet::new();
    let mut in_build_stage = false;
    for line in dockerfile.lines() {
        let line = line.trim();
        if line.starts_with("FROM ") {
            in_build_stage = line.ends_with(" AS build");
            continue;
        }
        if !in_build_stage {
            continue;
        }
        if line.starts_with("RUN ") && line.contains("cargo build") {
            break;
        }
        if let Some(rest) = line.strip_prefix("COPY ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            for source in &words[..words.len() - 1] {
                copied.insert(source.trim_end_matches('/').to_string());
            }
        }
    }
    copied
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The files `src/` compiles in with `include_str!` / `include_bytes!`, as paths from the
/// repository root.
fn included_by_src() -> Vec<(PathBuf, PathBuf)> {
    let mut files = Vec::new();
    rust_files(&Path::new(ROOT).join("src"), &mut files);
    let mut included = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        for macro_name in ["include_str!(\"", "include_bytes!(\""] {
            for (at, _) in text.match_indices(macro_name) {
                let rest = &text[at + macro_name.len()..];
                let relative = &rest[..rest.find('"').unwrap()];
                let mut path = file.parent().unwrap().to_path_buf();
                for component in Path::new(relative).components() {
                    match component {
                        Component::ParentDir => {
                            path.pop();
                        }
                        Component::Normal(name) => path.push(name),
                        _ => {}
                    }
                }
                let from_root = path.strip_prefix(ROOT).unwrap().to_path_buf();
                included.push((file.strip_prefix(ROOT).unwrap().to_path_buf(), from_root));
            }
        }
    }
    included
}

/// `docker build` compiles the crate from what the build stage copied: every file `src/`
/// includes must be in it (sql/slot_record.sql was not, and the image did not build).
#[test]
fn the_dockerfile_copies_every_file_the_crate_includes() {
    let copied = copied_by_the_build_stage();
    assert!(copied.contains("src"), "the build stage copies {copied:?}");
    let included = included_by_src();
    assert!(
        included
            .iter()
            .any(|(_, path)| path == Path::new("sql/slot_record.sql")),
        "the scan finds src/'s include_str! of sql/slot_record.sql: {included:?}"
    );
    for (file, path) in included {
        let top = path
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        assert!(
            copied.contains(top.as_ref()) || copied.contains(path.to_string_lossy().as_ref()),
            "{} includes {}, which docker/Dockerfile's build stage does not copy (it copies \
             {copied:?})",
            file.display(),
            path.display()
        );
    }
}

/// The sources of every `COPY` in docker/Dockerfile that reads the build context (not
/// `--from=` another stage).
fn copied_from_the_context() -> BTreeSet<String> {
    let dockerfile = fs::read_to_string(Path::new(ROOT).join("docker/Dockerfile")).unwrap();
    let mut copied = BTreeSet::new();
    for line in dockerfile.lines() {
        if let Some(rest) = line.trim().strip_prefix("COPY ") {
            if rest.starts_with("--from=") {
                continue;
            }
            let words: Vec<&str> = rest.split_whitespace().collect();
            for source in &words[..words.len() - 1] {
                copied.insert(source.trim_end_matches('/').to_string());
            }
        }
    }
    copied
}

/// .dockerignore leaves out everything (`*`) and lets through what the image needs: each file
/// or folder the Dockerfile copies from the context must be let through by name.
#[test]
fn the_dockerignore_lets_through_what_the_dockerfile_copies() {
    let ignore = fs::read_to_string(Path::new(ROOT).join(".dockerignore")).unwrap();
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        patterns.first(),
        Some(&"*"),
        ".dockerignore starts by leaving out everything"
    );
    let let_through: BTreeSet<String> = patterns
        .iter()
        .filter_map(|p| p.strip_prefix('!'))
        .map(|p| p.trim_end_matches('/').to_string())
        .collect();
    let copied = copied_from_the_context();
    assert!(
        copied.contains("target/dist/outbox-relay"),
        "the prebuilt target copies the dist binary: {copied:?}"
    );
    for source in &copied {
        assert!(
            let_through.contains(source),
            "docker/Dockerfile copies {source}, which .dockerignore leaves out (it lets through \
             {let_through:?})"
        );
    }
}
