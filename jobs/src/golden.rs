//! Golden statements: every SQL statement a job renders from parts is pinned in
//! `jobs/tests/golden/`, so that a change to it shows up as a diff a reviewer reads (a
//! statement written whole is in a `.sql` file beside the module that runs it). `SEXTON_UPDATE_GOLDEN=1 cargo test -p
//! sexton-jobs` rewrites the files after an intended change.

use std::path::PathBuf;

/// Compares `sql` with `jobs/tests/golden/<name>.sql` (or writes it, when asked to update).
///
/// # Panics
/// When they differ, naming the file; when the file is missing.
pub fn check(name: &str, sql: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
        .join(format!("{name}.sql"));
    let rendered = format!("{}\n", sql.trim());
    if std::env::var_os("SEXTON_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("golden dir")).expect("golden dir");
        std::fs::write(&path, &rendered).expect("golden file written");
        return;
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "no golden file {}: run with SEXTON_UPDATE_GOLDEN=1",
            path.display()
        )
    });
    assert!(
        golden == rendered,
        "{} differs from the statement the code renders; if the change is intended, run the \
         tests with SEXTON_UPDATE_GOLDEN=1 and review the diff\n--- rendered:\n{rendered}",
        path.display()
    );
}
