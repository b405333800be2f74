//! Files that hold secrets (`source_url_file`, the sinks' `*_file` settings, NATS
//! `credentials_file`, client keys): read like any file, with a warning when others may read or
//! change them, as libpq warns of an `sslkey` readable by others.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The permission bits that let users other than the owner read or change a file.
const GROUP_OR_OTHERS: u32 = 0o077;

/// Reads the secret in `path` (trimmed), warning as [`warn_if_exposed`] does.
///
/// Returns the read error.
pub fn read(path: &str, setting: &str) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    warn_if_exposed(Path::new(path), setting);
    Ok(text.trim().to_owned())
}

/// Logs a warning naming `setting` and the file when its group or others may read, write or
/// run it (mode `0600` or `0400` is what a secret should have), once per file and process (a
/// client key is read again at every reconnection). A file that cannot be examined is left to
/// whoever reads it.
pub fn warn_if_exposed(path: &Path, setting: &str) {
    static WARNED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    if let Some(mode) = exposed_mode(path) {
        let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
        if !warned
            .get_or_insert_with(HashSet::new)
            .insert(path.to_owned())
        {
            return;
        }
        tracing::warn!(
            setting,
            file = %path.display(),
            mode = format!("{mode:o}"),
            "a file holding a secret may be read or changed by users other than its owner; chmod 600 it"
        );
    }
}

/// The file's permission bits when they give its group or others any access.
fn exposed_mode(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & GROUP_OR_OTHERS != 0).then_some(mode)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_secret_file_others_may_read_is_exposed_and_a_private_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "s3cret\n").unwrap();
        for (mode, exposed) in [
            (0o600, false),
            (0o400, false),
            (0o640, true),
            (0o644, true),
            (0o602, true),
        ] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(exposed_mode(&file).is_some(), exposed, "mode {mode:o}");
        }
        assert_eq!(
            read(file.to_str().unwrap(), "sink.token_file").unwrap(),
            "s3cret"
        );
        assert_eq!(exposed_mode(&dir.path().join("missing")), None);
    }
}
