//! Client-chosen file paths (`kv_transfer_params.hidden_states_path`): allowed only inside the
//! output root. `..` components are refused outright; relative paths are taken relative to the
//! root; every existing ancestor is resolved (symlinks followed) and must stay inside the root.

use std::path::{Component, Path, PathBuf};

/// The checked, absolute path of a requested file, or why it is refused.
pub fn resolve_custom_path(root: &Path, requested: &str) -> Result<PathBuf, String> {
    let refuse = |why: &str| Err(format!("hidden_states_path {requested:?} refused: {why}"));
    if requested.is_empty() {
        return refuse("empty");
    }
    if requested.contains('\0') {
        return refuse("contains NUL");
    }
    let req = Path::new(requested);
    if req.components().any(|c| c == Component::ParentDir) {
        return refuse("'..' is not allowed");
    }
    let root = std::fs::canonicalize(root)
        .map_err(|e| format!("output directory {}: {e}", root.display()))?;
    let joined = if req.is_absolute() {
        req.to_path_buf()
    } else {
        root.join(req)
    };
    // Lexical check first (the root is canonical; an absolute path must name it literally).
    let lexical: PathBuf = joined
        .components()
        .filter(|c| *c != Component::CurDir)
        .collect();
    if !lexical.starts_with(&root) || lexical == root {
        return refuse("outside the output directory");
    }
    if lexical.file_name().is_none() || requested.ends_with('/') {
        return refuse("not a file name");
    }
    // Then the real location: the deepest existing ancestor, with symlinks resolved.
    // (`symlink_metadata`, not `exists`: a dangling symlink is an existing entry, and where it
    // leads is unknown: refused below, not skipped.)
    let mut existing = lexical.parent();
    while let Some(dir) = existing {
        if std::fs::symlink_metadata(dir).is_ok() {
            break;
        }
        existing = dir.parent();
    }
    let Some(dir) = existing else {
        return refuse("outside the output directory");
    };
    let real = match std::fs::canonicalize(dir) {
        Ok(real) => real,
        Err(e) => return refuse(&format!("{}: {e}", dir.display())),
    };
    if !real.starts_with(&root) {
        return refuse("a symlink leads outside the output directory");
    }
    if !real.is_dir() {
        return refuse(&format!("{} is not a directory", dir.display()));
    }
    match std::fs::symlink_metadata(&lexical) {
        Ok(m) if m.file_type().is_symlink() => return refuse("the file is a symlink"),
        Ok(m) if m.is_dir() => return refuse("a directory"),
        _ => {}
    }
    Ok(lexical)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_allowed_outside_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("out");
        std::fs::create_dir(&root).unwrap();
        let canon = std::fs::canonicalize(&root).unwrap();
        assert_eq!(
            resolve_custom_path(&root, "a/b.safetensors").unwrap(),
            canon.join("a/b.safetensors")
        );
        let abs = canon.join("x.safetensors");
        assert_eq!(
            resolve_custom_path(&root, abs.to_str().unwrap()).unwrap(),
            abs
        );
        for bad in ["../x", "a/../../x", "/etc/passwd", "", ".", "a/"] {
            assert!(resolve_custom_path(&root, bad).is_err(), "{bad}");
        }
        let outside = dir.path().join("elsewhere");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let e = resolve_custom_path(&root, "link/x.safetensors").unwrap_err();
        assert!(e.contains("symlink"), "{e}");
        std::os::unix::fs::symlink(outside.join("f"), root.join("f.safetensors")).unwrap();
        assert!(resolve_custom_path(&root, "f.safetensors").is_err());
        // A dangling symlink as a parent, a symlink loop, a file as a parent.
        std::os::unix::fs::symlink(outside.join("not_yet"), root.join("dangling")).unwrap();
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        std::fs::write(root.join("file"), b"x").unwrap();
        for bad in [
            "dangling/x.safetensors",
            "loop/x.safetensors",
            "file/x.safetensors",
        ] {
            let e = resolve_custom_path(&root, bad).unwrap_err();
            assert!(e.contains("refused"), "{bad}: {e}");
        }
    }
}
