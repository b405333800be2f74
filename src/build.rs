//! Build script: embeds the commit the relay is built from, for `--version` and
//! `outbox_relay_build_info`. `OUTBOX_RELAY_COMMIT` wins (a build without a git checkout, such
//! as an image built from an exported tree); else `git rev-parse HEAD`; else `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=OUTBOX_RELAY_COMMIT");
    let commit = match std::env::var("OUTBOX_RELAY_COMMIT") {
        Ok(commit) if !commit.is_empty() => commit,
        _ => {
            // Built again when HEAD moves: HEAD itself, the branch it names, packed refs.
            for path in ["HEAD", "packed-refs"] {
                if let Some(p) = git(&["rev-parse", "--git-path", path]) {
                    println!("cargo:rerun-if-changed={p}");
                }
            }
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                if let Some(p) = git(&["rev-parse", "--git-path", &branch]) {
                    println!("cargo:rerun-if-changed={p}");
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
    };
    println!("cargo:rustc-env=OUTBOX_RELAY_COMMIT={commit}");
}
